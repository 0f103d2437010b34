"""The JCT-aware objective, the per-placed-job bonus and the normalisations."""

from __future__ import annotations

import math
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.formulations.candidates import CandidateOptions, build_candidates
from apportion.formulations.objectives import (
    CELLS_ONLY,
    ObjectiveOptions,
    apply_objective,
    jct_weights,
)
from apportion.formulations.schema import cells_of, job_node
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies_all import trace
from test_sim_properties import small_cluster

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import SolveReport
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round

REPORT = SolveReport("t", "optimal", None, None, None, 0.0, False)


def _tuned(**knobs: object) -> CandidateOptions:
    """The candidate options with the tuned JCT-aware objective (preset ``jct-aware``,
    apportion's default before the objective in seconds), whose terms these tests pin."""
    return CandidateOptions(objective=ObjectiveOptions.preset("jct-aware"), **knobs)


@given(rem=st.dictionaries(st.text("abc", min_size=1, max_size=3), st.floats(60.0, 1e6), min_size=1),
       alpha=st.floats(0.0, 1.0))
def test_jct_weights_are_bounded_and_favour_short_work(rem: dict[str, float], alpha: float) -> None:
    w = jct_weights(rem, alpha, (0.25, 4.0))
    assert all(0.25 <= v <= 4.0 for v in w.values())
    for a, ra in rem.items():
        for b, rb in rem.items():
            if ra < rb:
                assert w[a] >= w[b]  # less remaining work never weighs less
    if alpha == 0.0:
        assert set(w.values()) == {1.0}


def _two_jobs_one_slot() -> tuple[Cluster, list[JobSpec]]:
    cl = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    short = JobSpec("short", "bert-336m", 64, 200, 4, submit_time_s=0.0)
    long = JobSpec("long", "bert-336m", 64, 200_000, 4, submit_time_s=0.0)
    return cl, [short, long]


def test_jct_aware_runs_the_shorter_job_first_and_normalized_is_indifferent() -> None:
    cl, jobs = _two_jobs_one_slot()
    picks = {}
    for kind in ("jct-aware", "normalized"):
        opts = CandidateOptions(objective=kind, place_bonus=1.0, scales=(1.0,))
        res = run_round(cl, jobs, 0.0, RoundConfig(time_budget_s=5.0, candidates=opts))
        assert validate(res.decision, cl, jobs).ok
        assert res.decision.report.backend in ("highs", "cp-sat", "lp-round")
        assert not res.decision.report.fallback
        picks[kind] = [a.job for a in res.decision.allocations]
        vals = {j.id: max(res.graph.nodes[c]["value"] for c in cells_of(res.graph, j.id)) for j in jobs}
        if kind == "normalized":
            assert vals["short"] == pytest.approx(vals["long"])
        else:
            assert vals["short"] > vals["long"]
    assert picks["jct-aware"] == ["short"]


def test_place_bonus_places_a_second_job_before_scaling_one_up() -> None:
    """8 GPUs, two 4-GPU jobs: without a bonus one job at 8 may win; with it both run."""
    cl = Cluster("two", [NodeGroup("a", 2, "A100-40GB", 4)])
    jobs = [JobSpec(f"j{i}", "bert-336m", 256, 5000, 4, submit_time_s=0.0) for i in range(2)]
    opts = CandidateOptions(place_bonus=1.0)
    res = run_round(cl, jobs, 0.0, RoundConfig(time_budget_s=5.0, candidates=opts))
    assert validate(res.decision, cl, jobs).ok
    assert sorted(a.job for a in res.decision.allocations) == ["j0", "j1"]
    g = res.graph
    for cn in cells_of(g, "j0"):
        d = g.nodes[cn]
        assert d["value"] == pytest.approx(d["term"] + 1.0 + g.nodes[job_node("j0")]["queue_bonus"])


def _scale_or_place() -> tuple[Cluster, list[JobSpec]]:
    """8 GPUs; a short job runs on 4 of them and could double; a long job waits for 4."""
    cl = Cluster("two", [NodeGroup("a", 2, "A100-40GB", 4)])
    running = JobSpec("run", "bert-336m", 256, 4000, 4, submit_time_s=0.0, iterations_done=100,
                      running=RunningState("A100-40GB", 4, 1, {"a-0": 4}, 1))
    queued = JobSpec("queued", "bert-336m", 256, 400_000, 4, submit_time_s=0.0)
    return cl, [running, queued]


