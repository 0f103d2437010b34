"""The built-in trainer runs a spilled plan (Hydra): the job's catalog model cut by the pilot
run under the plan's device-memory budget and trained shard by shard, with the whole worker
contract (progress lines, checkpoints a resumed run continues from exactly).

On the CPU the "device memory" is the budget the plan carries (``spill_budget_mib``); each
budget here is chosen below what the model needs whole, so the pilot really cuts it.
Spilled units run the same kernels as whole training on the same values (a tied parameter's
two gradients are summed once, in either order: IEEE addition commutes), so the losses
must be *equal*, not close.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.workers.pilot import OptimSpec
from apportion.runtime.workers.spill import SpillJob, SpillTrainer, shared_parameters
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.workers.trainer import LOSSES_FILE, PlanError, Worker
from apportion.runtime.workload import plan_supported

from apportion.plans import ExecutionPlan


def _run(workdir: Path, model: str, iterations: int, plan: ExecutionPlan,
         stop_at: int | None = None, **train: object) -> list[float]:
    cfg = TrainConfig("j", model, 8, iterations, plan.as_dict(), str(workdir), seed=3,
                      stop_at=stop_at, **train)  # type: ignore[arg-type]
    assert Worker(cfg, 0, 1).run() == 0
    return [json.loads(x)["loss"] for x in (workdir / LOSSES_FILE).read_text().splitlines()]


def _spill(mib: int) -> ExecutionPlan:
    return ExecutionPlan(spill_shards=2, spill_budget_mib=mib)


def test_a_spilled_plan_trains_the_catalog_model_as_whole_training_does(tmp_path: Path) -> None:
    """gpt-tiny (its output layer tied to its embedding) under 12 MiB: the pilot cuts it into
    several shards (the embedding and the head apart), AdamW with weight decay and a warm-up
    schedule, and every loss equals the whole model's."""
    train = {"weight_decay": 0.01, "warmup_iterations": 3, "lr": 3e-3}
    whole = _run(tmp_path / "whole", "gpt-tiny", 5, ExecutionPlan(), **train)
    spilled = _run(tmp_path / "spill", "gpt-tiny", 5, _spill(12), **train)
    assert spilled == whole
    state = ckpt.load(ckpt.job_checkpoint(tmp_path / "spill"))
    ref = ckpt.load(ckpt.job_checkpoint(tmp_path / "whole"))
    assert state is not None and ref is not None and state.iteration == 5
    assert state.model.keys() == ref.model.keys()  # the same layout as every strategy writes
    assert all(torch.equal(state.model[k], ref.model[k]) for k in ref.model)
    assert state.optimizer["state"].keys() == ref.optimizer["state"].keys()


def test_a_spilled_job_resumes_under_another_partition_with_the_same_losses(
        tmp_path: Path) -> None:
    """Checkpointed after 3 of 6 iterations under 12 MiB, resumed under 30 MiB (fewer,
    larger shards: another GPU type's budget), then whole: one trajectory."""
    straight = _run(tmp_path / "a", "vit-tiny", 6, _spill(12))
    _run(tmp_path / "b", "vit-tiny", 6, _spill(12), stop_at=3)
    _run(tmp_path / "b", "vit-tiny", 6, _spill(30), stop_at=5)
    resumed = _run(tmp_path / "b", "vit-tiny", 6, ExecutionPlan())
    assert resumed == straight and len(resumed) == 6


def test_a_model_that_fits_no_shard_is_refused_by_name(tmp_path: Path) -> None:
    """One block of vit-tiny trains in about 9 MB at batch 8: no cut fits 3 MiB."""
    cfg = TrainConfig("j", "vit-tiny", 8, 2, _spill(3).as_dict(), str(tmp_path))
    with pytest.raises(PlanError, match="cannot be spilled under"):
        Worker(cfg, 0, 1).run()
    clip = TrainConfig("j", "vit-tiny", 8, 2, _spill(12).as_dict(), str(tmp_path), grad_clip=1.0)
    with pytest.raises(PlanError, match="clipping"):
        Worker(clip, 0, 1).run()


def test_only_the_builtin_trainer_runs_spilled_plans() -> None:
    plan = _spill(12)
    assert plan_supported("builtin", plan) is None
    for kind in ("torchrun", "deepspeed", "jax"):
        why = plan_supported(kind, plan)
        assert why is not None and "built-in trainer" in why and kind in why
    wide = ExecutionPlan(dp=2, spill_shards=2, spill_budget_mib=12)
    assert "one GPU" in (plan_supported("builtin", wide) or "")
    assert plan_supported("builtin", ExecutionPlan()) is None
    assert "spill_shards" not in ExecutionPlan().as_dict()  # old plans' JSON is unchanged
    assert plan.label().endswith("spill2") and ExecutionPlan(**plan.as_dict()) == plan


def test_a_parameter_two_shards_share_is_stepped_once() -> None:
    """SpillTrainer on a chain whose last layer shares the first one's weight: one owner
    steps it with both gradients; without that, two copies would drift apart."""
    torch.manual_seed(0)
    first, mid, last = torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6)
    last.weight = first.weight
    layers = [first, mid, last]
    loss = torch.nn.MSELoss()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)) for _ in range(3)]
    optim = OptimSpec("adam", 1e-2)
    whole = torch.nn.Sequential(*copy.deepcopy(layers))
    opt = optim.make(whole.parameters())
    ref = []
    for x, y in batches * 2:
        opt.zero_grad()
        out = loss(whole(x), y)
        out.backward()
        opt.step()
        ref.append(out.item())
    job = SpillJob("tied", copy.deepcopy(layers), [0, 1, 2], loss, batches, 2, optim)
    assert len(shared_parameters(job.shard_modules())) == 1
    report = SpillTrainer([job], workers=0).train()
    assert report.losses["tied"] == ref
