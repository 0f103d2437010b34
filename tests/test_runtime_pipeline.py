"""Pipeline-parallel plans (torch.distributed.pipelining, real gloo process groups) train the
single-process trajectory, write full-state checkpoints in the single-process layout, and
resume across pipeline and non-pipeline plans. Every multi-process run has a timeout, so a
hang fails the test instead of blocking the suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.executors.local.executor import free_port, spawn, wait
from apportion.runtime.workers.pipeline_parallel import StageModule, split_blocks, stage_io
from apportion.runtime.workers.torch_nets import TRAINABLE, batch, build_net
from apportion.runtime.workers.trainer import LOSSES_FILE, PlanError, Worker, check_plan, micro_batch

from apportion.decision import Allocation
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

LOSS_TOL = 1e-4
GLOBAL_BATCH = 8
ITERATIONS = 4
WAIT_S = 90  # a hung group is killed and the test fails


def losses(jobdir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (jobdir / LOSSES_FILE).read_text().splitlines():
        rec = json.loads(line)
        out[rec["iteration"]] = rec["loss"]
    return out


def launch(workdir: Path, plan: ExecutionPlan, stop_at: int | None = None) -> Path:
    """Run a worker group for ``plan`` to completion (or ``stop_at``); fail on error or hang."""
    job = JobSpec("j", "gpt-tiny", GLOBAL_BATCH, ITERATIONS, plan.gpus)
    alloc = Allocation("j", "T4", plan.gpus, 1, plan, {"local-0": plan.gpus}, 1.0)
    spec = launch_spec(job, alloc, "resize", workdir, master_port=free_port(), stop_at=stop_at)
    ok = wait(spawn(spec), WAIT_S)
    logs = "\n".join((Path(spec.workdir) / f"rank{r}.log").read_text()[-1500:]
                     for r in range(plan.gpus))
    assert ok, f"group {plan.label()} failed or hung:\n{logs}"
    return Path(spec.workdir)


def run_one(jobdir: Path, stop_at: int | None = None) -> None:
    cfg = TrainConfig("j", "gpt-tiny", GLOBAL_BATCH, ITERATIONS, ExecutionPlan().as_dict(),
                      str(jobdir), stop_at=stop_at)
    assert Worker(cfg, 0, 1).run() == 0


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untouched single-process run every pipeline run is compared with."""
    d = tmp_path_factory.mktemp("single") / "j"
    run_one(d)
    return d


def assert_same_trajectory(got: Path, want: Path) -> None:
    a, b = losses(want), losses(got)
    assert sorted(b) == list(range(1, ITERATIONS + 1))
    for it in a:
        assert b[it] == pytest.approx(a[it], abs=LOSS_TOL), (it, a, b)


def assert_same_state(got: Path, want: Path) -> None:
    """Same keys in the same order as the single-process checkpoint, and the same values.

    Adam's first moment is compared too: Adam's update is nearly invariant to the gradient's
    scale, so losses alone would not catch a gradient off by a constant (a missing dp
    average or tied-embedding sum). The key biases are skipped: attention is invariant to
    them, so their gradient is float noise around zero in both runs.
    """
    a = ckpt.load(ckpt.job_checkpoint(want))
    b = ckpt.load(ckpt.job_checkpoint(got))
    assert a is not None and b is not None
    assert b.iteration == ITERATIONS and b.samples_seen == ITERATIONS * GLOBAL_BATCH
    assert list(b.model) == list(a.model)
    assert list(b.optimizer["state"]) == list(a.optimizer["state"])
    assert b.optimizer["param_groups"] == a.optimizer["param_groups"]
    for k, v in a.model.items():
        if k.endswith("attn.k.bias"):
            continue
        assert torch.allclose(b.model[k], v, atol=5e-4), k  # Adam amplifies near-zero noise
        m_a, m_b = a.optimizer["state"][k]["exp_avg"], b.optimizer["state"][k]["exp_avg"]
        assert float((m_a - m_b).abs().max()) <= 1e-3 * float(m_a.abs().max()) + 1e-12, k


