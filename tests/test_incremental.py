"""Incremental candidates and the vectorised analytic model: same answers, less work.

The candidate cache must give exactly the graph a fresh build gives, round after
round of a real replay (arrivals, completions, preemptions, both information
modes); the O(stages) analytic estimate must equal the per-layer sum it replaced.
"""

from __future__ import annotations

import math

import networkx as nx
import pytest
from apportion.estimation.models.analytic import AnalyticEstimator, stage_sums
from apportion.estimation.models.comm import Link, allreduce_time, p2p_time
from apportion.estimation.models.partition import cached_cuts
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.formulations.candidates import (
    asks_beyond_capacity,
    build_candidates,
    requests_beyond,
    trim_scale_up,
)
from apportion.formulations.cells import build_cells_model
from apportion.formulations.plan_filter import drop_refused_plans
from apportion.formulations.schema import current_cells
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec, RunningState
from apportion.models import get_model
from apportion.plans import Cell, ExecutionPlan
from apportion.policies import FormulationPolicy
from apportion.policies.formulation import _Memo
from apportion.policies.recipes import RECIPES
from apportion.runtime.plan_filter import workload_plan_filter


def small_cluster() -> Cluster:
    return Cluster("mini", [NodeGroup("a40", 3, "A40", 2, 48, 256.0, "pcie", 32.0, 12.5),
                            NodeGroup("a100", 2, "A100-40GB", 4, 64, 512.0, "nvlink", 600.0, 25.0)])


def same_graph(a: nx.DiGraph, b: nx.DiGraph) -> None:
    assert list(a.nodes) == list(b.nodes)
    for n in a.nodes:
        da, db = a.nodes[n], b.nodes[n]
        assert da.keys() == db.keys(), n
        for k, va in da.items():
            vb = db[k]
            if isinstance(va, float):
                assert math.isclose(va, vb, rel_tol=1e-12, abs_tol=1e-12), (n, k, va, vb)
            else:
                assert va == vb, (n, k, va, vb)
        assert list(a.adj[n].items()) == list(b.adj[n].items()), n
        assert list(a.pred[n].items()) == list(b.pred[n].items()), n
    assert a.graph == b.graph


