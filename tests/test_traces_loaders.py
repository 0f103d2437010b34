"""Trace loaders on the real files, the papers' adaptations, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import CriusTruth, GavelTruth, MorphlingTruth
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.errors import InputError

DATA = tr.data_root()
pytestmark = pytest.mark.skipif(not DATA.exists(), reason="shared data not present")


def _sorted(t: tr.Trace) -> bool:
    s = [j.submit_s for j in t.jobs]
    return s == sorted(s)


def test_gavel_trace_fields() -> None:
    t = catalog.load_trace("gavel-max-min-fairness")
    assert len(t) == 96 and _sorted(t)
    assert {j.gpus for j in t.jobs} == {1, 2, 4}
    truth = GavelTruth()
    assert all(truth.rate(j, "V100-32GB", j.gpus) > 0 for j in t.jobs)
    assert t.jobs[0].iterations == 925982 and t.jobs[0].job_type == "ResNet-18 (batch size 128)"


def test_normalised_csvs() -> None:
    for name, n in (("philly", 82247), ("elasticflow-philly", 876)):
        t = catalog.load_trace(name)
        assert len(t) <= n and len(t) > 0.9 * n and _sorted(t)
        assert all(j.gpus > 0 for j in t.jobs)
    g = tr.load_normalised_csv(DATA / "traces" / "gavel_msr_seed0.csv", limit=500)
    known = set(GavelTruth().job_types())
    assert all(j.iterations > 0 and j.job_type in known for j in g.jobs)


def test_crius_and_morphling_formats() -> None:
    c = catalog.load_trace("crius-philly")
    assert len(c) == 1938 and all(j.model for j in c.jobs) and _sorted(c)
    assert {j.gpu_type for j in c.jobs} <= {"A100-40GB", "A40", "A10", "V100-32GB"}
    truth = CriusTruth()
    assert sum(truth.rate(j, j.gpu_type, j.gpus) > 0 for j in c.jobs) > 0.9 * len(c)
    m = catalog.load_trace("morphling-mt")
    assert len(m) == 406 and any(j.guaranteed for j in m.jobs) and any(not j.guaranteed for j in m.jobs)
    mt = MorphlingTruth()
    # the workload's steps came from duration / measured iteration time: check it on a DP job
    j = next(j for j in m.jobs if j.job_id == "vit-0")
    assert abs(j.iterations / mt.rate(j, "A800-80GB", j.gpus, {"n0": 2}, j.plan) - j.duration_s) < 1.0


def test_adapt_crius_is_seeded_and_runnable() -> None:
    raw = catalog.load_trace("philly").head(300)
    truth = CriusTruth()
    a = tr.adapt_crius(raw, truth, seed=3)
    b = tr.adapt_crius(raw, truth, seed=3)
    c = tr.adapt_crius(raw, truth, seed=4)
    assert a.jobs == b.jobs and a.jobs != c.jobs
    assert all(truth.rate(j, j.gpu_type, j.gpus) > 0 and j.iterations >= 1 for j in a.jobs)
    assert {j.gpus for j in a.jobs} <= set(tr.CRIUS_GPU_MIX)


def test_morphling_downsample_busiest_window() -> None:
    raw = catalog.load_trace("philly")
    t = tr.morphling_downsample(raw, seed=0)
    assert all(j.submit_s < 12 * 3600 for j in t.jobs) and len(t) > 50
    for j in t.jobs:
        assert j.gpus in tr.MORPHLING_FEASIBLE_GPUS[j.job_type]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_synthetic_is_deterministic(n: int, seed: int) -> None:
    a, b = tr.synthetic(n=n, seed=seed), tr.synthetic(n=n, seed=seed)
    assert a.jobs == b.jobs and len(a) == n and _sorted(a)


def test_bad_inputs_raise_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,num_gpus\n1,2\n")
    with pytest.raises(InputError) as e:
        tr.load_normalised_csv(bad)
    assert "submit_time_s" in str(e.value) or "duration_s" in str(e.value)
    neg = tmp_path / "neg.csv"
    neg.write_text("job_id,submit_time_s,num_gpus,duration_s\n1,-5,2,10\n")
    with pytest.raises(InputError):
        tr.load_normalised_csv(neg)
    g = tmp_path / "x.trace"
    g.write_text("a\tb\tc\n")
    with pytest.raises(InputError):
        tr.load_gavel_trace(g)
    with pytest.raises(InputError):
        catalog.load_trace("no-such-trace")