def test_the_place_bonus_places_a_queued_job_before_scaling_a_running_one() -> None:
    """The place bonus's mechanism: JCT-aware weights make growing the short running job
    worth more than starting the long queued one (weight w_min); the per-placed-job bonus,
    with Crius's stickiness (keep bonus 0.3, a restart charged to one round), turns that
    around, so the queued job starts and the running job keeps its place. Both answers
    are the exact optimum of their graph's values. (apportion's default stickiness is
    lower: there the short job grows, finishes sooner, and hands the long one all 8.) One
    weight in [1/4, 4] on all of a job's speed here (an earlier default), so
    the short job's growth outweighs the long one 16 to 1; with the default's speed weight
    in [0.7, 1.4] beyond the reference rate the long job starts even without the bonus (the
    next test). No tail share or quantile either (the long queued job would be the tail:
    speed weight 4).
    """
    cl, jobs = _scale_or_place()
    default = replace(_tuned(), keep_bonus=0.3, amortize_s=None,
                      weight_bounds=(0.25, 4.0), speed_bounds=None, tail_share=None,
                      tail_quantile=None)
    assert default.objective == "jct-aware" and default.place_bonus > 0
    out = {}
    for bonus in (0.0, default.place_bonus):
        opts = replace(default, place_bonus=bonus)
        # a tolerance below the default: HiGHS proves the optimum (at the default LP
        # rounding's answer is final on the cell model, unproven)
        res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, candidates=opts,
                                                             deterministic=True, mip_gap=1e-4))
        assert validate(res.decision, cl, jobs).ok
        assert res.decision.report.status == "optimal"
        out[bonus] = {a.job: (a.gpus, a.action.value) for a in res.decision.allocations}
        g = res.graph
        w = {j: g.nodes[job_node(j)]["jct_weight"] for j in ("run", "queued")}
        assert w["run"] > w["queued"]  # less remaining work weighs more
    assert out[0.0] == {"run": (8, "resize")}
    assert out[default.place_bonus] == {"run": (4, "keep"), "queued": (4, "start")}


def test_the_registered_policies_and_the_operator_path_share_the_objective() -> None:
    """apportion, apportion-plans, solve-round's RoundConfig and run_round: one objective."""
    cl, jobs = _scale_or_place()
    default = CandidateOptions()
    for name in ("apportion", "apportion-plans"):
        pol = make_policy(name)
        assert pol.cfg.candidates == default
    assert RoundConfig().candidates == default
    for formulation in ("cells", "plans"):
        res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, formulation=formulation))
        assert validate(res.decision, cl, jobs).ok
        obj = res.graph.graph["objective"]
        assert (obj["kind"], obj["place_bonus"], obj["keep_bonus"], obj["amortize_s"],
                tuple(obj["weight_bounds"]), tuple(obj["speed_bounds"])) == (
            default.objective, default.place_bonus, default.keep_bonus, default.amortize_s,
            default.weight_bounds, default.speed_bounds)
        # but the cells formulation's own knobs (the tails, the pin, the round cap): the
        # plans formulation takes Crius's (PlanOptions.like); the default sets none of them
        for k in CELLS_ONLY:
            assert obj[k] == (getattr(default, k) if formulation == "cells"
                              else getattr(ObjectiveOptions(), k)), k
        assert (obj["finish_credit"], obj["speed_unit"]) == (default.finish_credit,
                                                             default.speed_unit)
        # the same objective, so the same trade in both: the short job, which ends within
        # the round, grows to all 8 GPUs (its seconds saved, at its fairness weight, beat
        # a round of the long job's at its own); the long job starts when it ends
        got = {a.job: a.gpus for a in res.decision.allocations}
        assert got == {"run": 8}, formulation


