"""RateEstimator: a rate function presented as a cell estimator (oracle information mode)."""

from __future__ import annotations

import math

import pytest
from apportion.estimation.models.analytic import AnalyticEstimator, nominal_placement
from apportion.estimation.base import Estimate, Estimator, Sample
from apportion.estimation.rate_estimator import RateEstimator
from apportion.formulations.candidates import build_candidates
from apportion.formulations.cells import build_cells_model
from apportion.formulations.schema import cells_of
from apportion.solvers.base import Status
from apportion.solvers.highs import HighsBackend
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import SolveReport
from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plan_memory import memory_floor
from apportion.plans import Cell, ExecutionPlan
from apportion.policies import RoundConfig, run_round
from apportion.formulations.decode import to_decision

CL = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 4, "A10", 2)])
TYPES = ("A100-40GB", "A10")


def table_rate(job: JobSpec, gpu_type: str, gpus: int) -> float:
    """A fixed 'measured' table (not an estimator): sub-linear scaling, A100 3x an A10."""
    base = 3.0 if gpu_type == "A100-40GB" else 1.0
    return base * gpus ** 0.8 / (1.0 + 0.01 * job.global_batch_size)


def test_protocol_params_and_fit_returns_self() -> None:
    est = RateEstimator(table_rate)
    assert isinstance(est, Estimator)
    assert set(est.get_params()) == {"rate_fn", "inner", "memoize", "batch_rate_fn"}
    job = JobSpec("j", "bert-336m", 64, 100, 4)
    placement = nominal_placement(CL, "A100-40GB", 4)
    sample = Sample(job, ExecutionPlan(dp=4), placement, "A100-40GB", 0.5)
    assert est.fit([sample]) is est and est.measured_
    # a measured configuration overrides the rate function, for every job of that model/batch
    other = JobSpec("k", "bert-336m", 64, 100, 4)
    e = est.best_in_cell(other, Cell("k", "A100-40GB", 4, 1), CL)
    assert e is not None and e.iter_time_s == pytest.approx(0.5)
    with pytest.raises(TypeError):
        RateEstimator(3.0)  # type: ignore[arg-type]


def test_time_from_rate_plan_and_memory_from_inner() -> None:
    inner = AnalyticEstimator()
    est = RateEstimator(table_rate, inner=inner)
    job = JobSpec("j", "bert-336m", 64, 100, 4)
    for gpu_type in TYPES:
        for gpus, stages in ((2, 1), (4, 1), (4, 2)):
            cell = Cell("j", gpu_type, gpus, stages)
            e = est.best_in_cell(job, cell, CL)
            a = inner.best_in_cell(job, cell, CL)
            assert isinstance(e, Estimate) and a is not None and e.feasible
            assert e.iter_time_s == pytest.approx(1.0 / table_rate(job, gpu_type, gpus))
            assert e.throughput == pytest.approx(64 * table_rate(job, gpu_type, gpus))
            assert e.plan == a.plan and e.mem_per_gpu == a.mem_per_gpu
            assert e.plan.dp * e.plan.tp * e.plan.pp == gpus
    # stage counts do not change a rate source's time
    t = [est.best_in_cell(job, Cell("j", "A100-40GB", 4, s), CL).iter_time_s for s in (1, 2, 4)]
    assert t[0] == t[1] == t[2]


def test_zero_rate_means_no_cell_and_inner_infeasible_still_runs() -> None:
    def only_a100(job: JobSpec, gpu_type: str, gpus: int) -> float:
        return 2.0 if gpu_type == "A100-40GB" else 0.0

    est = RateEstimator(only_a100)
    job = JobSpec("j", "bert-336m", 64, 100, 2)
    assert est.best_in_cell(job, Cell("j", "A10", 2, 1), CL) is None
    # a model the analytic estimator thinks does not fit 2 x A10 (24 GB, less its reserve):
    # the rate says it runs, and the rate source is the better witness, where a split's
    # memory floor (the validator's ledger) lets it fit the GPU
    big = JobSpec("b", "bert-2.6b", 128, 100, 2)
    assert AnalyticEstimator().best_in_cell(big, Cell("b", "A10", 2, 1), CL) is None
    runs = RateEstimator(lambda j, t, g: 0.25)
    e = runs.best_in_cell(big, Cell("b", "A10", 2, 1), CL)
    assert e is not None and e.feasible and e.iter_time_s == pytest.approx(4.0)
    assert e.plan.dp * e.plan.tp * e.plan.pp == 2
    assert memory_floor(get_model("bert-2.6b"), 128, e.plan).bytes <= 24 * 2**30
    assert math.isinf(runs.predict(big, e.plan, {"b-0": 2}, CL).iter_time_s) is False
    assert RateEstimator(lambda j, t, g: 0.0).predict(big, e.plan, {"b-0": 2}, CL).feasible is False
    # ... but a witness cannot make 6.7 B parameters' 107 GB of model states fit 2 x 24 GB:
    # every split's floor is over the GPU, so there is no cell (it was offered before)
    huge = JobSpec("h", "bert-6.7b", 128, 100, 2)
    assert RateEstimator(lambda j, t, g: 0.25).best_in_cell(huge, Cell("h", "A10", 2, 1),
                                                            CL) is None


@settings(max_examples=20, deadline=None)
@given(speed=st.dictionaries(st.sampled_from([(t, g) for t in TYPES for g in (1, 2, 4, 8)]),
                             st.floats(0.05, 50.0), min_size=1))
def test_formulation_on_rates_is_exact_and_valid(speed: dict[tuple[str, int], float]) -> None:
    """Every candidate carries the rate source's throughput; the solved decision validates."""
    jobs = [JobSpec(f"j{i}", "bert-336m", 32, 1000, n, submit_time_s=0.0)
            for i, n in enumerate((1, 2, 4))]
    est = RateEstimator(lambda j, t, g: speed.get((t, g), 0.0))
    g = build_candidates(CL, jobs, 100.0, est)
    for j in jobs:
        for cn in cells_of(g, j.id):
            d = g.nodes[cn]
            assert d["est_throughput"] == pytest.approx(32 * speed[(d["gpu_type"], d["gpus"])])
    m = build_cells_model(g)
    res = HighsBackend().solve(m, 10.0)
    assert res.status is Status.OPTIMAL
    dec = to_decision(g, m.decode(res.x), CL, jobs,
                      SolveReport("highs", "optimal", None, None, None, 0.0, False), est)
    assert validate(dec, CL, jobs).ok
    for a in dec.allocations:
        assert a.est_throughput == pytest.approx(32 * speed[(a.gpu_type, a.gpus)])


def test_run_round_with_rates_validates() -> None:
    jobs = [JobSpec(f"j{i}", "bert-336m", 64, 1000, n) for i, n in enumerate((1, 2, 2, 4))]
    res = run_round(CL, jobs, 0.0, RoundConfig(time_budget_s=5.0), estimator=RateEstimator(table_rate))
    assert validate(res.decision, CL, jobs).ok
    assert res.decision.report.backend in ("highs", "cp-sat", "lp-round")
    assert not res.decision.report.fallback
    for a in res.decision.allocations:
        assert a.est_throughput == pytest.approx(64 * table_rate(jobs[0], a.gpu_type, a.gpus))
