"""Online refit API: fitted estimators report a held-out error, ``auto`` picks per job by it,
and a fit never moves a GPU type nobody measured against the measured ones."""

from __future__ import annotations

import pytest
from apportion.estimation.models.measured import TableEstimator
from apportion.estimation.models.morphling import (
    K_INIT,
    K_NAMES,
    Arch,
    Env,
    FlopsForward,
    MorphlingEstimator,
    MorphlingSample,
    components,
)
from apportion.estimation.registry import AutoEstimator

from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import ExecutionPlan

MODEL = "bert-336m"
ARCH = Arch.from_spec(get_model(MODEL))
TRUE = {**{n: K_INIT[n] for n in K_NAMES}, "k_sync": 1.0, "k_opt": 0.08}


def _fwd(n: float) -> float:
    return 0.02 + 0.007 * n


def _samples(gpu: str = "A100-40GB") -> list[MorphlingSample]:
    job = JobSpec("j", MODEL, 64, 1, 1)
    out = []
    for g in (1, 2, 4, 8):
        for plan in (ExecutionPlan(dp=g), ExecutionPlan(dp=g, checkpointing=True),
                     ExecutionPlan(dp=g, zero_stage=2)):
            t = components(TRUE, ARCH, 64, plan, (g,), 1, Env(), _fwd)["T_iter"]
            out.append(MorphlingSample(job=job, plan=plan, placement={}, gpu_type=gpu,
                                       iter_time_s=t, arch=ARCH, nodes=(g,),
                                       fwd_s=_fwd(64 / g)))
    return out


def test_morphling_reports_a_held_out_error_per_architecture() -> None:
    est = MorphlingEstimator(min_samples=7).fit(_samples())
    assert 0 <= est.heldout_error_[ARCH.name] < 0.05  # a model the data came from
    none = MorphlingEstimator(min_samples=7, heldout_folds=0).fit(_samples())
    assert ARCH.name not in none.heldout_error_


def test_a_fit_never_moves_an_unmeasured_type_against_the_measured_one() -> None:
    """Measured on A100s only, 3x slower than FLOPs at the default efficiency: V100 cells
    keep their catalog ratio to A100 cells instead of looking 3x faster."""
    plan, nodes = ExecutionPlan(dp=4), (4,)
    fresh = MorphlingEstimator()
    before = [fresh.predict_config(ARCH, 64, plan, nodes, 1, g)["T_fwd"]
              for g in ("A100-40GB", "V100-32GB")]
    flops = FlopsForward(ARCH, "A100-40GB", fresh.efficiency)
    slow = [MorphlingSample(job=s.job, plan=s.plan, placement={}, gpu_type=s.gpu_type,
                            iter_time_s=3 * s.iter_time_s, arch=ARCH, nodes=s.nodes,
                            fwd_s=3 * flops(64 / s.plan.dp))
            for s in _samples()]
    est = MorphlingEstimator(min_samples=7, heldout_folds=0).fit(slow)
    after = [est.predict_config(ARCH, 64, plan, nodes, 1, g)["T_fwd"]
             for g in ("A100-40GB", "V100-32GB")]
    assert after[0] == pytest.approx(3 * before[0], rel=0.05)
    assert after[1] / after[0] == pytest.approx(before[1] / before[0], rel=0.05)


def test_auto_picks_the_estimator_with_the_lowest_held_out_error() -> None:
    job = JobSpec("j", MODEL, 64, 10, 4)
    auto = AutoEstimator(tables=TableEstimator())
    m = auto._members()
    m["morphling"].k_ = {ARCH.name: dict(TRUE)}
    m["morphling"].heldout_error_ = {ARCH.name: 0.12}
    m["crius"].heldout_error_ = {MODEL: 0.08}
    assert auto.choose(job) == "crius"
    auto = AutoEstimator(tables=TableEstimator())
    m = auto._members()
    m["morphling"].k_ = {ARCH.name: dict(TRUE)}
    m["morphling"].heldout_error_ = {ARCH.name: 0.05}
    m["crius"].heldout_error_ = {MODEL: 0.08}
    assert auto.choose(job) == "morphling"
    # a measured table of the very model still comes first
    tables = TableEstimator([(MODEL, 64, "A100-40GB", 4, 0.3)])
    assert AutoEstimator(tables=tables).choose(job) == "tables"