@settings(max_examples=20, deadline=None)
@given(jobs=st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(50, 200_000),
                               st.booleans()), min_size=1, max_size=5),
       kind=st.sampled_from(["jct-aware", "normalized"]), bonus=st.sampled_from([0.0, 0.5, 1.0]),
       normalize=st.sampled_from(["requested", "slowest", "best", "least-efficient"]),
       horizon_kind=st.sampled_from(["reference", "cell"]),
       speed_bounds=st.sampled_from([None, (0.7, 1.4), (0.5, 2.0), (0.25, 4.0), (1.0, 1.0)]),
       tail_share=st.sampled_from([None, 0.05, 0.34, 1.0]),
       margin=st.sampled_from([0.0, 0.5]), excess=st.sampled_from([None, 0.0, 0.25, 1.0]),
       quantile=st.sampled_from([None, 0.02, 0.5]), pin=st.sampled_from([None, 0.02, 0.5]),
       top=st.sampled_from([None, 0.01, 0.25]),
       history=st.lists(st.floats(100.0, 1e6), max_size=6),
       unit=st.sampled_from(["reference", "best", "best-outside-tail"]),
       scale=st.sampled_from([None, 0.5, 3.0]))
def test_cell_values_follow_the_documented_formula(jobs: list[tuple[int, int, bool]], kind: str,
                                                   bonus: float, normalize: str,
                                                   horizon_kind: str,
                                                   speed_bounds: tuple[float, float] | None,
                                                   tail_share: float | None, margin: float,
                                                   excess: float | None, quantile: float | None,
                                                   pin: float | None, top: float | None,
                                                   history: list[float], unit: str,
                                                   scale: float | None) -> None:
    """value = min(n', 1) * w + max(0, n' - 1) * v * u + place_bonus + bonus [+ keep * v | - term
    * lost] (v = w without speed bounds; the top speed bound for the ceil(tail_share x n) jobs
    of largest projected JCT, the wait since submission plus the soonest finish, and for
    running jobs within ``tail_margin`` of them, and for the jobs at or above the (1 -
    ``tail_quantile``) quantile of the policy's memory of projected JCTs), n' = n capped at
    the work left this round (rem / round_s) plus ``round_excess`` of the rest, w and v
    bounded, and a job that can finish sooner never weighs less; a running job at or above
    the (1 - ``tail_pin``) quantile, and below the (1 - ``tail_pin_top``) one, loses its
    whole term on a cell slower than its own; u is 1 under ``speed_unit="reference"``, and
    otherwise s / n_best, n_best the job's fastest cell's n and s ``speed_scale`` or the
    median of the round's n_best, but 1 for the tail under ``best-outside-tail``; the exact
    optimum validates."""
    if top is not None and pin is not None and top >= pin:
        top = None  # the band needs its top above its floor (tested apart)
    cl = Cluster("h", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 2, "A10", 4)])
    specs, node = [], 0
    for i, (gpus, iters, running) in enumerate(jobs):
        run = None
        if running and node < 2:
            run = RunningState("A100-40GB", gpus, 1, {f"a-{node}": gpus}, 1)
            node += 1
        specs.append(JobSpec(f"j{i}", "bert-336m", 64, iters, gpus, submit_time_s=0.0,
                             iterations_done=1 if run else 0, running=run))
    opts = CandidateOptions(objective=kind, place_bonus=bonus, normalize=normalize,
                            restart_horizon=horizon_kind, weight_bounds=(0.25, 4.0),
                            speed_bounds=speed_bounds, tail_share=tail_share,
                            tail_margin=margin, round_excess=excess, tail_quantile=quantile,
                            tail_pin=pin, tail_pin_top=top, speed_unit=unit,
                            speed_scale=scale)
    seen = {f"gone{i}": v for i, v in enumerate(history)}  # jobs ranked in earlier rounds
    g = build_candidates(cl, specs, 100.0, options=opts, seen=seen)
    placed = [j.id for j in specs if cells_of(g, j.id)]
    projected = {j: 100.0 + g.nodes[job_node(j)]["soonest_s"] for j in placed}
    ranked = sorted(placed, key=lambda j: (-projected[j], j))
    tail = set(ranked[:math.ceil(tail_share * len(placed))]) if tail_share and \
        kind == "jct-aware" else set()
    if tail:  # running jobs within the margin of the boundary join it
        floor = (1 - margin) * min(projected[j] for j in tail)
        tail |= {j.id for j in specs if j.running is not None and j.id in projected
                 and projected[j.id] >= floor}
    if quantile and kind == "jct-aware" and projected:  # the trace's tail, from the memory
        assert seen == {f"gone{i}": v for i, v in enumerate(history)} | projected
        bound = float(np.quantile(list(seen.values()), 1 - quantile))
        tail |= {j for j, p in projected.items() if p >= bound * (1 - 1e-12)}
    pinned: set[str] = set()
    if pin and kind == "jct-aware" and projected:
        bound = float(np.quantile(list(seen.values()), 1 - pin))
        pinned = {j.id for j in specs if j.running is not None and j.id in projected
                  and projected[j.id] >= bound * (1 - 1e-12)}
        if top:  # the jobs beyond the band are not held
            beyond = float(np.quantile(list(seen.values()), 1 - top))
            pinned = {j for j in pinned if projected[j] < beyond * (1 - 1e-12)}
    def within(j: str) -> list[str]:  # the job's cells within its reach (an elastic
        # job's scale-up beyond it does not set its best: formulations/objectives.py)
        top = g.nodes[job_node(j)]["reach_gpus"]
        return [c for c in cells_of(g, j) if g.nodes[c]["gpus"] <= top] or cells_of(g, j)

    best = {j: max(g.nodes[c]["est_throughput"] for c in within(j))
            / g.nodes[job_node(j)]["ref_throughput"] for j in placed}
    s_unit = scale if scale is not None else (float(np.median(list(best.values())))
                                              if best else 1.0)
    units = {j: s_unit / best[j] if unit != "reference" and not (
        unit == "best-outside-tail" and j in tail) else 1.0 for j in placed}
    weights = {j.id: g.nodes[job_node(j.id)].get("jct_weight") for j in specs}
    speeds = {j.id: g.nodes[job_node(j.id)].get("speed_weight") for j in specs}
    lo, hi = opts.weight_bounds
    slo, shi = speed_bounds or opts.weight_bounds
    assert opts.amortize_s is not None
    for j in specs:
        cells = cells_of(g, j.id)
        if not cells:
            continue
        rem = max(60.0, j.remaining_iterations * j.global_batch_size
                  / g.nodes[job_node(j.id)]["ref_throughput"])
        cap = max(opts.round_s, opts.amortize_s)
        w, v = weights[j.id], speeds[j.id]
        assert lo <= w <= hi
        if kind == "jct-aware":
            assert slo <= v <= shi
            # both clip the same ratio, and the speed bounds lie inside the weight's; the
            # tail's speed weight is the top bound
            assert v == pytest.approx(shi if j.id in tail else min(shi, max(slo, w)))
            assert g.nodes[job_node(j.id)]["tail"] == (j.id in tail)
        assert g.nodes[job_node(j.id)]["pinned"] == (j.id in pinned)
        own = max((g.nodes[c]["normalized"] for c in cells if g.nodes[c]["current"]),
                  default=0.0)
        for cn in cells:
            d = g.nodes[cn]
            n = d["normalized"]
            if excess is not None and kind == "jct-aware" and n > rem / opts.round_s:
                n = rem / opts.round_s + excess * (n - rem / opts.round_s)
            term = min(n, 1.0) * w + max(0.0, n - 1.0) * v * units[j.id] \
                if kind == "jct-aware" else n
            want = term + bonus + d["bonus"]
            if d["current"]:
                want += opts.keep_bonus * (v if kind == "jct-aware" else 1.0)
            elif j.id in pinned and d["normalized"] < own:  # a pinned job's demotion
                want -= term
            elif j.running is not None:  # the restart over the time the move pays off
                horizon = min(cap, rem / d["normalized"]) if horizon_kind == "cell" \
                    else min(cap, max(opts.round_s, rem))
                want -= term * min(1.0, opts.restart_s / horizon)
            assert d["value"] == pytest.approx(want)
    soon = {j.id: g.nodes[job_node(j.id)]["soonest_s"] for j in specs if cells_of(g, j.id)}
    for a, sa in soon.items():
        for b, sb in soon.items():
            if sa < sb and kind == "jct-aware":  # the tail's speed weight is the top bound
                assert weights[a] >= weights[b]
                assert speeds[a] >= speeds[b] or b in tail
    res = run_round(cl, specs, 100.0, RoundConfig(time_budget_s=2.0, candidates=opts))
    assert validate(res.decision, cl, specs).ok