@pytest.mark.parametrize(("information", "estimator"), [
    ("estimated", "analytic"), ("oracle", "analytic"),  # both information modes
    ("estimated", "crius"), ("oracle", "auto"),  # estimators other than the analytic one
])
def test_cached_candidates_equal_a_fresh_build_every_round(information: str, estimator: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round's cached graph equals a fresh build by a fresh memo over the same estimator
    (the runtime feedback copied), so neither the cache nor the estimator memo serves a stale
    answer, whatever the information mode and the estimator."""
    checked: list[int] = []
    orig = FormulationPolicy.candidates

    def candidates(self: FormulationPolicy, view):  # type: ignore[no-untyped-def]
        g = orig(self, view)
        used = g.graph["estimator"]
        memo = _Memo(used.inner, per_job=used.per_job)
        memo.blacklist, memo.only_type = set(used.blacklist), dict(used.only_type)
        # a round the trim trims is built without the elastic scale-up (recipes.py)
        scale_up = self.cfg.candidates.scale_up_when_full or not requests_beyond(
            view.cluster, g.graph["specs"])
        fresh = build_candidates(view.cluster, g.graph["specs"], view.now, memo,
                                 self.cfg.candidates, scale_up=scale_up)
        if not scale_up and not asks_beyond_capacity(fresh):
            fresh = build_candidates(view.cluster, g.graph["specs"], view.now, memo,
                                     self.cfg.candidates)
        if not self.cfg.candidates.scale_up_when_full:
            trim_scale_up(fresh)  # the stage's step after the cache, as for a full round
        mine = g.copy()
        for k in ("specs", "estimator", "t0", "candidates_s"):
            mine.graph.pop(k)
        same_graph(mine, fresh)
        for n in g:  # the graph itself, not a copy: a copy re-derives the predecessor order
            assert list(g.pred[n].items()) == list(fresh.pred[n].items()), n
        checked.append(len(g.graph["specs"]))
        return g

    monkeypatch.setattr(FormulationPolicy, "candidates", candidates)
    cl = small_cluster()
    trace = tr.synthetic(n=14, rate_per_h=20.0, seed=3, sizes={1: 0.4, 2: 0.3, 4: 0.3},
                         models={"bert-0.76b": 0.5, "wresnet-0.5b": 0.5}, iterations=(50.0, 3000.0))
    pol = make_policy("apportion", time_budget_s=5.0, resolve_every=1, estimator=estimator)
    res = Simulator(cl, trace, pol, AnalyticTruth(cl),
                    SimConfig(information=information, restart_cost_s=10.0)).run()
    assert res.summary["finished"] == 14
    assert len(checked) >= 5 and pol.cache.hits > 0 and pol.cache.misses >= 14


def _per_layer(model_name: str, gbs: int, plan: ExecutionPlan, gpu_type: str,
               intra: Link, outer: Link) -> tuple[float, float]:
    """The per-layer loop the stage sums replaced (time, peak memory), as it was."""
    from apportion.gpus import get_gpu

    est = AnalyticEstimator()
    model = get_model(model_name)
    gpu = get_gpu(gpu_type)
    S, tp, dp = plan.pp, plan.tp, plan.dp
    flops, params = model.attr("flops"), model.attr("params")
    acts, outs = model.attr("act_bytes"), model.attr("out_bytes")
    ranges = cached_cuts(tuple(flops), tuple(outs), S)
    peak = gpu.peak_flops("half" if model.dtype_bytes <= 2 else "tf32")
    eff = est._eff(gpu_type, tp)
    per_replica = gbs / dp
    usable = gpu.memory_bytes * est.usable_memory_fraction - est.memory_reserve_gib * 2**30
    B = min(max(plan.micro_batches, 4 * S if S > 1 else 1), max(1, int(per_replica)))
    while True:
        mb = per_replica / B
        st_t, st_c, st_m, dp_t = [], [], [], []
        for s, (a, b) in enumerate(ranges):
            f, p = sum(flops[a:b]), sum(params[a:b]) / tp
            tpc = sum(4 * allreduce_time(o * mb, tp, intra) for o in outs[a:b]) if tp > 1 else 0.0
            recv = 2 * p2p_time(outs[a - 1] * mb, outer) if s > 0 else 0.0
            st_t.append(3.0 * f * mb / (tp * peak * eff) + tpc + recv)
            st_c.append(recv)
            st_m.append(p * 16.0 + sum(acts[a:b]) * mb / tp * min(B, S - s))
            dp_t.append(allreduce_time(p * 2.0, dp, intra if dp * tp <= 1 else outer))
        if max(st_m) <= usable or B >= min(est.max_micro_batches, max(1, int(per_replica))):
            break
        B = min(B * 2, max(1, int(per_replica)))
    pipe = sum(st_t) + (B - 1) * max(t - c for t, c in zip(st_t, st_c))
    opt = 16.0 * max(sum(params[a:b]) for a, b in ranges) / tp / (gpu.hbm_GBps * 1e9)
    return pipe + max(dp_t) + opt, max(st_m)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["bert-1.3b", "gpt2-1.5b", "wresnet-1b", "moe-1.3b", "t5-1.2b"]),
       gbs=st.sampled_from([8, 64, 512]), stages=st.sampled_from([1, 2, 4, 8]),
       tp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 8]),
       gpu=st.sampled_from(["A100-40GB", "A40", "V100-32GB"]))
def test_stage_sums_give_the_per_layer_estimate(model: str, gbs: int, stages: int, tp: int,
                                                dp: int, gpu: str) -> None:
    if stages > len(get_model(model).layers) or gbs < dp:
        return
    intra, outer = Link("nvlink", 300.0), Link("network", 12.5)
    plan = ExecutionPlan(dp=dp, tp=tp, pp=stages)
    e = AnalyticEstimator()._evaluate(get_model(model), gbs, plan, gpu, intra, outer)
    t, mem = _per_layer(model, gbs, plan, gpu, intra, outer)
    assert math.isclose(e.iter_time_s, t, rel_tol=1e-9)
    assert math.isclose(e.mem_per_gpu, mem, rel_tol=1e-9)
    assert stage_sums(get_model(model), stages) is stage_sums(get_model(model), stages)


class _NoShape:
    """An estimator that does not say what it reads of a job: every job is asked alone."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "shape_of":
            raise AttributeError(name)
        return getattr(self.inner, name)


SHAPES = [("bert-336m", 64, 2), ("bert-336m", 64, 4), ("bert-336m", 128, 2),
          ("bert-1.3b", 32, 4), ("llama-30b", 8, 1), ("bert-6.7b", 8, 1), ("gpt2-1.5b", 16, 1)]


def _jobs(picks: list[tuple[int, bool]]) -> list[JobSpec]:
    """Jobs of ``SHAPES`` (index, running): a running one is BERT-336M on four A100s."""
    jobs = []
    for i, (k, running) in enumerate(picks):
        model, batch, gpus = SHAPES[k]
        state = RunningState("A100-40GB", 4, 1, {"a100-0": 4}) if running and gpus == 4 \
            and model == "bert-336m" else None
        jobs.append(JobSpec(f"j{i}", model, batch, 1000, gpus, submit_time_s=0.0,
                            running=state))
    return jobs


#: job picks of ``_jobs``: shapes, each running or not
PICKS = st.lists(st.tuples(st.sampled_from(range(len(SHAPES))), st.booleans()), min_size=1,
                 max_size=12)


@settings(max_examples=15, deadline=None)
@given(picks=PICKS, filtered=st.booleans())
def test_jobs_of_one_shape_share_their_cells_and_the_graph_is_the_one_asked_job_by_job(
        picks: list[tuple[int, bool]], filtered: bool) -> None:
    """The builder estimates, filters and prunes once per shape (model, batch, request,
    what the filter reads) and computes each cell shape's edges once; the graph equals the
    one an estimator that says nothing of what it reads gives (every job asked alone), with
    running jobs, spilled jobs (BERT-6.7B on one GPU), jobs that cannot spill either
    (LLaMA-30B on one GPU: their reason) and the workload filter among them."""
    cluster = small_cluster()
    jobs = _jobs(picks)
    accept = workload_plan_filter("cpu") if filtered else None
    inner = AnalyticEstimator()
    shared = build_candidates(cluster, jobs, 600.0, _Memo(inner), accept=accept)
    alone = build_candidates(cluster, jobs, 600.0, _NoShape(_Memo(inner)), accept=accept)
    same_graph(shared, alone)


def _refuses_dp_above_one(job: JobSpec, plan: ExecutionPlan) -> str | None:
    """A filter a running job's present plan may fail (data parallelism refused)."""
    return "no data parallelism" if plan.dp > 1 else None


@settings(max_examples=15, deadline=None)
@given(picks=PICKS, strict=st.booleans())
def test_the_cell_builder_judged_every_cell_but_the_running_ones(
        picks: list[tuple[int, bool]], strict: bool) -> None:
    """The cells recipe says its builder judged every cell but a running job's present one
    (``Recipe.judges_plans``), so the round's filter pass judges only those: the graph it
    leaves is the one a pass over every cell leaves, reasons included."""
    assert RECIPES["cells"].judges_plans and RECIPES["deadline"].judges_plans
    assert not RECIPES["plans"].judges_plans  # its builder keeps refused plans to say why
    cluster = small_cluster()
    jobs = _jobs(picks)
    accept = _refuses_dp_above_one if strict else workload_plan_filter("cpu")
    every = build_candidates(cluster, jobs, 600.0, _Memo(AnalyticEstimator()), accept=accept)
    some = every.copy()
    n_every = drop_refused_plans(every, jobs, accept)
    n_some = drop_refused_plans(some, jobs, accept, current_cells(some))
    assert n_every == n_some
    same_graph(every, some)


def test_the_cell_model_says_its_rounded_relaxation_ends_the_chain() -> None:
    """The cell model over GPUs alone marks LP rounding's answer final for the solver chain
    (``solvers.chain_rules.lp_rounding_final``); with CPU and memory rows it does not."""
    g = build_candidates(small_cluster(), _jobs([(0, False), (1, True), (2, False)]), 600.0,
                         _Memo(AnalyticEstimator()))
    assert build_cells_model(g).meta["lp_rounding_final"] is True
    assert build_cells_model(g, resources=True).meta["lp_rounding_final"] is False


class _Counting:
    """An estimator that counts its calls and answers the cell's size."""

    def __init__(self) -> None:
        self.calls = 0

    def best_in_cell(self, job: JobSpec, cell, cluster):  # type: ignore[no-untyped-def]
        self.calls += 1
        return (job.id, cell.gpu_type, cell.gpus, cell.stages)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["A40", "A100-40GB"]),
                          st.sampled_from([1, 2, 4])), max_size=6),
       st.lists(st.sampled_from("abc"), max_size=2))
