"""Fine-tuning trace replay on the titan-finetune data: every policy finishes every job."""

from __future__ import annotations

import pytest
from apportion.experiments.finetune_sim import DATA, POLICIES, compare, markdown, reference_avg_jct

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="titan-finetune data not present")


def test_reference_tables_read():
    ref = reference_avg_jct("FM-1-roberta-base")
    assert ref["srtf"] == pytest.approx(1278.424, abs=0.01)
    assert ref["titan[True-True]"] < ref["titan[False-True]"] < ref["srtf"]


def test_replay_fm1_roberta_base_all_policies():
    res = compare("FM-1-roberta-base", capacity=32)
    ours = res["avg_jct_s"]
    assert set(ours) == set(POLICIES)
    assert all(v > 0 for v in ours.values())
    # transfer never hurts: the measured gains are applied only when positive
    assert ours["ymir"] <= ours["normal"] + 1e-6
    assert ours["ymir-temporal"] <= ours["normal"] + 1e-6
    assert "| srtf |" in markdown(res)