def test_crius_greedy_keeps_crius_objective() -> None:
    from apportion.policies.formulation import CRIUS_OBJECTIVE

    opts = make_policy("crius-greedy").cfg.candidates
    assert {k: getattr(opts, k) for k in CRIUS_OBJECTIVE} == CRIUS_OBJECTIVE
    assert make_policy("apportion", place_bonus=2.0).cfg.candidates.place_bonus == 2.0
    with pytest.raises(TypeError):
        make_policy("apportion", no_such_option=1)


def test_apportion_defaults_in_a_replay_validate_every_round() -> None:
    cl = small_cluster()
    pol = make_policy("apportion", time_budget_s=1.0)
    res = Simulator(cl, trace(), pol, AnalyticTruth(cl), SimConfig(seed=0)).run()  # validates
    assert res.summary["finished"] == 10
    assert set(res.rounds["backend"]) & {"lp-round", "highs", "cp-sat"}  # not the fallback


@pytest.mark.parametrize("normalize", ["requested", "slowest", "best", "least-efficient"])
def test_normalisations(normalize: str) -> None:
    cl = Cluster("h", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 4, "A10", 2)])
    jobs = [JobSpec("j", "bert-336m", 64, 1000, 2, requested_gpu_type="A10")]
    g = build_candidates(cl, jobs, 0.0, options=CandidateOptions(normalize=normalize))
    at_n = {g.nodes[c]["gpu_type"]: g.nodes[c]["est_throughput"] for c in cells_of(g, "j")
            if g.nodes[c]["gpus"] == 2}
    ref = g.nodes[job_node("j")]["ref_throughput"]
    per_gpu = min(g.nodes[c]["est_throughput"] / g.nodes[c]["gpus"] for c in cells_of(g, "j"))
    want = {"requested": at_n["A10"], "slowest": min(at_n.values()), "best": max(at_n.values()),
            "least-efficient": 2 * per_gpu}
    assert ref == pytest.approx(want[normalize])
    with pytest.raises(ValueError):
        build_candidates(cl, jobs, 0.0, options=CandidateOptions(normalize="nope"))
    with pytest.raises(ValueError, match="restart_horizon"):
        build_candidates(cl, jobs, 0.0, options=CandidateOptions(restart_horizon="nope"))