# -- in-process: the stage split itself ------------------------------------------------------
@pytest.mark.parametrize("name", TRAINABLE)
def test_stages_compose_to_the_full_module(name: str) -> None:
    """The hand-built stages, run one after another, give the full module's output exactly,
    and their static shapes are the real ones."""
    net = build_net(name, 3)
    x, _ = batch(name, 3, 0, 4)
    want = net(x)
    layers = len(net.blocks)
    for stages in sorted({2, layers}):
        h = x
        seen: set[int] = set()
        for i, (lo, hi) in enumerate(split_blocks(layers, stages)):
            stage = StageModule(net, i, stages, lo, hi)
            seen.update(id(p) for p in stage.parameters())
            inp, out = stage_io(net.shape, 4, i, stages)
            assert (h.shape, h.dtype) == (inp.shape, inp.dtype)
            h = stage(h)
            assert (h.shape, h.dtype) == (out.shape, out.dtype)
            # static metadata wires the backward: activations must be marked as needing grad
            assert out.requires_grad and (i == 0 or inp.requires_grad)
        assert torch.equal(h, want)
        assert seen == {id(p) for p in net.parameters()}  # every parameter lives on a stage


def test_pipeline_refusals() -> None:
    with pytest.raises(PlanError, match="pipeline parallelism combined with tensor"):
        check_plan(ExecutionPlan(pp=2, tp=2), 4, "cpu")
    with pytest.raises(PlanError, match="pipeline parallelism combined with ZeRO"):
        check_plan(ExecutionPlan(dp=2, pp=2, zero_stage=1), 4, "cpu")
    with pytest.raises(PlanError, match="needs dp\\*tp\\*pp = 4 workers"):
        check_plan(ExecutionPlan(dp=2, pp=2), 2, "cpu")
    with pytest.raises(PlanError, match="not divisible by micro_batches=3"):
        micro_batch(8, ExecutionPlan(pp=2, micro_batches=3))
    with pytest.raises(PlanError, match="not divisible by micro_batches=4"):
        micro_batch(8, ExecutionPlan(dp=2, pp=2, accumulation=2, micro_batches=4))
    assert micro_batch(8, ExecutionPlan(dp=2, pp=2, micro_batches=4)) == 4
    with pytest.raises(PlanError, match="at least one block"):
        split_blocks(2, 3)
    assert split_blocks(5, 2) == [(0, 3), (3, 5)]


def test_a_refused_pipeline_plan_fails_before_training(tmp_path: Path) -> None:
    cfg = TrainConfig("j", "gpt-tiny", 8, 2, ExecutionPlan(pp=2, micro_batches=3).as_dict(),
                      str(tmp_path))
    with pytest.raises(PlanError, match="micro_batches=3"):
        Worker(cfg, 0, 2).run()  # refused before any process group is created


# -- real process groups ---------------------------------------------------------------------
def test_pp2_matches_the_single_process_run(tmp_path: Path, single: Path) -> None:
    """Two stages, 1F1B over 2 micro-batches: same losses and the same full-state checkpoint."""
    got = launch(tmp_path, ExecutionPlan(pp=2, micro_batches=2))
    assert_same_trajectory(got, single)
    assert_same_state(got, single)


def test_dp2_pp2_with_accumulation_matches_the_single_process_run(tmp_path: Path,
                                                                  single: Path) -> None:
    """Two replicas of a 2-stage pipeline (4 processes), 2 accumulation steps of 2 pipeline
    micro-batches each, with activation recomputation: gradients summed over the tied
    embedding, averaged over dp."""
    got = launch(tmp_path, ExecutionPlan(dp=2, pp=2, micro_batches=2, accumulation=2,
                                         checkpointing=True))
    assert_same_trajectory(got, single)
    assert_same_state(got, single)


def test_resume_across_pipeline_and_single_worker_plans(tmp_path: Path, single: Path) -> None:
    """pp=2 (1F1B) -> 1 worker -> pp=2 (GPipe: one micro-batch) keeps the loss trajectory."""
    jobdir = launch(tmp_path, ExecutionPlan(pp=2, micro_batches=2), stop_at=2)
    assert sorted(losses(jobdir)) == [1, 2]
    run_one(jobdir, stop_at=3)  # resumes a pipeline checkpoint on one worker
    launch(tmp_path, ExecutionPlan(pp=2, micro_batches=1))  # and back
    assert_same_trajectory(jobdir, single)
    plans = [json.loads(x)["plan"] for x in (jobdir / LOSSES_FILE).read_text().splitlines()]
    assert plans == ["dp1-tp1-pp2-mb2", "dp1-tp1-pp2-mb2", "dp1-tp1-pp1", "dp1-tp1-pp2-mb1"]
    assert_same_state(jobdir, single)
