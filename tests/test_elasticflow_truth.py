"""ElasticFlow's throughput tables are read by GPU count (their column names), not by
column position: itertuples renamed the columns ``1, 2, 4, 8, ...`` to ``_1 .. _7``, so a
job on 4 GPUs got the 8-GPU rate and 8 GPUs one extrapolated from the 64-GPU column."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from apportion.experiments.groundtruth import ElasticFlowTruth


def _job(model: str, batch: int) -> SimpleNamespace:
    return SimpleNamespace(job_type=model, batch=batch)


def test_columns_are_gpu_counts(tmp_path: Path) -> None:
    (tmp_path / "toy.csv").write_text("global_batch_size,1,2,4,8,16\n"
                                      "128,1.0,1.9,3.6,6.4,0\n")
    t = ElasticFlowTruth(root=tmp_path)
    assert t.table["toy"][128] == {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.4}  # 16: rate 0, left out
    for g, r in ((1, 1.0), (2, 1.9), (4, 3.6), (8, 6.4)):
        assert t.rate(_job("toy", 128), "A100-40GB", g) == pytest.approx(r)
    assert 3.6 > t.rate(_job("toy", 128), "A100-40GB", 3) > 1.9  # between the counts
    assert t.rate(_job("toy", 128), "T4", 4) == 0.0  # another type: not measured


def test_shipped_gpt2_table(shared_data: Path) -> None:
    t = ElasticFlowTruth()
    row = t.table["gpt2"][128]
    assert sorted(row) == [1, 2, 4, 8, 16, 32, 64]
    assert t.rate(_job("gpt2", 128), "A100-40GB", 4) == pytest.approx(16.66628395476673)
    assert t.rate(_job("gpt2", 128), "A100-40GB", 8) == pytest.approx(18.70365969793693)