def test_per_job_memo_forgets_exactly_the_measured_cells_and_the_jobs_gone(
        measured: list[tuple[str, str, int]], gone: list[str]) -> None:
    """A per-job memo asked again after ``forget``/``forget_jobs`` re-estimates exactly the
    forgotten (job, type, count) cells and the gone jobs' cells, and nothing else."""
    cluster = small_cluster()
    inner = _Counting()
    memo = _Memo(inner, per_job=True)
    jobs = {j: JobSpec(j, "gpt2-small", 8, 100, 1.0, 0.0) for j in "abc"}
    cells = [(j, t, n, s) for j in "abc" for t in ("A40", "A100-40GB") for n in (1, 2, 4)
             for s in (1, 2)]

    def ask() -> None:
        for j, t, n, s in cells:
            assert memo.best_in_cell(jobs[j], Cell(j, t, n, s), cluster) == (j, t, n, s)

    ask()
    assert inner.calls == len(cells)
    memo.forget(set(measured))
    memo.forget_jobs(sorted(set(gone)))
    inner.calls = 0
    ask()
    again = {(j, t, n) for j, t, n, _ in cells if (j, t, n) in set(measured) or j in gone}
    assert inner.calls == 2 * len(again)  # two stage counts per (job, type, count)
    assert sum(len(v) for v in memo.keys_of.values()) == len(memo.memo)
