"""The validator checks each GPU's memory from the plan (apportion/plan_memory.py).

Its figure is a lower bound, so it must never refuse a plan an estimator sized: for every
plan the analytic estimator accepts (on the catalog's GPUs or a node group's smaller
``gpu_memory_gib``), the floor is at most the estimate and the validator agrees. And it
catches the plans issue 61 found placed over memory: ``apportion-plans``' bert-1.3b at
21.3 GiB per GPU on 4 GiB GPUs, its bert-2.6b at 20.75 GiB on 8 GiB, and Sia's bert-1.3b
two-way data parallel on the 4 GiB GPUs, refused by name through a door that reads a
decision (``export slurm``), exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.models.comm import Link
from apportion.estimation.rate_estimator import RateEstimator
from apportion.formulations.plans import EstimatedPlans
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Allocation, Decision, SolveReport
from apportion.jobs import JobSpec
from apportion.models import MODEL_NAMES, get_model
from apportion.plan_memory import (
    GiB,
    memory_floor,
    memory_violation,
    state_bytes_per_param,
    type_memory_bytes,
)
from apportion.plans import Cell, ExecutionPlan
from apportion.validator import validate

runner = CliRunner()
TYPES = ("A100-40GB", "A40", "A10", "V100-32GB", "A100-80GB", "T4")
MODELS = tuple(m for m in MODEL_NAMES if "tiny" not in m)
POW2 = st.sampled_from([1, 2, 4, 8])


def _cluster(gpu_type: str, gpus: int, limit_gib: float | None) -> Cluster:
    nodes = max(1, -(-gpus // 8))
    return Cluster("c", [NodeGroup("n", nodes, gpu_type, 8, cpus_per_node=64,
                                   host_memory_gib=1024, gpu_memory_gib=limit_gib)])


def _decision(job: str, gpu_type: str, plan: ExecutionPlan) -> Decision:
    left, placement, i = plan.gpus, {}, 0
    while left:
        placement[f"n-{i}"] = min(8, left)
        left -= placement[f"n-{i}"]
        i += 1
    return Decision([Allocation(job, gpu_type, plan.gpus, plan.pp, plan, placement, 1.0)], [],
                    SolveReport("test", "feasible", None, None, None, 0.0, False))


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from(MODELS), gbs=st.sampled_from([1, 4, 16, 64, 256, 1024]),
       gpu_type=st.sampled_from(TYPES), dp=POW2, tp=POW2, pp=POW2,
       micro=st.sampled_from([1, 2, 4, 16]), zero=st.integers(0, 3), offload=st.booleans(),
       ckpt=st.booleans(), limit=st.one_of(st.none(), st.floats(1.0, 90.0)))
def test_the_validator_never_refuses_a_plan_the_analytic_estimator_sized(
        model: str, gbs: int, gpu_type: str, dp: int, tp: int, pp: int, micro: int, zero: int,
        offload: bool, ckpt: bool, limit: float | None) -> None:
    cluster = _cluster(gpu_type, dp * tp * pp, limit)
    spec = get_model(model)
    plan = ExecutionPlan(dp=dp, tp=tp, pp=pp, micro_batches=micro, zero_stage=zero,
                         offload=offload, checkpointing=ckpt)
    link = Link("nvlink", 300.0)
    e = AnalyticEstimator()._evaluate(spec, gbs, plan, gpu_type, link, link,
                                      limit=cluster.gpu_memory_bytes(gpu_type))
    assume(e.feasible)
    floor = memory_floor(spec, gbs, e.plan)
    assert floor.bytes <= e.mem_per_gpu * (1 + 1e-12), (floor.describe(), e.mem_per_gpu / GiB)
    job = JobSpec("j", model, gbs, 10, e.plan.gpus)
    res = validate(_decision("j", gpu_type, e.plan), cluster, [job])
    assert res.ok, res.violations


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), gbs=st.sampled_from([8, 64, 256]),
       gpu_type=st.sampled_from(TYPES), gpus=st.sampled_from([1, 2, 4, 8, 16]),
       limit=st.one_of(st.none(), st.floats(2.0, 60.0)))
def test_every_plan_an_estimator_offers_fits_by_the_validators_ledger(
        model: str, gbs: int, gpu_type: str, gpus: int, limit: float | None) -> None:
    """The cells' best splits, the plans formulation's options and a rate source's plans
    (a witness that the job runs, and the inner model's plan) all fit the GPU's memory."""
    cluster = _cluster(gpu_type, gpus, limit)
    job = JobSpec("j", model, gbs, 10, gpus)
    device = type_memory_bytes(cluster, gpu_type)
    spec = get_model(model)
    found = []
    for stages in (s for s in (1, 2, 4, 8) if gpus % s == 0):
        cell = Cell("j", gpu_type, gpus, stages)
        found.append(AnalyticEstimator().best_in_cell(job, cell, cluster))
        found.append(RateEstimator(lambda j, t, g: 1.0).best_in_cell(job, cell, cluster))
    plans = [e.plan for e in found if e is not None]
    plans += [o.plan for o in EstimatedPlans().options(job, gpu_type, gpus, cluster)]
    for plan in plans:
        assert memory_floor(spec, gbs, plan).bytes <= device, plan.label()


def test_zero_and_offload_shard_the_states_as_the_plan_says() -> None:
    assert state_bytes_per_param(ExecutionPlan(dp=4)) == 16.0
    assert state_bytes_per_param(ExecutionPlan(dp=4, zero_stage=1)) == 2 + 2 + 3
    assert state_bytes_per_param(ExecutionPlan(dp=4, zero_stage=2)) == 2 + 0.5 + 3
    assert state_bytes_per_param(ExecutionPlan(dp=4, zero_stage=3)) == 0.5 + 0.5 + 3
    assert state_bytes_per_param(ExecutionPlan(dp=4, zero_stage=2, offload=True)) == 2
    assert state_bytes_per_param(ExecutionPlan(dp=4, zero_stage=3, offload=True)) == 0
    m = get_model("bert-1.3b")  # recomputation and micro-batches only lower the floor
    full = memory_floor(m, 64, ExecutionPlan(dp=2)).bytes
    assert memory_floor(m, 64, ExecutionPlan(dp=2, checkpointing=True)).bytes < full
    assert memory_floor(m, 64, ExecutionPlan(dp=2, accumulation=4)).bytes < full
    assert memory_floor(m, 64, ExecutionPlan(dp=2, micro_batches=4)).bytes < full
    assert memory_floor(m, 64, ExecutionPlan(dp=1, tp=2)).bytes < full


def test_a_model_without_a_layer_graph_is_not_memory_checked() -> None:
    """A trace's own job type has no layers and declares no memory: nothing to check."""
    cl = _cluster("K80", 8, 1.0)
    job = JobSpec("g", "ResNet-18 (batch size 128)", 128, 10, 8)
    assert memory_violation(job, ExecutionPlan(dp=8), ["n-0"], cl) is None


def test_a_spilled_plan_holds_its_largest_layer_within_its_budget() -> None:
    m = get_model("bert-1.3b")
    spilled = ExecutionPlan(checkpointing=True, spill_shards=6, spill_budget_mib=2048)
    cl = _cluster("A100-40GB", 1, 4.0)
    job = JobSpec("s", "bert-1.3b", 64, 10, 1)
    floor = memory_floor(m, 64, spilled).bytes  # one layer at the global batch
    assert floor > 2048 * 2**20
    why = memory_violation(job, spilled, ["n-0"], cl)
    assert why is not None and "budget" in why
    roomy = ExecutionPlan(checkpointing=True, spill_shards=6, spill_budget_mib=int(floor // 2**20) + 1)
    assert memory_violation(job, roomy, ["n-0"], _cluster("A100-40GB", 1, None)) is None


# -- the plans issue 61 found placed over memory --------------------------------------------
CLUSTER = """\
name: small
node_groups:
  - {prefix: small, count: 2, gpu_type: A100-40GB, gpus_per_node: 4, gpu_memory_gib: 4}
  - {prefix: mid, count: 2, gpu_type: A40, gpus_per_node: 4, gpu_memory_gib: 8,
     intra_node_link: pcie}
"""
JOBS = """\
jobs:
  - {id: b13, model: bert-1.3b, global_batch_size: 64, iterations: 1000, requested_gpus: 2}
  - {id: b26, model: bert-2.6b, global_batch_size: 64, iterations: 1000, requested_gpus: 4}
"""


def _alloc(job: str, gpu_type: str, plan: dict, placement: dict) -> dict:
    gpus = sum(placement.values())
    return {"job": job, "gpu_type": gpu_type, "gpus": gpus, "stages": plan.get("pp", 1),
            "plan": plan, "placement": placement, "est_throughput": 1.0}


OVER = {  # as main at d99a834 decided them
    "apportion-plans": [
        _alloc("b13", "A100-40GB", {"dp": 4, "micro_batches": 4, "zero_stage": 2},
               {"small-0": 4}),
        _alloc("b26", "A40", {"dp": 8, "micro_batches": 2, "zero_stage": 2},
               {"mid-0": 4, "mid-1": 4})],
    "sia": [_alloc("b13", "A100-40GB", {"dp": 2}, {"small-0": 2})],
}


@pytest.mark.parametrize("policy", sorted(OVER))
def test_the_over_memory_decisions_of_issue_61_are_refused_by_name(policy: str,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "j.yaml").write_text(JOBS)
    allocs = OVER[policy]
    placed = {a["job"] for a in allocs}
    pending = [{"job": j, "reason": "no-capacity"} for j in ("b13", "b26") if j not in placed]
    (tmp_path / "d.json").write_text(json.dumps({"allocations": allocs, "pending": pending}))
    r = runner.invoke(app, ["export", "slurm", "--decision", str(tmp_path / "d.json"),
                            "--cluster", str(tmp_path / "c.yaml"), "--jobs",
                            str(tmp_path / "j.yaml"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    for a in allocs:
        assert f"job {a['job']}: plan" in r.stderr and "activations) per GPU" in r.stderr, r.stderr
    assert "allow 4.00 GiB" in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
