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


def test_generated_workload_follows_the_recipe_and_every_job_finishes():
    from collections import Counter

    from apportion.experiments.finetune_sim import (POLICIES, FinetuneData, Simulator,
                                                    generate_workload)

    data = FinetuneData.load("roberta-base")
    jobs = generate_workload(data, 400, 32, seed=5)
    counts = Counter(j.size_class for j in jobs)
    for cls_, p in (("small", 0.3), ("medium", 0.6), ("large", 0.1)):
        assert abs(counts[cls_] / 400 - p) < 0.07, counts
    assert all(a.submit <= b.submit for a, b in zip(jobs, jobs[1:]))
    for pol in POLICIES:
        run = generate_workload(data, 40, 16, seed=2)
        jct = Simulator(run, data, pol, 16, 60.0).run()
        assert len(jct) == 40 and all(v > 0 for v in jct.values()), pol