@given(rem_iters=st.integers(10, 400_000), amortize=st.one_of(st.none(), st.floats(0.0, 1e5)))
@settings(max_examples=25, deadline=None)
def test_a_moves_restart_is_spread_over_the_time_it_pays_off(rem_iters: int,
                                                              amortize: float | None) -> None:
    """reconfig = term x min(1, restart_s / horizon), horizon = the job's remaining time at
    its reference throughput capped at amortize_s, never under one round (None: one round)."""
    cl = Cluster("two", [NodeGroup("a", 2, "A100-40GB", 4)])
    job = JobSpec("run", "bert-336m", 256, 400_000, 4, submit_time_s=0.0,
                  iterations_done=400_000 - rem_iters,
                  running=RunningState("A100-40GB", 4, 1, {"a-0": 4}, 1))
    opts = replace(_tuned(), amortize_s=amortize)
    res = run_round(cl, [job], 600.0, RoundConfig(time_budget_s=5.0, candidates=opts))
    assert validate(res.decision, cl, [job]).ok
    g = res.graph
    jd = g.nodes[job_node("run")]
    rem = max(60.0, rem_iters * 256 / jd["ref_throughput"])
    horizon = opts.round_s if amortize is None else min(max(opts.round_s, amortize),
                                                          max(opts.round_s, rem))
    lost = min(1.0, opts.restart_s / horizon)
    moved = [g.nodes[c] for c in cells_of(g, "run") if not g.nodes[c].get("current")]
    assert moved
    for d in moved:
        want = d["term"] * (1 - lost) + opts.place_bonus + d.get("bonus", 0.0)
        assert d["value"] == pytest.approx(want)


