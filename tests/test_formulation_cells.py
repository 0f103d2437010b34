"""The cell formulation on random instances: validator, backend agreement, exact aggregation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.config import default_cluster, default_jobs
from apportion.formulations.candidates import build_candidates
from apportion.formulations.cells import build_cells_model, hint_from_choices, objective_of
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round
from apportion.formulations.decode import to_decision
from apportion.decision import SolveReport
from apportion.solvers.base import Status
from apportion.solvers.cpsat import CpSatBackend
from apportion.solvers.greedy import GreedyCells
from apportion.solvers.highs import HighsBackend
from apportion.validator import validate

SMALL_MODELS = ["bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b", "vit-86m", "roberta-355m"]
TYPES = ["A100-40GB", "A40", "A10", "V100-32GB"]


@st.composite
def instances(draw: st.DrawFn) -> tuple[Cluster, list[JobSpec]]:
    ngroups = draw(st.integers(1, 3))
    types = draw(st.lists(st.sampled_from(TYPES), min_size=ngroups, max_size=ngroups, unique=True))
    groups = [NodeGroup(f"g{i}", draw(st.integers(1, 4)), t, draw(st.sampled_from([1, 2, 3, 4, 8])),
                        inter_node_bandwidth_GBps=draw(st.sampled_from([12.5, 25.0])))
              for i, t in enumerate(types)]
    cluster = Cluster("rand", groups)
    jobs = []
    for i in range(draw(st.integers(1, 6))):
        jobs.append(JobSpec(
            id=f"j{i}", model=draw(st.sampled_from(SMALL_MODELS)),
            global_batch_size=draw(st.sampled_from([32, 64, 128])), iterations=1000,
            requested_gpus=draw(st.sampled_from([1, 2, 4, 8])),
            requested_gpu_type=draw(st.sampled_from([None, *types])),
            submit_time_s=float(draw(st.integers(0, 20000)))))
    return cluster, jobs


def _solve_both(g, **kw):
    out = {}
    for be in (HighsBackend(), CpSatBackend()):
        m = build_cells_model(g, **kw)
        res = be.solve(m, 20.0)
        # on a loaded machine CP-SAT may stop at the time limit with a proven-consistent bound
        assert res.status in (Status.OPTIMAL, Status.FEASIBLE), (be.name, res.message)
        assert m.is_feasible(res.x)
        out[be.name] = (m, res)
    return out


@settings(max_examples=25)
@given(inst=instances())
def test_random_instances_validate_and_backends_agree(inst) -> None:
    cluster, jobs = inst
    g = build_candidates(cluster, jobs, now_s=20000.0)
    results = _solve_both(g)
    highs, cpsat = results["highs"][1], results["cp-sat"][1]
    assert highs.status is Status.OPTIMAL
    if cpsat.status is Status.OPTIMAL:
        assert cpsat.objective == pytest.approx(highs.objective, abs=1e-4)
    else:  # time-limited: its incumbent cannot beat, nor its bound undercut, the optimum
        assert cpsat.objective <= highs.objective + 1e-4 <= cpsat.bound + 2e-4
    greedy, gobj, _ = GreedyCells().solve(g)
    for m, res in results.values():
        dec = to_decision(g, m.decode(res.x), cluster, jobs, SolveReport("x", "optimal", None, None,
                                                                         None, 0.0, False))
        check = validate(dec, cluster, jobs)
        assert check.ok, check.violations
    assert highs.objective >= gobj - 1e-6  # the exact model is never worse than the greedy
    gdec = to_decision(g, greedy, cluster, jobs, SolveReport("g", "feasible", None, None, None, 0, False))
    assert validate(gdec, cluster, jobs).ok


@settings(max_examples=20)
@given(inst=instances())
def test_node_class_aggregation_is_exact(inst) -> None:
    cluster, jobs = inst
    g = build_candidates(cluster, jobs, now_s=20000.0)
    agg = HighsBackend().solve(build_cells_model(g, aggregate=True), 20.0)
    plain = HighsBackend().solve(build_cells_model(g, aggregate=False), 20.0)
    assert agg.status is Status.OPTIMAL and plain.status is Status.OPTIMAL
    assert agg.objective == pytest.approx(plain.objective, abs=1e-6)


def test_greedy_hint_is_a_feasible_point_of_the_model() -> None:
    cluster, (jobs, now) = default_cluster(), default_jobs()
    g = build_candidates(cluster, jobs, now)
    m = build_cells_model(g)
    choices, obj, _ = GreedyCells().solve(g)
    hint = hint_from_choices(m, choices)
    x = [hint[i] for i in range(m.num_vars)]
    assert m.is_feasible(x)
    assert m.objective_value(x) == pytest.approx(obj)


def test_default_round_optimal_with_both_backends_and_they_agree() -> None:
    cluster, (jobs, now) = default_cluster(), default_jobs()
    objs = {}
    for backend in ("highs", "cp-sat"):
        r = run_round(cluster, jobs, now, RoundConfig(backend=backend, time_budget_s=10,
                                                      deterministic=True))
        rep = r.decision.report
        assert rep.status == "optimal" and not rep.fallback, rep.as_dict()
        assert validate(r.decision, cluster, jobs).ok
        assert rep.gap == pytest.approx(0.0, abs=1e-6)
        objs[backend] = rep.objective
    assert objs["highs"] == pytest.approx(objs["cp-sat"], abs=1e-4)


def _running_instance() -> tuple[Cluster, list[JobSpec]]:
    cluster = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4)])
    jobs = [
        JobSpec("run", "bert-0.76b", 128, 1000, 4,
                running=RunningState("A100-40GB", 4, 1, {"a-1": 4})),
        JobSpec("new", "bert-0.76b", 128, 1000, 4, submit_time_s=0.0),
    ]
    return cluster, jobs


def test_running_job_is_kept_in_place() -> None:
    cluster, jobs = _running_instance()
    r = run_round(cluster, jobs, 100.0, RoundConfig(backend="highs"))
    a = r.decision.allocation("run")
    assert a is not None and a.action.value == "keep" and a.placement == {"a-1": 4}
    assert validate(r.decision, cluster, jobs).ok


def test_change_budget_bounds_running_jobs_changed() -> None:
    cluster = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4)])
    # two running jobs on 1 GPU each that would both like to grow into the free GPUs
    jobs = [JobSpec(f"r{i}", "bert-0.76b", 128, 1000, 2,
                    running=RunningState("A100-40GB", 1, 1, {f"a-{i}": 1})) for i in range(2)]
    for depth in (0, 1):
        r = run_round(cluster, jobs, 0.0, RoundConfig(backend="cp-sat", max_changes=depth))
        changed = [a for a in r.decision.allocations if a.action.value != "keep"]
        changed += [p for p in r.decision.pending]
        assert len(changed) <= depth
        assert validate(r.decision, cluster, jobs).ok
    free = run_round(cluster, jobs, 0.0, RoundConfig(backend="cp-sat"))
    assert any(a.action.value == "resize" for a in free.decision.allocations)


def test_job_that_fits_nowhere_is_pending_with_reason() -> None:
    cluster = Cluster("c", [NodeGroup("t", 1, "T4", 2, intra_node_link="pcie")])
    jobs = [JobSpec("huge", "llama-30b", 64, 10, 2), JobSpec("ok", "bert-336m", 32, 10, 1),
            JobSpec("typed", "bert-336m", 32, 10, 1, requested_gpu_type="H100-80GB")]
    r = run_round(cluster, jobs, 0.0, RoundConfig(backend="auto"))
    reasons = {p.job: p.reason.value for p in r.decision.pending}
    assert reasons["huge"] == "no-fit-memory"
    assert r.decision.allocation("ok") is not None
    assert validate(r.decision, cluster, jobs).ok


def test_tiny_budget_falls_back_to_greedy_and_says_so() -> None:
    cluster, (jobs, now) = default_cluster(), default_jobs()
    # a budget used up by candidate generation leaves the backends no time
    r = run_round(cluster, jobs, now, RoundConfig(backend="cp-sat", time_budget_s=0.01))
    rep = r.decision.report
    assert validate(r.decision, cluster, jobs).ok
    if rep.fallback:
        assert rep.status == "fallback" and rep.backend == "greedy" and rep.fallback_reason
    else:  # the backend still answered inside its minimum slice
        assert rep.status in ("optimal", "feasible")


@settings(max_examples=20)
@given(inst=instances())
def test_lp_rounding_is_feasible_and_brackets_the_optimum(inst) -> None:
    from apportion.solvers.lpround import LpRoundBackend

    cluster, jobs = inst
    g = build_candidates(cluster, jobs, now_s=20000.0)
    m = build_cells_model(g)
    lp = LpRoundBackend().solve(m, 20.0)
    exact = HighsBackend(mip_rel_gap=1e-9).solve(build_cells_model(g), 20.0)
    assert exact.status is Status.OPTIMAL
    if lp.status is Status.ERROR:
        return  # refused honestly (the chain moves on); never a wrong answer
    assert m.is_feasible(lp.x)
    assert lp.objective <= exact.objective + 1e-6 <= lp.bound + 2e-6
    down = LpRoundBackend(neighbourhood=False).solve(build_cells_model(g), 20.0)
    if down.x is not None:  # the restricted MIP starts from the rounded-down point
        assert lp.objective >= down.objective - 1e-6
    dec = to_decision(g, m.decode(lp.x), cluster, jobs,
                      SolveReport("lp", "feasible", None, None, None, 0.0, False))
    assert validate(dec, cluster, jobs).ok


@settings(max_examples=25)
@given(inst=instances(), busy=st.integers(0, 3))
def test_filling_a_rounded_point_keeps_it_feasible_and_leaves_no_column_that_fits(inst, busy) -> None:
    """``fill`` (LP rounding's greedy completion) on the rounded-down LP point and on
    points with some chosen cells taken out: feasible, never worse, and afterwards no
    integer column of positive value can go up by one without breaking a row."""
    import numpy as np

    from apportion.solvers.lpround import LpRoundBackend, fill

    cluster, jobs = inst
    m = build_cells_model(build_candidates(cluster, jobs, now_s=20000.0))
    down = LpRoundBackend(neighbourhood=False).solve(m, 20.0)
    if down.x is None:
        return
    start = np.asarray(down.x, float).copy()
    for j in np.flatnonzero(start > 0.5)[:busy]:  # a worse feasible start: cells dropped
        start[j] = 0.0
    if not m.is_feasible(start):  # a dropped cell's placement columns left its size row
        start = np.asarray(down.x, float)
    x, added = fill(m, start)
    assert m.is_feasible(x)
    assert m.objective_value(x) >= m.objective_value(start) - 1e-9
    assert added == int(round(float(np.sum(x - start))))
    for j in range(m.num_vars):
        if m.integer[j] and m.obj[j] > 0 and x[j] + 1 <= m.ub[j]:
            y = x.copy()
            y[j] += 1
            assert not m.is_feasible(y), f"column {m.var_keys[j]} still fits"


def test_lp_rounding_in_a_chain_stops_at_a_filled_point_within_the_tolerance() -> None:
    """With the chain's tolerance the rounded, filled LP point within it is the answer
    (no restricted MIP); without one the restricted MIP runs as before."""
    from apportion.solvers.lpround import LpRoundBackend

    cluster, (jobs, now) = default_cluster(), default_jobs()
    m = build_cells_model(build_candidates(cluster, jobs, now))
    loose = LpRoundBackend(mip_rel_gap=0.5).solve(m, 20.0)
    assert m.is_feasible(loose.x) and "restricted MIP" not in loose.message
    assert loose.bound - loose.objective <= 0.5 * max(1.0, abs(loose.objective)) + 1e-9
    exact = HighsBackend(mip_rel_gap=1e-9).solve(m, 20.0)
    assert loose.objective <= exact.objective + 1e-6 <= loose.bound + 2e-6
    free = LpRoundBackend().solve(m, 20.0)
    assert free.objective >= loose.objective - 1e-6


def test_large_rounds_answer_from_the_lp_first() -> None:
    from apportion.solvers.chain import LARGE_MODEL_COLUMNS, backends_for

    assert [b.name for b in backends_for("auto", columns=LARGE_MODEL_COLUMNS + 1)] == \
        ["lp-round", "highs"]
    assert [b.name for b in backends_for("auto", columns=10, gap=1e-4)] == \
        ["highs", "lp-round", "highs", "cp-sat"]
    assert [b.name for b in backends_for("auto", columns=10, gap=1e-3)] == \
        ["lp-round", "highs", "cp-sat"]


def test_the_budget_is_shared_so_every_step_of_auto_gets_time() -> None:
    from apportion.solvers.chain_rules import HIGHS_FIRST_SHARE, LP_SHARE, share

    names = ["highs", "lp-round", "highs", "cp-sat"]
    assert share(names, 0, 10.0) == pytest.approx(HIGHS_FIRST_SHARE * 10.0)
    assert share(names, 1, 7.0) == pytest.approx(LP_SHARE * 7.0)
    assert share(names, 2, 5.0) == 5.0  # HiGHS again: everything left (CP-SAT only on failure)
    assert share(names, 3, 5.0) == 5.0
    assert share(["lp-round", "highs"], 0, 8.0) == pytest.approx(LP_SHARE * 8.0)
    assert share(["highs"], 0, 3.0) == 3.0


def test_residual_mode_on_a_busy_cluster_is_valid_and_small(monkeypatch) -> None:
    """Many running jobs: residual classes keep the model small; answers stay valid."""
    import apportion.formulations.cells as cells_mod

    cluster = Cluster("busy", [NodeGroup("a", 12, "A100-40GB", 4), NodeGroup("v", 6, "V100-32GB", 8)])
    jobs = []
    for i in range(12):  # one 2-GPU running job on every A100 node, half the V100 nodes busy
        jobs.append(JobSpec(f"r{i}", "bert-336m", 64, 1000, 2,
                            running=RunningState("A100-40GB", 2, 1, {f"a-{i}": 2})))
    for i in range(3):
        jobs.append(JobSpec(f"v{i}", "bert-0.76b", 64, 1000, 8,
                            running=RunningState("V100-32GB", 8, 1, {f"v-{i}": 8})))
    jobs += [JobSpec(f"q{i}", SMALL_MODELS[i % len(SMALL_MODELS)], 64, 1000, 2 ** (i % 4),
                     submit_time_s=float(i)) for i in range(10)]
    g = build_candidates(cluster, jobs, 100.0)
    exact = build_cells_model(g)
    assert not exact.meta["residual_mode"]
    monkeypatch.setattr(cells_mod, "PINNED_EXACT_LIMIT", 4)
    res_model = build_cells_model(g)
    assert res_model.meta["residual_mode"]
    assert res_model.num_vars < exact.num_vars
    objs = []
    for m in (exact, res_model):
        r = HighsBackend(mip_rel_gap=1e-9).solve(m, 20.0)
        assert r.status is Status.OPTIMAL and m.is_feasible(r.x)
        dec = to_decision(g, m.decode(r.x), cluster, jobs,
                          SolveReport("h", "optimal", None, None, None, 0.0, False))
        assert validate(dec, cluster, jobs).ok
        for a in dec.allocations:  # kept jobs stay exactly where they ran
            job = next(j for j in jobs if j.id == a.job)
            if a.action.value == "keep":
                assert a.placement == job.running.placement
        objs.append(r.objective)
    assert objs[1] <= objs[0] + 1e-6  # residual mode is a restriction of the exact model


@st.composite
def busy_instances(draw: st.DrawFn) -> tuple[Cluster, list[JobSpec]]:
    """Two GPU types, every node partly or wholly held by running jobs, jobs queued."""
    na, nv = draw(st.integers(2, 5)), draw(st.integers(1, 3))
    cluster = Cluster("busy", [NodeGroup("a", na, "A100-40GB", 4), NodeGroup("v", nv, "V100-32GB", 8)])
    jobs: list[JobSpec] = []
    for i in range(na):
        k = draw(st.sampled_from([1, 2, 4]))
        jobs.append(JobSpec(f"ra{i}", draw(st.sampled_from(SMALL_MODELS)), 64, 1000, k,
                            running=RunningState("A100-40GB", k, 1, {f"a-{i}": k})))
    for i in range(nv):
        k = draw(st.sampled_from([2, 4, 8]))
        jobs.append(JobSpec(f"rv{i}", draw(st.sampled_from(SMALL_MODELS)), 64, 1000, k,
                            running=RunningState("V100-32GB", k, 1, {f"v-{i}": k})))
    for i in range(draw(st.integers(1, 5))):
        jobs.append(JobSpec(f"q{i}", draw(st.sampled_from(SMALL_MODELS)), 64,
                            draw(st.sampled_from([200, 1000, 5000])),
                            draw(st.sampled_from([1, 2, 4, 8])), submit_time_s=float(i)))
    return cluster, jobs


@settings(max_examples=25, deadline=None)
@given(inst=busy_instances())
def test_residual_mode_reuses_what_moved_jobs_free_and_stays_valid(inst) -> None:
    """Residual mode counts a moved job's GPUs as free in the same round: every answer that
    decodes is a valid schedule no better than the exact model's optimum, and never worse
    than residual mode without the reuse (which it contains)."""
    import apportion.formulations.cells as cells_mod

    cluster, jobs = inst
    g = build_candidates(cluster, jobs, 100.0)
    exact = HighsBackend(mip_rel_gap=1e-9).solve(build_cells_model(g), 20.0)
    assert exact.status is Status.OPTIMAL
    objs = {}
    for reuse in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cells_mod, "PINNED_EXACT_LIMIT", 0)
            mp.setattr(cells_mod, "REUSE_FREED", reuse)
            m = build_cells_model(g)
        assert m.meta["residual_mode"]
        r = HighsBackend(mip_rel_gap=1e-9).solve(m, 20.0)
        assert r.status is Status.OPTIMAL and m.is_feasible(r.x)
        objs[reuse] = r.objective
        choices = m.decode(r.x)  # reuse: a cell the freed nodes cannot hold is left out
        dec = to_decision(g, choices, cluster, jobs,
                          SolveReport("h", "optimal", None, None, None, 0.0, False))
        assert validate(dec, cluster, jobs).ok
        assert objective_of(g, choices) <= exact.objective + 1e-6
        if not reuse:  # exact aggregation: every chosen cell is placed
            assert objective_of(g, choices) == pytest.approx(r.objective, abs=1e-6)
    assert objs[True] >= objs[False] - 1e-6
