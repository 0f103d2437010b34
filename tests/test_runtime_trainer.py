"""The torch worker: catalog modules, index-keyed data, plan checks, checkpoint/resume and
loss continuity across a 2 -> 1 -> 2 worker reconfiguration (real gloo process groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.executors.local.executor import free_port, spawn, wait
from apportion.runtime.workers.torch_nets import TRAINABLE, batch, build_net, param_count
from apportion.runtime.workers.trainer import LOSSES_FILE, PlanError, Worker, check_plan, micro_batch

from apportion.decision import Allocation
from apportion.jobs import JobSpec, job_dirname
from apportion.models import get_model
from apportion.plans import ExecutionPlan

# Losses of a resumed or resized run may differ from the untouched run only by floating-point
# summation order (gradients averaged over a different rank split): far below this.
LOSS_TOL = 1e-4


def losses(jobdir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (jobdir / LOSSES_FILE).read_text().splitlines():
        rec = json.loads(line)
        out[rec["iteration"]] = rec["loss"]  # a relaunch that repeats an iteration overwrites it
    return out


def run_inprocess(workdir: Path, model: str, iterations: int, plan: ExecutionPlan,
                  stop_at: int | None = None, batch_size: int = 4) -> None:
    cfg = TrainConfig("j", model, batch_size, iterations, plan.as_dict(), str(workdir), seed=3,
                      stop_at=stop_at)
    assert Worker(cfg, 0, 1).run() == 0


@pytest.mark.parametrize("name", TRAINABLE)
def test_modules_match_catalog_parameter_counts(name: str) -> None:
    net = build_net(name)
    assert param_count(net) == get_model(name).params
    x, _y = batch(name, 0, 0, 2)
    out = net(x)
    assert out.shape[0] == 2 and torch.isfinite(out).all()


@settings(max_examples=20)
@given(start=st.integers(0, 200), count=st.integers(1, 6), split=st.integers(1, 5))
def test_data_is_keyed_by_global_sample_index(start: int, count: int, split: int) -> None:
    x, y = batch("gpt-tiny", 7, start, count + split)
    x1, y1 = batch("gpt-tiny", 7, start, split)
    x2, y2 = batch("gpt-tiny", 7, start + split, count)
    assert torch.equal(torch.cat([x1, x2]), x) and torch.equal(torch.cat([y1, y2]), y)


def test_plans_the_worker_cannot_run_fail_with_a_reason() -> None:
    with pytest.raises(PlanError, match="needs dp\\*tp\\*pp = 2 workers"):
        check_plan(ExecutionPlan(dp=2), 1, "cpu")
    check_plan(ExecutionPlan(pp=2, micro_batches=2), 2, "cpu")  # pipeline plans run
    with pytest.raises(PlanError, match="pipeline parallelism combined with tensor"):
        check_plan(ExecutionPlan(pp=2, tp=2), 4, "cpu")
    with pytest.raises(PlanError, match="offload"):
        check_plan(ExecutionPlan(zero_stage=3, offload=True), 1, "cpu")
    with pytest.raises(PlanError, match="not divisible"):
        micro_batch(10, ExecutionPlan(dp=4))
    assert micro_batch(16, ExecutionPlan(dp=2, accumulation=4)) == 2


def test_a_failed_plan_is_reported_not_changed(tmp_path: Path) -> None:
    cfg = TrainConfig("j", "gpt-tiny", 6, 2, ExecutionPlan(dp=1, accumulation=4).as_dict(),
                      str(tmp_path))
    with pytest.raises(PlanError, match="not divisible by dp\\*accumulation = 1\\*4"):
        Worker(cfg, 0, 1).run()


def test_checkpoint_is_atomic_and_complete(tmp_path: Path) -> None:
    state = ckpt.TrainState(3, 24, {"w": torch.ones(2)}, {"state": {}}, ckpt.rng_state(), {"a": 1})
    ckpt.save(tmp_path / "c.pt", state)
    back = ckpt.load(tmp_path / "c.pt")
    assert back is not None and back.iteration == 3 and back.samples_seen == 24
    assert torch.equal(back.model["w"], torch.ones(2)) and back.meta == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left behind
    assert ckpt.load(tmp_path / "missing.pt") is None


@pytest.mark.parametrize("name", ["gpt-tiny", "vit-tiny"])  # bert-tiny: the accumulation test
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, name: str) -> None:
    run_inprocess(tmp_path / "a", name, 4, ExecutionPlan())
    run_inprocess(tmp_path / "b", name, 4, ExecutionPlan(), stop_at=2)
    assert sorted(losses(tmp_path / "b")) == [1, 2]
    run_inprocess(tmp_path / "b", name, 4, ExecutionPlan())
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == [1, 2, 3, 4]
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=LOSS_TOL)


def test_accumulation_and_recomputation_keep_the_trajectory(tmp_path: Path) -> None:
    run_inprocess(tmp_path / "a", "bert-tiny", 3, ExecutionPlan())
    run_inprocess(tmp_path / "b", "bert-tiny", 3, ExecutionPlan(accumulation=4,
                                                                 checkpointing=True))
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=LOSS_TOL)


def test_a_one_stage_plans_micro_batches_are_accumulation_steps(tmp_path: Path) -> None:
    """The estimator, the memory check and the plans formulation size a memory-bound
    one-stage plan by its micro-batches (a quarter of the rank's batch at a time); the
    worker ran it at the whole batch, where it may not fit. It now runs 4 passes of 1 sample,
    on the trajectory of the plain plan."""
    from apportion.runtime.workers.deepspeed_config import deepspeed_config

    plan = ExecutionPlan(micro_batches=4)
    assert plan.accumulation_steps == 4 and micro_batch(4, plan) == 1
    assert deepspeed_config(plan, 4)["gradient_accumulation_steps"] == 4
    assert ExecutionPlan(pp=2, dp=1, micro_batches=4).accumulation_steps == 1  # a pipeline's
    run_inprocess(tmp_path / "a", "bert-tiny", 3, ExecutionPlan())
    run_inprocess(tmp_path / "b", "bert-tiny", 3, plan)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=LOSS_TOL)


def test_loss_continuity_across_2_1_2_workers(tmp_path: Path) -> None:
    """A job resized 2 -> 1 -> 2 workers follows the untouched run's losses (same seed)."""
    job = JobSpec("j", "gpt-tiny", 4, 6, 2)
    base = tmp_path / "base"
    cfg = TrainConfig("j", "gpt-tiny", 4, 6, ExecutionPlan().as_dict(), str(base / "j"), seed=0)
    assert Worker(cfg, 0, 1).run() == 0

    def launch(world: int, stop_at: int | None) -> None:
        alloc = Allocation("j", "T4", world, 1, ExecutionPlan(dp=world), {"local-0": world}, 1.0)
        spec = launch_spec(job, alloc, "resize", tmp_path / "moved", master_port=free_port(),
                           stop_at=stop_at)
        assert wait(spawn(spec), 120), (Path(spec.workdir) / "rank0.log").read_text()

    launch(2, 2)
    cfg1 = TrainConfig("j", "gpt-tiny", 4, 6, ExecutionPlan().as_dict(),
                       str(tmp_path / "moved" / job_dirname("j")), seed=0, stop_at=4)
    assert Worker(cfg1, 0, 1).run() == 0  # the one-worker phase, in this process
    launch(2, None)
    a, b = losses(base / "j"), losses(tmp_path / "moved" / job_dirname("j"))
    assert sorted(b) == list(range(1, 7))
    worlds = [json.loads(x)["world"] for x in
              (tmp_path / "moved" / job_dirname("j") / LOSSES_FILE).read_text().splitlines()]
    assert worlds == [2, 2, 1, 1, 2, 2]
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=LOSS_TOL), (it, a, b)
    state = ckpt.load(ckpt.job_checkpoint(tmp_path / "moved" / job_dirname("j")))
    assert state is not None and state.iteration == 6 and state.samples_seen == 6 * 4