@settings(max_examples=60, deadline=None)
@given(memory=st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.floats(0.0, 1e7),
                              max_size=20),
       projected=st.dictionaries(st.text("ab", min_size=1, max_size=3), st.floats(0.0, 1e7),
                                 max_size=20),
       quantile=st.floats(0.001, 1.0))
def test_trace_tail_is_the_memory_quantile(memory: dict[str, float],
                                           projected: dict[str, float], quantile: float) -> None:
    """The round's jobs at or above the (1 - q) quantile (numpy's linear one) of the memory
    updated with them; the memory keeps every job with its latest projection."""
    from apportion.formulations.objectives import trace_tail

    seen = dict(memory)
    got = trace_tail(projected, quantile, seen)
    assert seen == memory | projected
    if not projected:
        assert got == set()
        return
    bound = float(np.quantile(list(seen.values()), 1 - quantile))
    assert {j for j, v in projected.items() if v > bound * (1 + 1e-9)} <= got
    assert got <= {j for j, v in projected.items() if v >= bound * (1 - 1e-9)}
    assert max(projected, key=projected.__getitem__) in got or \
        max(projected.values()) < max(seen.values())
    assert trace_tail(projected, None, {}) == set()
    with pytest.raises(ValueError, match="tail_quantile"):
        trace_tail(projected, 1.5)


def test_tail_jobs_are_the_largest_projected_jcts() -> None:
    """ceil(share x n) of them, ties by id; a share outside (0, 1] is refused."""
    from apportion.formulations.objectives import tail_jobs

    proj = {"a": 10.0, "b": 30.0, "c": 30.0, "d": 5.0}
    assert tail_jobs(proj, None) == set() and tail_jobs({}, 0.5) == set()
    assert tail_jobs(proj, 0.05) == {"b"}
    assert tail_jobs(proj, 0.5) == {"b", "c"}
    assert tail_jobs(proj, 0.51) == {"a", "b", "c"}
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="tail_share"):
            tail_jobs(proj, bad)


def test_a_pin_band_needs_its_top_below_its_floor() -> None:
    """``tail_pin_top`` lies in (0, ``tail_pin``): a band whose top is at or below its floor
    would pin no job while looking configured."""
    cl, jobs = _scale_or_place()
    for pin, top in ((0.02, 0.02), (0.02, 0.5), (None, 0.0), (0.02, -0.01)):
        with pytest.raises(ValueError, match="tail_pin_top"):
            build_candidates(cl, jobs, 600.0, options=_tuned(tail_pin=pin, tail_pin_top=top))
    with pytest.raises(ValueError, match="tail_pin_top"):  # where it is configured
        _tuned(tail_pin=0.005)  # below the tuned preset's top, without its own
    assert _tuned(tail_pin=0.005, tail_pin_top=None).tail_pin_top is None
    g = build_candidates(cl, jobs, 600.0, options=CandidateOptions(tail_pin=0.02,
                                                                   tail_pin_top=0.005))
    assert g.graph["objective"]["tail_pin_top"] == 0.005


def test_the_pin_holds_the_band_that_sets_the_p99_not_the_jobs_beyond_it() -> None:
    """A running job between the (1 - tail_pin) and (1 - tail_pin_top) quantiles of the
    memory is pinned (its slower cells lose their term); the same job as the memory's
    longest is beyond the band and may be demoted like any other."""
    cl = Cluster("h", [NodeGroup("a", 1, "A100-40GB", 4), NodeGroup("b", 1, "A10", 4)])
    long = JobSpec("long", "bert-336m", 64, 200_000, 4, submit_time_s=0.0, iterations_done=1,
                   running=RunningState("A100-40GB", 4, 1, {"a-0": 4}, 1))
    opts = CandidateOptions(tail_pin=0.02, tail_pin_top=0.005)
    for beyond, pinned in ((None, False), (1e12, True)):
        seen = {f"gone{i}": 100.0 for i in range(98)}
        if beyond is not None:
            seen["far"] = beyond  # a longer job seen earlier: "long" is inside the band
        g = build_candidates(cl, [long], 100.0, options=opts, seen=seen)
        assert g.nodes[job_node("long")]["pinned"] is pinned
        slow = [c for c in cells_of(g, "long") if g.nodes[c]["gpu_type"] == "A10"]
        assert slow
        for c in slow:
            d = g.nodes[c]
            lost = d["value"] - (opts.place_bonus + d["bonus"])  # what the move keeps
            assert (lost == pytest.approx(0.0)) is pinned


