"""Sanity properties of the analytic estimator and the stage partitioner."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import networkx as nx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.estimation.models.analytic import AnalyticEstimator, nominal_placement
from apportion.estimation.base import Estimator, Sample
from apportion.estimation.models.comm import Link
from apportion.estimation.models.partition import balanced_cuts
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, get_model
from apportion.plans import Cell, ExecutionPlan

MODELS = ["bert-0.76b", "bert-1.3b", "wresnet-1b", "moe-1.3b", "gpt2-1.5b", "t5-1.2b", "vit-86m"]
GPUS = ["A100-40GB", "A40", "A10", "V100-32GB", "T4"]


def _cluster(gpu: str, per_node: int = 8, nodes: int = 8) -> Cluster:
    return Cluster("c", [NodeGroup("n", nodes, gpu, per_node, intra_node_bandwidth_GBps=300,
                                   inter_node_bandwidth_GBps=25)])


def _job(model: str, gbs: int = 256) -> JobSpec:
    return JobSpec("j", model, gbs, 1000, 4)


@settings(max_examples=40)
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS),
       gpus=st.sampled_from([1, 2, 4, 8, 16]), stages=st.sampled_from([1, 2, 4]),
       gbs=st.sampled_from([64, 128, 512]))
def test_more_gpus_never_cut_memory_feasibility(model: str, gpu: str, gpus: int, stages: int,
                                                gbs: int) -> None:
    if stages > gpus:
        return
    c, est, job = _cluster(gpu), AnalyticEstimator(), _job(model, gbs)
    small = est.best_in_cell(job, Cell("j", gpu, gpus, stages), c)
    big = est.best_in_cell(job, Cell("j", gpu, 2 * gpus, stages), c)
    if small is not None:
        assert big is not None, "doubling the GPUs made a feasible cell infeasible"
        # the same split with twice the data parallelism never needs more memory per GPU
        same = est._evaluate(get_model(model), gbs,
                             ExecutionPlan(dp=2 * small.plan.dp, tp=small.plan.tp, pp=stages),
                             gpu, *est._links(nominal_placement(c, gpu, 2 * gpus) or {}, gpu, c))
        assert same.feasible and same.mem_per_gpu <= small.mem_per_gpu * (1 + 1e-9)


def _scaled(model: ModelSpec, k: float) -> ModelSpec:
    g = nx.DiGraph(model.graph)
    for n in g.nodes:
        g.nodes[n]["flops"] = g.nodes[n]["flops"] * k
    return replace(model, graph=g)


@settings(max_examples=40)
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), k=st.floats(1.0, 8.0),
       dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]))
def test_more_flops_never_faster(model: str, gpu: str, k: float, dp: int, tp: int, pp: int) -> None:
    est = AnalyticEstimator()
    m = get_model(model)
    link = Link("nvlink", 300)
    plan = ExecutionPlan(dp=dp, tp=tp, pp=pp)
    base = est._evaluate(m, 256, plan, gpu, link, Link("network", 25))
    more = est._evaluate(_scaled(m, k), 256, plan, gpu, link, Link("network", 25))
    assert more.iter_time_s >= base.iter_time_s * (1 - 1e-9)


def test_faster_gpu_is_faster_and_oom_is_reported() -> None:
    est, job = AnalyticEstimator(), _job("bert-1.3b")
    a100 = est.best_in_cell(job, Cell("j", "A100-40GB", 8, 1), _cluster("A100-40GB"))
    t4 = est.best_in_cell(job, Cell("j", "T4", 8, 1), _cluster("T4"))
    assert a100 is not None and a100.feasible
    assert t4 is None or t4.throughput < a100.throughput
    # a 32B model on one 16 GB GPU cannot fit
    assert est.best_in_cell(_job("llama-30b"), Cell("j", "T4", 1, 1), _cluster("T4")) is None


def test_estimator_protocol_and_fit_calibrates_efficiency() -> None:
    est = AnalyticEstimator(efficiency=0.45)
    assert isinstance(est, Estimator)
    assert est.get_params()["efficiency"] == 0.45
    assert not hasattr(est, "efficiency_")
    c = _cluster("A100-40GB")
    job = _job("bert-1.3b")
    plan = ExecutionPlan(dp=8)
    placement = nominal_placement(c, "A100-40GB", 8)
    assert placement is not None
    truth = est.predict(job, plan, placement, c).iter_time_s * 0.45 / 0.30  # a slower cluster
    est.fit([Sample(job, plan, placement, "A100-40GB", truth)], cluster=c)
    assert est.efficiency_["A100-40GB"] == pytest.approx(0.30, rel=0.02)
    assert est.predict(job, plan, placement, c).iter_time_s == pytest.approx(truth, rel=0.05)



@settings(max_examples=25, deadline=None)
@given(measured=st.sampled_from(GPUS), other=st.sampled_from(GPUS),
       slowdown=st.floats(0.5, 2000.0), model=st.sampled_from(MODELS))
def test_a_fit_on_one_gpu_type_keeps_the_others_ratio_to_it(measured: str, other: str,
                                                            slowdown: float, model: str) -> None:
    """A workload measured ``slowdown`` times slower than the model on one type makes the
    unmeasured types slower by the same factor: a fit never makes an unmeasured type look
    faster than a measured one it was slower than (that drove runs to migrate every job
    to the type nobody had measured yet)."""
    if other == measured:
        return
    c = Cluster("c", [NodeGroup("m", 1, measured, 8), NodeGroup("o", 1, other, 8)])
    job, plan = _job(model, 64), ExecutionPlan(dp=1)
    est = AnalyticEstimator()
    first = {t: est.predict(job, plan, nominal_placement(c, t, 1) or {}, c)
             for t in (measured, other)}
    assume(all(e.feasible for e in first.values()))  # a fit skips infeasible samples
    at = {t: e.iter_time_s for t, e in first.items()}
    place = nominal_placement(c, measured, 1) or {}
    est.best_in_cell(job, Cell("j", other, 1, 1), c)  # memoised before the fit
    est.fit([Sample(job, plan, place, measured, at[measured] * slowdown)], cluster=c)
    after = {t: est.predict(job, plan, nominal_placement(c, t, 1) or {}, c).iter_time_s
             for t in (measured, other)}
    # not exact: the optimizer step is memory bound and does not scale with the efficiency
    assert after[measured] == pytest.approx(at[measured] * slowdown, rel=0.15)
    assert after[other] / after[measured] == pytest.approx(at[other] / at[measured], rel=0.15)
    # the cell memo sees the refit too (the candidates a run's next round builds)
    e = est.best_in_cell(job, Cell("j", other, 1, 1), c)
    assert e is not None
    now = est.predict(job, e.plan, nominal_placement(c, other, 1) or {}, c).iter_time_s
    assert e.iter_time_s == pytest.approx(now, rel=1e-9)


@settings(max_examples=60)
@given(flops=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=9),
       stages=st.integers(1, 4), data=st.data())
def test_balanced_cuts_are_contiguous_and_near_optimal(flops: list[float], stages: int,
                                                       data: st.DataObject) -> None:
    if stages > len(flops):
        with pytest.raises(ValueError):
            balanced_cuts(flops, [1.0] * len(flops), stages)
        return
    cut_bytes = data.draw(st.lists(st.floats(0.0, 10.0), min_size=len(flops), max_size=len(flops)))
    ranges = balanced_cuts(flops, cut_bytes, stages, tolerance=0.1)
    assert len(ranges) == stages
    assert ranges[0][0] == 0 and ranges[-1][1] == len(flops)
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(stages - 1))
    # brute force: the slowest stage is within the tolerance of the best possible
    best = min(
        max(sum(flops[a:b]) for a, b in zip((0,) + cuts, cuts + (len(flops),)))
        for cuts in itertools.combinations(range(1, len(flops)), stages - 1)
    )
    assert max(sum(flops[a:b]) for a, b in ranges) <= best * 1.1 + 1e-9


def _scalar_cuts(flops: list[float], cut_bytes: list[float], stages: int,
                 tolerance: float) -> list[tuple[int, int]]:
    """The stage DP one pair of cut positions at a time: the oracle of the array form."""
    n = len(flops)
    prefix = [0.0]
    for f in flops:
        prefix.append(prefix[-1] + float(f))
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            best[s][j] = min(max(best[s - 1][i], prefix[j] - prefix[i]) for i in range(s - 1, j))
    limit = best[stages][n] * (1 + tolerance) + 1e-12
    cost = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    back = [[-1] * (n + 1) for _ in range(stages + 1)]
    cost[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                if cost[s - 1][i] == math.inf or prefix[j] - prefix[i] > limit:
                    continue
                c = cost[s - 1][i] + (float(cut_bytes[i - 1]) if i > 0 else 0.0)
                if c < cost[s][j]:
                    cost[s][j], back[s][j] = c, i
    ranges, j = [], n
    for s in range(stages, 0, -1):
        ranges.append((back[s][j], j))
        j = back[s][j]
    return ranges[::-1]


@settings(max_examples=300)
@given(flops=st.lists(st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(0.0, 50.0)),
                      min_size=1, max_size=24),
       data=st.data(), tolerance=st.sampled_from([0.0, 0.1, 0.5]))
def test_balanced_cuts_are_the_scalar_dps(flops: list[float], data: st.DataObject,
                                         tolerance: float) -> None:
    """The array DP makes the same floating-point steps as the scalar one, so it cuts in the
    same places, ties (equal layers, free cuts) included."""
    stages = data.draw(st.integers(1, len(flops)))
    cut_bytes = data.draw(st.lists(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 10.0)),
                                   min_size=len(flops), max_size=len(flops)))
    assert balanced_cuts(flops, cut_bytes, stages, tolerance) == \
        _scalar_cuts(flops, cut_bytes, stages, tolerance)


def test_compute_calibration_recovers_efficiency_where_communication_dominates():
    """Measurements from an efficiency-0.3 model on a slow link: the compute-only calibration
    recovers 0.3; the total-time ratio (communication counted as compute) does not."""
    cl = Cluster("slow", [NodeGroup("n", 1, "A100-40GB", 4, intra_node_link="pcie",
                                    intra_node_bandwidth_GBps=0.5)])
    node = next(iter(cl.nodes))
    truth = AnalyticEstimator(efficiency=0.3)
    samples = []
    for dp in (1, 2, 4):
        job = JobSpec(f"j{dp}", "bert-0.76b", 64, 10, dp)
        e = truth.predict(job, ExecutionPlan(dp=dp), {node: dp}, cl)
        samples.append(Sample(job, ExecutionPlan(dp=dp), {node: dp}, "A100-40GB", e.iter_time_s))
    compute = AnalyticEstimator(calibrate="compute").fit(samples, cl)
    total = AnalyticEstimator().fit(samples, cl)
    assert abs(compute.efficiency_["A100-40GB"] - 0.3) < 0.003
    assert abs(total.efficiency_["A100-40GB"] - 0.3) > 0.03
