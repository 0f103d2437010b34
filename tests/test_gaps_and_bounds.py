"""Gap and bound for every optimising policy: Gavel (the LP's optimum over the rounding),
Sia (its integer program's bound), apportion-plans (the LP bound, also when the heuristic's
answer wins). Before: n/a, n/a, dropped."""

from __future__ import annotations

import numpy as np
import pytest
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.rates import EstimatorRates
from apportion.experiments.harness import run_one
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.chain_rules import LP_ALL_BELOW_S, share, tighter, time_share
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, make_policy, run_round
from apportion.policies.formulation import Solved
from apportion.view import view_of

CL = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 2, "A40", 2)])
MODELS = ["bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b"]


def _queue(n: int = 8) -> list[JobSpec]:
    return [JobSpec(f"j{i}", MODELS[i % 4], 64, 1000 * (i + 1), 2 ** (i % 3),
                    submit_time_s=10.0 * i) for i in range(n)]


@pytest.mark.parametrize("policy", ["gavel-max-sum-throughput", "gavel-max-min-fairness"])
def test_gavels_rounds_report_the_lp_optimum_and_the_rounding_loss(policy: str,
                                                                     shared_data: object
                                                                     ) -> None:
    res = run_one("gavel-small", "2:2:2", policy, "gavel", 0, None, {"information": "oracle"},
                  None, 8)
    rd = res.rounds
    assert rd["bound"].notna().all()
    # max-min's minimum is 0 while a job of the allocation waits for its first turn: such a
    # round claims no rounding loss (no objective, no gap), never a 100 % one
    measured = rd["objective"].notna()
    assert (measured == rd["gap"].notna()).all() and measured.iloc[-1]
    if policy == "gavel-max-sum-throughput":
        assert measured.all()
    rd = rd[measured]
    obj, bound, gap = (rd[c].astype(float).to_numpy() for c in ("objective", "bound", "gap"))
    assert np.all(obj <= bound * (1 + 1e-6) + 1e-9)  # realised shares are LP-feasible
    assert np.allclose(gap, (bound - obj) / np.maximum(np.abs(bound), 1e-12), atol=1e-9)
    assert res.summary["rounds_with_bound"] == len(rd)  # the rounds with a measured gap
    assert res.summary["gap_mean"] is not None


def test_gavel_in_an_operators_round_and_fifo_has_none() -> None:
    d = run_round(CL, _queue(), 100.0, RoundConfig(time_budget_s=2.0),
                  policy=make_policy("gavel")).decision
    assert d.report.bound is not None and d.report.objective is not None
    assert d.report.objective <= d.report.bound * (1 + 1e-6)
    assert d.meta["lp_optimum"] == d.report.bound and d.meta["rounding_loss"] == d.report.gap
    fifo = run_round(CL, _queue(), 100.0, RoundConfig(), policy=make_policy("fifo")).decision
    assert fifo.report.bound is None  # FIFO's allocation is no LP: nothing to bound


def test_sia_reports_its_integer_programs_bound() -> None:
    d = run_round(CL, _queue(), 100.0, RoundConfig(), policy=make_policy("sia")).decision
    r = d.report
    assert r.bound is not None and r.gap is not None
    assert r.objective is not None and r.objective <= r.bound + 1e-6 * max(1.0, abs(r.bound))


def test_the_plans_bound_stays_when_the_heuristic_wins() -> None:
    pol = make_policy("apportion-plans", config=RoundConfig(time_budget_s=2.0))
    view = view_of(CL, _queue(), 100.0, EstimatorRates(AnalyticEstimator(), CL))
    g = pol.candidates(view)
    f = pol.formulate(view, g, full=True)
    assert f.greedy_choices is not None
    # an LP rounding's answer worse than the heuristic's, with the relaxation's bound
    lp = SolveResult("lp-round", Status.FEASIBLE, np.zeros(f.model.num_vars),
                     f.greedy_obj - 1.0, f.greedy_obj + 2.0)
    d = pol.decode(view, g, f, Solved(lp, [lp], 0.01))
    assert d.report.backend == f.heuristic.name and not d.report.fallback
    assert d.report.bound == pytest.approx(f.greedy_obj + 2.0)
    assert d.report.gap == pytest.approx(2.0 / max(1.0, abs(f.greedy_obj)))


def test_an_lp_relaxations_bound_counts_without_an_answer() -> None:
    failed = SolveResult("lp-round", Status.ERROR, None, None, 7.0,
                         extra={"relaxation": True})
    assert tighter(None, failed, "max") == 7.0
    assert tighter(None, SolveResult("highs", Status.ERROR, None, None, 7.0), "max") is None


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 30.0, allow_nan=False), st.sampled_from(
    [("lp-round", "highs"), ("lp-round", "highs", "cp-sat"), ("highs", "lp-round", "highs")]))
def test_a_short_remainder_goes_to_lp_rounding_on_the_clock(left: float, names: tuple) -> None:
    """On the clock LP rounding may take all of a remainder under ``LP_ALL_BELOW_S`` (a HiGHS
    after it could not finish the same relaxation either); otherwise, and always for a work
    budget, the split is :func:`share`'s."""
    for i, name in enumerate(names):
        got = time_share(names, i, left)
        if name == "lp-round" and left < LP_ALL_BELOW_S:
            assert got == left
        else:
            assert got == share(names, i, left)
        assert 0.0 <= got <= left


def test_sia_without_an_answer_keeps_the_running_jobs_and_says_so(monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """Sia's ILP that finds nothing in its limit (a real HiGHS given no time: a 10,000-job
    round under load hit this) keeps every running job where it is and reports a fallback;
    it never claims an answer, and never stops the running jobs."""
    import dataclasses

    import apportion.policies.sia as sia_mod
    from apportion.jobs import RunningState

    first = run_round(CL, _queue(), 100.0, RoundConfig(), policy=make_policy("sia")).decision
    assert first.allocations and not first.report.fallback
    where = {a.job: a for a in first.allocations}
    queue = [dataclasses.replace(j, running=RunningState(
        where[j.id].gpu_type, where[j.id].gpus, where[j.id].stages,
        dict(where[j.id].placement), where[j.id].plan.tp)) if j.id in where else j
        for j in _queue()]
    real = sia_mod.milp
    monkeypatch.setattr(sia_mod, "milp", lambda *a, **kw: real(*a, **{**kw, "options": {
        **kw.get("options", {}), "time_limit": 0.0}}))
    d = run_round(CL, queue, 400.0, RoundConfig(), policy=make_policy("sia")).decision
    assert d.report.status == "fallback" and d.report.fallback
    assert "no answer" in d.report.fallback_reason and d.report.objective is None
    kept = {a.job: (a.gpu_type, a.gpus, a.placement) for a in d.allocations}
    assert kept == {j: (a.gpu_type, a.gpus, a.placement) for j, a in where.items()}