def _two_speedups(unit: str, tail_share: float | None = None) -> dict[str, float]:
    """Each job's value lost on the slow type against the fast one, for two queued jobs whose
    reference is a slow base: X runs 9x its reference on the fast type and 7.5x on the slow
    one (a share 0.17 of its best lost), Y 3x and 1.7x (0.43 lost). Same
    remaining time, so the same weights; the graph is the objective's input alone."""
    g = nx.DiGraph()
    jobs = [JobSpec(j, "bert-336m", 64, 1000, 4, submit_time_s=0.0) for j in ("X", "Y")]
    speeds = {"X": {"fast": 9.0, "slow": 7.5}, "Y": {"fast": 3.0, "slow": 1.7}}
    for j, cells in speeds.items():
        ref = 64 * 1000 / 3600.0  # one hour at the reference: the same remaining time
        g.add_node(job_node(j), kind="job", ref_throughput=ref)
        for t, n in cells.items():
            g.add_node(f"{j}:{t}", kind="cell", job=j, est_throughput=n * ref, normalized=n,
                       current=False, bonus=0.0)
            g.add_edge(job_node(j), f"{j}:{t}")
    # equal soonest times need equal fastest speeds in the weight; so the weights are
    # pinned alike by bounds [1, 1] and speed bounds [1.4, 1.4]
    apply_objective(g, jobs, 0.0, ObjectiveOptions(kind="jct-aware", weight_bounds=(1.0, 1.0),
                                                   speed_bounds=(1.4, 1.4), speed_unit=unit,
                                                   tail_share=tail_share))
    return {j: g.nodes[f"{j}:fast"]["value"] - g.nodes[f"{j}:slow"]["value"] for j in speeds}


def test_speed_in_shares_of_the_best_cell_demotes_the_job_that_loses_less_of_its_round() -> None:
    """In multiples of a slow reference, X's slow type costs it more (1.5 against 1.3: the
    fast type goes to X); in shares of each job's best (``speed_unit="best"``), the slow
    type costs X 0.17 of its round and Y 0.43, so Y keeps the fast type (the
    crius-pai burst in the quality HISTORY.md). Under ``best-outside-tail`` a tail job keeps
    reference multiples."""
    ref = _two_speedups("reference")
    assert ref["X"] == pytest.approx(1.5 * 1.4) and ref["Y"] == pytest.approx(1.3 * 1.4)
    best = _two_speedups("best")
    scale = (9.0 + 3.0) / 2  # the median of the two jobs' n_best
    assert best["X"] == pytest.approx(1.5 / 9.0 * scale * 1.4)
    assert best["Y"] == pytest.approx(1.3 / 3.0 * scale * 1.4)
    assert best["Y"] > best["X"]
    assert _two_speedups("best-outside-tail") == pytest.approx(best)  # no tail: the same
    # with a tail of one job, the one of larger projected JCT (Y: its best is 3x, not 9x),
    # Y is counted in reference multiples and X in shares
    tailed = _two_speedups("best-outside-tail", tail_share=0.5)
    assert tailed["Y"] == pytest.approx(ref["Y"]) and tailed["X"] == pytest.approx(best["X"])


def test_an_unknown_speed_unit_or_scale_is_refused_where_it_is_configured() -> None:
    for bad in ({"speed_unit": "fastest"}, {"speed_scale": 0.0}, {"speed_scale": -1.0}):
        with pytest.raises(ValueError, match="speed_unit|speed_scale"):
            CandidateOptions(**bad)
    cl, jobs = _scale_or_place()
    g = build_candidates(cl, jobs, 600.0, options=_tuned())
    assert g.graph["objective"]["speed_unit"] == "best-outside-tail"
    assert all(g.nodes[job_node(j.id)]["speed_unit"] > 0 for j in jobs)
