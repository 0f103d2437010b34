"""The spilled estimate (``estimation.models.spill``): its copies are the spilled trainer's,
double buffering hides only what the formula says, shards follow the pilot's one rule, and a
running spilled job keeps its cell."""

from __future__ import annotations

import math

import pytest
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.models.spill import spill_cut, spill_estimate
from apportion.formulations.candidates import build_candidates
from apportion.formulations.schema import cells_of

from apportion.cluster import Cluster, NodeGroup
from apportion.gpus import get_gpu
from apportion.jobs import JobSpec, RunningState
from apportion.models import get_model
from apportion.spilling import greedy_shards

GiB = 2**30


def test_the_copies_are_every_weight_and_optimizer_state_each_iteration() -> None:
    """llama-30b in 16-bit: the forward unit promotes 2 bytes a parameter, the backward unit
    2 + 12 in and 2 + 12 out: 30 bytes a parameter, plus five crossings of each boundary
    activation; halving the link's bandwidth doubles the copy time."""
    model, gpu = get_model("llama-30b"), get_gpu("A10")
    e = spill_estimate(model, 8, gpu, 100.0, 20 * GiB)
    assert e.feasible and e.plan.spilled and e.plan.gpus == 1
    cut = spill_cut(model, 8, 20 * GiB)
    acts = cut.boundary_bytes * 8
    b = e.breakdown
    assert b["h2d_bytes"] == pytest.approx(model.params * 16 + 3 * acts)
    assert b["d2h_bytes"] == pytest.approx(model.params * 14 + 2 * acts)
    assert b["copy_s"] == pytest.approx((b["h2d_bytes"] + b["d2h_bytes"]) / (gpu.host_GBps * 1e9))
    assert e.iter_time_s == pytest.approx(100.0 + b["copy_s"] - b["hidden_s"])
    slow = spill_estimate(model, 8, gpu, 100.0, 20 * GiB, efficiency=0.5)
    assert slow.breakdown["copy_s"] == pytest.approx(2 * b["copy_s"])
    assert e.mem_per_gpu <= 20 * GiB and e.plan.spill_budget_mib == 20 * 1024


def test_double_buffering_hides_at_most_the_weights_and_the_compute() -> None:
    model, gpu = get_model("llama-30b"), get_gpu("A10")
    e = spill_estimate(model, 8, gpu, 100.0, 20 * GiB)
    b = e.breakdown
    assert b["double_buffer"] == 1.0
    assert 0 < b["hidden_s"] <= min(100.0, 2 * model.params * model.dtype_bytes /
                                    (gpu.host_GBps * 1e9))
    # no compute to hide behind: nothing hidden
    tiny = spill_estimate(model, 8, gpu, 1e-9, 20 * GiB)
    assert tiny.breakdown["hidden_s"] <= 1e-9
    # a layer too large for the budget: no spilled plan, and why
    none = spill_estimate(model, 8, gpu, 100.0, 1 * GiB)
    assert not none.feasible and "layer_too_large" in none.breakdown
    assert not spill_estimate(model, 8, gpu, math.inf, 20 * GiB).feasible


def test_the_estimate_cuts_where_the_pilot_rule_cuts() -> None:
    """The estimator's shards are ``greedy_shards`` over the catalog's bytes (the rule the
    pilot run applies to measured bytes): a shard grows until the next layer would pass the
    budget less the reserve, or its weights the reserve."""
    model = get_model("bert-6.7b")
    budget = 12 * GiB
    cut = spill_cut(model, 4, budget)
    p, a, o = model.attr("params"), model.attr("act_bytes"), model.attr("out_bytes")
    expect = greedy_shards([16 * x + y * 4 for x, y in zip(p, a)], [2 * x for x in p],
                           [0.0] + [x * 4 for x in o[:-1]], budget, 0.15, double_buffer=True)
    assert list(cut.shards) == expect and len(expect) > 1
    assert cut.device_bytes <= budget


def test_a_running_spilled_job_keeps_its_cell() -> None:
    """The round after a spilled start offers the same spilled cell as the job's current one.
    With 8 MiB a GPU (``gpu_memory_gib``) gpt-tiny fits no T4 cell, though the catalog's T4
    holds it: the current cell was once the whole model's estimate, unchecked against what
    the node group allows, and the decision lost the spilled plan."""
    for running in (None, RunningState("T4", 1, 1, {"t4-0": 1})):
        cluster = Cluster("c", [NodeGroup("t4", 1, "T4", 4, gpu_memory_gib=8 / 1024)])
        job = JobSpec("s", "gpt-tiny", 4, 100, 1, running=running, elastic=False)
        g = build_candidates(cluster, [job], 0.0, AnalyticEstimator())
        (cell,) = cells_of(g, "s")
        d = g.nodes[cell]
        assert d["current"] == (running is not None) and d["plan"].spilled and d["gpus"] == 1
        assert d["plan"].spill_budget_mib == 8 and d["mem_per_gpu"] <= 8 * 2**20
