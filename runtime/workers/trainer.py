"""The torch training worker: one process per rank, a plan, a constant global batch.

Launched as ``python -m apportion.runtime.workers.trainer CONFIG.json`` with the
torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; torchrun itself works too). The config (:class:`TrainConfig`)
names the catalog model, seed, global batch size, total iterations and the
execution plan; everything else is derived:

* the per-rank micro-batch is ``global_batch / (dp * accumulation)`` and rank
  ``r`` reads global samples ``it*B + r*B/dp + k*m ..`` of iteration ``it``,
  micro-step ``k``; the global batch is therefore the same samples whatever the
  worker count, and the averaged gradient is the same global mean;
* DP runs under DDP (gloo on CPU, nccl on CUDA); ZeRO-like sharding under FSDP
  (``fully_shard``), tensor parallelism with torch's column/row styles, pipeline
  parallelism (``pp > 1``, with dp replicas and ``micro_batches`` pipeline
  micro-batches per rank micro-batch) with ``torch.distributed.pipelining``
  (``runtime.workers.pipeline_parallel``), each where ``runtime.workers.parallel`` supports the
  plan; anything else (PP combined with TP or ZeRO, TP with ZeRO, offload on
  CPU) fails with a :class:`PlanError` naming what the backend cannot do. A
  plan is never silently changed;
* checkpointing (activation recomputation) is a flag on every block;
* a spilled plan (Hydra: the model larger than the device) trains shard by
  shard on one rank (``runtime.workers.spill_strategy``), each shard stepping
  its own optimizer; its checkpoints have the same layout as every other
  strategy's, so it resumes under any partition, spilled or whole.

Devices: with CUDA (and a backend other than gloo) each rank pins
``cuda:LOCAL_RANK`` (``torch.cuda.set_device``; device 0 when an engine shows
it one GPU), moves the model and every batch there and uses NCCL; otherwise
CPU and gloo. The optimiser (AdamW, Adam or SGD, learning rate, weight decay,
momentum, linear warm-up, gradient clipping) comes from the job's
``workload.train`` block.

The workload contract (``apportion.runtime.workload``) holds for this worker
too: it resumes from ``<checkpoint_dir>/checkpoint.pt``, checkpoints every
``checkpoint_every`` iterations or ``checkpoint_interval_s`` seconds
(whichever first; rank 0's clock decides and all ranks agree), and rank 0
appends one line per step to the progress file (``{"iteration": N, ...}``,
``"checkpoint": true`` after a save).

Stopping: the executor creates ``STOP`` in the job folder (or sends SIGTERM);
rank 0 reads it at each iteration boundary and all ranks agree by an
all-reduce, save an atomic checkpoint and exit 0. Fencing: when the job
folder's ``OWNER`` file names another launch, this group has been replaced
(its launcher died and a new one took the job over): every rank exits
without saving or reporting, so two groups never both write one job's state.
Rank 0 also keeps ``progress.json`` (atomic; state, error, launch id) and the
loss, wall time, forward time (where the strategy can separate it) and
optimizer time of every iteration in ``losses.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.workers.parallel import PlanError, Strategy, settle
from apportion.runtime.workers.pilot import OptimSpec
from apportion.runtime.workers.spill_strategy import SpillStrategy, spill_budget
from apportion.runtime.workers.strategies import wrap
from apportion.runtime.workers.torch_nets import batch, build_net
from apportion.runtime.workload import gradient_noise

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

STOP_FILE = "STOP"
OWNER_FILE = "OWNER"  # the launch id allowed to write this job folder
PROGRESS_FILE = "progress.json"
LOSSES_FILE = "losses.jsonl"
EXIT_FENCED = 3  # this group was replaced by a newer launch: exited without saving


class Fenced(RuntimeError):
    """The job folder belongs to a newer launch; this group must not write anything."""



def micro_batch(global_batch: int, plan: ExecutionPlan) -> int:
    """Per-rank micro-batch: the global batch split over DP ranks and accumulation steps.

    Under pipeline parallelism every rank micro-batch is further cut into
    ``plan.micro_batches`` equal pipeline micro-batches (equal, so their mean losses
    average to the micro-batch's mean loss), which must divide it too."""
    steps = plan.accumulation_steps  # one-stage plans: their micro-batches accumulate too
    parts = plan.dp * steps
    if global_batch % parts:
        raise PlanError(f"global batch {global_batch} is not divisible by dp*accumulation = "
                        f"{plan.dp}*{steps}; the global batch never changes, so "
                        "choose a plan that divides it")
    micro = global_batch // parts
    if plan.pp > 1 and (plan.micro_batches < 1 or micro % plan.micro_batches):
        raise PlanError(f"per-rank micro-batch {micro} (global batch {global_batch} / "
                        f"dp*accumulation) is not divisible by micro_batches="
                        f"{plan.micro_batches}; pipeline micro-batches must be equal, so choose "
                        "a plan that divides it")
    return micro


def check_plan(plan: ExecutionPlan, world: int, device: str) -> None:
    """Reject, with a reason, any plan this worker cannot run exactly as given.

    ``workload.plan_supported("builtin", ...)`` says the same before a round
    offers the plan; the messages here are the worker's own, more specific."""
    if plan.gpus != world:
        raise PlanError(f"plan {plan.label()} needs dp*tp*pp = {plan.gpus} workers, "
                        f"but {world} were launched")
    if plan.offload and device != "cpu":
        raise PlanError("plan asks for optimizer offload, which the torch worker does not "
                        "implement; run it through DeepSpeed (workload kind deepspeed)")
    if plan.offload and device == "cpu":
        raise PlanError("plan asks for optimizer offload, which moves state from GPU to host "
                        "memory; on the CPU backend there is no device memory to offload from")
    if plan.zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"ZeRO stage {plan.zero_stage} does not exist (0-3)")
    if plan.pp > 1 and plan.tp > 1:
        raise PlanError(f"plan {plan.label()}: pipeline parallelism combined with tensor "
                        "parallelism is not supported by the torch worker (each stage would need "
                        "its own TP mesh); the plan is not changed to fit, so choose tp=1 or pp=1 "
                        "or run it through DeepSpeed (runtime.workers.deepspeed_config)")
    if plan.pp > 1 and plan.zero_stage:
        raise PlanError(f"plan {plan.label()}: pipeline parallelism combined with ZeRO sharding "
                        "is not supported by the torch worker (its pipeline stages are not "
                        "FSDP-sharded); choose zero_stage=0 or pp=1")
    if plan.tp > 1 and plan.zero_stage:
        raise PlanError("tensor parallelism combined with ZeRO sharding is not supported by the "
                        "torch worker")
    if plan.spilled and (plan.gpus != 1 or plan.accumulation != 1 or plan.zero_stage):
        raise PlanError(f"plan {plan.label()}: a spilled plan trains shard by shard on one "
                        "GPU, one stage, without ZeRO or accumulation (each shard steps its own "
                        "optimizer in its backward unit)")


def select_device(backend: str) -> torch.device:
    """``cuda:LOCAL_RANK`` pinned with ``set_device`` when CUDA is usable, else the CPU."""
    if backend != "gloo" and torch.cuda.is_available():
        from apportion.runtime.workload import device_index
        idx = device_index(torch.cuda.device_count())
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def make_optimizer(params: Any, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The job's optimiser (``workload.train``): AdamW (default), Adam or SGD."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer != "adamw":
        raise ValueError(f"unknown optimizer {cfg.optimizer!r} (adamw, adam, sgd)")
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


class Worker:
    """One rank's training loop."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.dir = Path(cfg.workdir)
        self.ckpt_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else \
            self.dir / "checkpoint"
        self.progress_path = Path(cfg.progress_file) if cfg.progress_file else \
            self.dir / "progress.jsonl"
        self.plan = cfg.execution_plan
        self.torch_device = (torch.device("cuda") if torch.cuda.is_available()
                             and cfg.backend != "gloo" else torch.device("cpu"))
        self.device = self.torch_device.type
        self.stop_requested = False
        self.launch_wall = time.time()
        self.last_opt_s = 0.0
        self.last_ckpt_wall = time.monotonic()
        # the batch the job's iterations are counted in, and the samples consumed so far
        self.unit = cfg.job_batch_size or cfg.global_batch_size
        self.samples = 0
        self.noise: tuple[float, float] | None = None  # smoothed (grad_sqr, grad_var)

    @property
    def checkpoint_path(self) -> Path:
        return self.ckpt_dir / ckpt.CHECKPOINT_NAME

    # -- lifecycle -----------------------------------------------------------
    def run(self) -> int:
        check_plan(self.plan, self.world, self.device)
        self.micro = micro_batch(self.cfg.global_batch_size, self.plan)
        self._check_owner()
        self.torch_device = select_device(self.cfg.backend)
        if self.world > 1 and not dist.is_initialized():
            backend = self.cfg.backend if self.cfg.backend != "auto" else (
                "nccl" if self.device == "cuda" else "gloo")
            # a rank whose peers never come (its launcher died mid-launch) gives up in time
            wait = float(os.environ.get("APPORTION_RENDEZVOUS_TIMEOUT_S", "300"))
            dist.init_process_group(backend, rank=self.rank, world_size=self.world,
                                    timeout=timedelta(seconds=wait))
        base = build_net(self.cfg.model, self.cfg.seed)
        if not self.plan.spilled:  # a spilled model stays on the host: it exceeds the device
            base = base.to(self.torch_device)
        for blk in getattr(base, "blocks", []):
            blk.checkpointing = self.plan.checkpointing
        self.opt: torch.optim.Optimizer | None
        self.par: Strategy | SpillStrategy
        if self.plan.spilled:  # each shard steps its own optimizer (no whole-model one)
            self.par = self._spilled(base)
            self.opt = None
        else:
            self.par = wrap(base, self.plan, self.rank, self.world, self.micro)
            self.opt = make_optimizer(self.par.parameters(), self.cfg)
        state = ckpt.load(self.checkpoint_path)
        start = 0
        if state is not None:
            self.par.load_full_state(state.model, self.opt, state.optimizer)
            ckpt.set_rng_state(state.rng)
            start = state.iteration
            if self.cfg.job_batch_size:  # its batch is the round's to choose: samples count
                self.samples = state.samples_seen
                start = self.samples // self.unit
            else:
                expected = start * self.cfg.global_batch_size
                if state.samples_seen != expected:
                    raise RuntimeError(f"checkpoint has {state.samples_seen} samples seen, "
                                       f"expected {expected}: the global batch size changed")
        if not self.cfg.job_batch_size:
            self.samples = start * self.cfg.global_batch_size
        self.resumed_from = start
        return self._loop(start)

    def _spilled(self, base: torch.nn.Module) -> SpillStrategy:
        """The spilled strategy for ``base``: the job's optimiser as an element-wise spec
        (a global-norm clip is not element-wise: refused), the pilot run on the job's first
        batch under the plan's device-memory budget."""
        cfg = self.cfg
        if cfg.grad_clip > 0:
            raise PlanError(f"plan {self.plan.label()}: gradient clipping by the global norm "
                            "needs every shard's gradient before any shard steps; a spilled "
                            "plan steps each shard in its own backward unit (drop grad_clip)")
        optim = OptimSpec(cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay)
        sample = batch(cfg.model, cfg.seed, 0, cfg.global_batch_size)
        return SpillStrategy(base, self.plan, optim, sample, self.torch_device,
                             spill_budget(self.plan, self.torch_device))

    def _lr_at(self, it: int) -> float:
        w = self.cfg.warmup_iterations
        return self.cfg.lr * min(1.0, (it + 1) / w) if w > 0 else self.cfg.lr

    def _loop(self, start: int) -> int:
        cfg = self.cfg
        end = cfg.iterations if cfg.stop_at is None else min(cfg.iterations, cfg.stop_at)
        times: list[float] = []
        first_step_wall = None
        it = start
        self._report("running", it, None, None, first_step_wall)
        self._progress_line(it, checkpoint=start > 0, resumed=True)
        while it < end:
            stop, save = self._flags(it)
            if stop:
                break
            if save and it > start:
                self._save(it)
            t0 = time.perf_counter()
            loss = self._step(it)
            times.append(time.perf_counter() - t0)
            self.samples += cfg.global_batch_size
            it = self.samples // self.unit if cfg.job_batch_size else it + 1
            if first_step_wall is None:
                first_step_wall = time.time()
            recent = times[-5:]
            if self.rank == 0:
                with open(self.dir / LOSSES_FILE, "a") as fh:
                    # per-step wall time and its optimizer part: what estimators fit on
                    fh.write(json.dumps({"iteration": it, "loss": loss, "world": self.world,
                                         "plan": self.plan.label(), "time_s": times[-1],
                                         "fwd_s": self.par.fwd_s, "opt_s": self.last_opt_s,
                                         "launch_id": cfg.launch_id,
                                         "wall": time.time()}) + "\n")
                stats = {} if self.noise is None else {"grad_sqr": max(0.0, self.noise[0]),
                                                       "grad_var": max(0.0, self.noise[1])}
                self._progress_line(it, loss=loss, iter_time_s=sum(recent) / len(recent),
                                    **stats)
            self._report("running", it, sum(recent) / len(recent), loss, first_step_wall)
        if self._fenced():
            raise Fenced(f"job folder now belongs to launch {self._owner()!r}")
        self._save(it)
        done = it >= cfg.iterations
        recent = times[-5:]
        self._report("finished" if done else "checkpointed", it,
                     sum(recent) / len(recent) if recent else None, None, first_step_wall)
        return 0

    def _step(self, it: int) -> float:
        B, plan, m = self.cfg.global_batch_size, self.plan, self.micro
        offset = self.samples  # it * B where the batch never changes
        if isinstance(self.par, SpillStrategy):
            x, y = batch(self.cfg.model, self.cfg.seed, offset, B)  # on the host: units move it
            return self.par.step(x, y, self._lr_at(it))
        assert self.opt is not None  # every other strategy has the whole model's optimizer
        dp_rank = self.par.dp_rank
        self.par.fwd_s = 0.0
        self.opt.zero_grad(set_to_none=True)
        for g in self.opt.param_groups:
            g["lr"] = self._lr_at(it)
        total = 0.0
        steps = plan.accumulation_steps
        if self.cfg.gradient_stats and type(self.par) is Strategy:
            total = self._measured_step(offset + dp_rank * (B // plan.dp), steps, m)
        else:
            for k in range(steps):
                start = offset + dp_rank * (B // plan.dp) + k * m
                x, y = batch(self.cfg.model, self.cfg.seed, start, m)
                x, y = x.to(self.torch_device), y.to(self.torch_device)
                last = k == steps - 1
                loss = self.par.forward_backward(x, y, scale=1.0 / steps, sync=last)
                total += loss / steps
        if self.cfg.grad_clip > 0:
            params = [p for p in self.par.parameters() if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        settle(self.torch_device)  # the optimizer's time is its own, not the queued backward's
        o0 = time.perf_counter()
        self.opt.step()
        settle(self.torch_device)
        self.last_opt_s = time.perf_counter() - o0
        return self.par.global_mean(total)

    def _measured_step(self, start: int, steps: int, m: int) -> float:
        """The step's forward-backward passes, measuring the gradient noise on the way
        (data-parallel plans; :func:`~apportion.runtime.workload.gradient_noise`): the first
        pass's gradient is this rank's alone (no synchronisation yet), over ``m1`` samples;
        after the last, the gradient is the global mean over the global batch. A step of one
        pass per rank is cut in two halves for it (the same samples and mean gradient). The
        squared norms give ``(grad_sqr, grad_var)``, smoothed over steps (an exponential
        average, as Pollux's adaptdl keeps them)."""
        B = self.cfg.global_batch_size
        pieces = [(start + k * m, m) for k in range(steps)]
        if steps == 1 and m >= 2:
            pieces = [(start, m // 2), (start + m // 2, m - m // 2)]
        total, small = 0.0, None
        for k, (first, size) in enumerate(pieces):
            x, y = batch(self.cfg.model, self.cfg.seed, first, size)
            x, y = x.to(self.torch_device), y.to(self.torch_device)
            last = k == len(pieces) - 1
            share = size / m / steps  # the piece's part of this rank's mean over its samples
            loss = self.par.forward_backward(x, y, scale=share, sync=last)
            total += loss * share
            if k == 0 and not last:
                small = self._grad_sqr() / share ** 2
        if small is None:  # one sample a rank: nothing smaller to compare with
            return total
        if self.world > 1:  # every rank's first piece: their mean is a steadier estimate
            t = torch.tensor([small], device=self.torch_device)
            dist.all_reduce(t)
            small = float(t.item()) / self.world
        sqr, var = gradient_noise(small, pieces[0][1], self._grad_sqr(), B)
        a = 0.9 if self.noise is not None else 0.0
        prev = self.noise or (0.0, 0.0)
        self.noise = (a * prev[0] + (1 - a) * sqr, a * prev[1] + (1 - a) * var)
        return total

    def _grad_sqr(self) -> float:
        """The squared norm of the gradients the parameters hold now."""
        return float(sum(float(p.grad.detach().double().pow(2).sum())
                         for p in self.par.parameters() if p.grad is not None))

    # -- stop, save, fence, report ------------------------------------------------
    def _owner(self) -> str | None:
        try:
            return (self.dir / OWNER_FILE).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _fenced(self, every_rank: bool = False) -> bool:
        """Another launch owns the folder (only checked when this group has a launch id; by
        rank 0 inside the loop, which then tells the others)."""
        if not self.cfg.launch_id or (self.rank != 0 and not every_rank):
            return False
        owner = self._owner()
        return owner is not None and owner != self.cfg.launch_id

    def _check_owner(self) -> None:
        """Before any collective: every rank reads the owner itself (none may wait on a rank
        that already left)."""
        if self._fenced(every_rank=True):
            raise Fenced(f"job folder belongs to launch {self._owner()!r}, not "
                         f"{self.cfg.launch_id!r}")

    def _flags(self, it: int) -> tuple[bool, bool]:
        """(stop, checkpoint now), decided by rank 0 and agreed by every rank; a fenced group
        raises :class:`Fenced` on every rank."""
        cfg = self.cfg
        stop = fenced = save = False
        if self.rank == 0:
            stop = self.stop_requested or (self.dir / STOP_FILE).exists()
            fenced = self._fenced()
            save = bool((cfg.checkpoint_every and it % cfg.checkpoint_every == 0) or (
                cfg.checkpoint_interval_s and
                time.monotonic() - self.last_ckpt_wall >= cfg.checkpoint_interval_s))
        stop = stop or self.stop_requested
        if self.world > 1:
            flag = torch.tensor([float(stop), float(save), float(fenced)],
                                device=self.torch_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop, save, fenced = (bool(v > 0) for v in flag.tolist())
        if fenced:
            raise Fenced(f"job folder now belongs to launch {self._owner()!r}")
        return stop, save

    def _should_stop(self) -> bool:
        return self._flags(-1)[0]

    def _save(self, it: int) -> None:
        model_sd, opt_sd = self.par.full_state(self.opt)  # collective under FSDP/TP
        if self.rank == 0:
            ckpt.save(self.checkpoint_path, ckpt.TrainState(
                it, self.samples, model_sd, opt_sd, ckpt.rng_state(),
                {"plan": self.plan.as_dict(), "world": self.world, "job": self.cfg.job,
                 "launch_id": self.cfg.launch_id}))
            self._progress_line(it, checkpoint=True)
        if self.world > 1:
            dist.barrier()
        self.last_ckpt_wall = time.monotonic()

    def _progress_line(self, it: int, checkpoint: bool = False, **fields: Any) -> None:
        """The contract's progress file: one JSON line per step, rank 0 only."""
        if self.rank != 0:
            return
        rec: dict[str, Any] = {"iteration": it, "launch_id": self.cfg.launch_id,
                               "wall": time.time(), **fields}
        if checkpoint:
            rec["checkpoint"] = True
        with open(self.progress_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")

    def _report(self, state: str, it: int, iter_time: float | None, loss: float | None,
                first_step_wall: float | None, error: str | None = None) -> None:
        if self.rank != 0:
            return
        ckpt.write_json(self.dir / PROGRESS_FILE, {
            "job": self.cfg.job, "state": state, "iterations_done": it,
            "iterations": self.cfg.iterations, "iter_time_s": iter_time, "loss": loss,
            "world": self.world, "plan": self.plan.label(), "launch_wall": self.launch_wall,
            "first_step_wall": first_step_wall, "resumed_from": getattr(self, "resumed_from", 0),
            "updated_wall": time.time(), "pid": os.getpid(), "error": error,
            "launch_id": self.cfg.launch_id,
            **({} if self.noise is None else {"grad_sqr": max(0.0, self.noise[0]),
                                               "grad_var": max(0.0, self.noise[1])})})


#: the signal on which a built-in worker dumps its threads' stacks to its stderr
STACKS_SIGNAL = signal.SIGUSR1


#: workers a host process ran (:func:`run_worker`), kept so that none is torn down in it
_KEPT: list[Any] = []


def run_worker(config_path: str, rank: int, world: int) -> int:
    """Run one rank in this process (no signal handlers: for hosts such as Ray actors).

    The worker is kept referenced after it returns: a done rank was seen to hang in the
    teardown of the trainer's objects (:func:`leave`), which a worker process skips with
    ``os._exit``; a host cannot, and the executor ends the host (it kills the actor)."""
    cfg = TrainConfig.load(config_path)
    worker = Worker(cfg, rank, world)
    _KEPT.append(worker)
    try:
        return worker.run()
    except Fenced:
        return EXIT_FENCED
    except Exception as exc:
        if rank == 0:
            worker._report("failed", getattr(worker, "resumed_from", 0), None, None, None,
                           f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Train one rank. ``exiting``: the process ends when this returns (a worker), so stop
    signals stay ignored from the end of training on; otherwise (a caller running it
    in-process) the caller's own signal handlers are put back."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m apportion.runtime.workers.trainer CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("APPORTION_LOG", "WARNING"), stream=sys.stderr)
    if exiting:  # a worker process: no torch.load in it may unpickle code
        ckpt.force_weights_only()
    cfg = TrainConfig.load(args[0])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    worker = Worker(cfg, rank, world)

    def on_term(signum: int, frame: Any) -> None:  # checkpoint at the next iteration boundary
        worker.stop_requested = True

    previous = (signal.signal(signal.SIGTERM, on_term), signal.signal(signal.SIGINT, on_term))
    if exiting:  # a worker: SIGUSR1 writes every thread's stack to its stderr (the executor
        # asks before it kills a group that hangs after its final checkpoint)
        import faulthandler

        faulthandler.register(STACKS_SIGNAL, all_threads=True)
    code = 1
    try:
        code = worker.run()
    except Fenced as exc:
        print(f"rank {rank}: fenced, exiting without saving: {exc}", file=sys.stderr)
        code = EXIT_FENCED
    except Exception as exc:  # noqa: BLE001 - any failure: report, then fail the process: the executor marks the job failed
        msg = f"{type(exc).__name__}: {exc}"
        print(f"rank {rank}: {traceback.format_exc()}\nrank {rank}: {msg}", file=sys.stderr)
        if rank == 0:
            worker._report("failed", getattr(worker, "resumed_from", 0), None, None, None, msg)
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # done: a stop signal still in flight (ranks are signalled one by one) must not kill
        # a rank in the interpreter's teardown, where the default action is back. Only in a
        # worker: an ignored SIGTERM would leak into a caller that ran main() in-process, and
        # every child it starts would inherit it (unstoppable pool workers)
        if exiting:
            from apportion.runtime.workload import ignore_stop_signals

            ignore_stop_signals()
        else:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    if exiting:
        leave(code)
    return code


def leave(code: int) -> None:
    """End a worker process now, before this function's objects are torn down. Why: a rank
    of a two-rank gloo group, done (its final checkpoint saved, its process group destroyed),
    hung in the teardown of the trainer's frame as ``main`` returned — its stack, dumped on
    ``STACKS_SIGNAL``, was the caller's line and a native thread with no Python frame (the
    local executor's resize test under load, 2 of about 100 runs). Everything a
    worker leaves is already on disk (the checkpoint, the status, the progress lines)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(exiting=True))
