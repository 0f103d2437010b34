"""The workload contract: what every rank of a job is given, and small helpers for user scripts.

A job's ``workload`` (see :class:`apportion.jobs.Workload`) is apportion's
built-in trainer or the user's own command. Every rank of every executor
(local, Slurm, Ray, Kubernetes) gets the same environment:

* torchrun's variables: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
* apportion's: ``APPORTION_JOB_ID``, ``APPORTION_PLAN`` (JSON with at least
  dp, tp, pp, micro_batches, zero, offload, accumulation, checkpointing),
  ``APPORTION_ITERATIONS`` (the target), ``APPORTION_CHECKPOINT_DIR`` and
  ``APPORTION_PROGRESS_FILE`` (rank 0 appends one JSON line per step with at
  least ``{"iteration": N}``).

A workload resumes from its checkpoint directory, checkpoints and exits 0 on
SIGTERM within the grace period, and exits 0 when it reaches the target.
Beyond the contract's minimum every rank also gets ``APPORTION_GLOBAL_BATCH_SIZE``,
``APPORTION_CHECKPOINT_EVERY`` / ``APPORTION_CHECKPOINT_INTERVAL_S`` (the
periodic checkpoint policy), ``APPORTION_LAUNCH_ID`` and, for kind
``deepspeed``, ``APPORTION_DEEPSPEED_CONFIG``; a progress line with
``"checkpoint": true`` says a checkpoint of that iteration is on disk (how
far a killed group's job is rolled back).

Three parts: the environment (:func:`job_env`, :func:`rank_env`,
:func:`ranks_by_node`), which plans each kind runs (:func:`plan_supported`),
helpers for scripts (:func:`plan`, :func:`iterations`, :func:`checkpoint_dir`,
:func:`stop_requested`, :class:`CheckpointPolicy`, :func:`report_progress`,
:func:`gradient_noise`,
:func:`init_jax_distributed`, ...) and the executors' reader
(:func:`read_progress_since`). This module is imported inside user training
scripts, so it imports nothing heavy (no torch, no numpy) at module level.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from apportion.jobs import WORKLOAD_KINDS

ENV_JOB_ID = "APPORTION_JOB_ID"
ENV_PLAN = "APPORTION_PLAN"
ENV_ITERATIONS = "APPORTION_ITERATIONS"
ENV_CHECKPOINT_DIR = "APPORTION_CHECKPOINT_DIR"
ENV_PROGRESS_FILE = "APPORTION_PROGRESS_FILE"
# added by apportion beyond the contract's minimum (a workload may ignore them)
ENV_LAUNCH_ID = "APPORTION_LAUNCH_ID"  # this worker group's launch id (per-store monotonic)
ENV_CHECKPOINT_EVERY = "APPORTION_CHECKPOINT_EVERY"  # checkpoint every N iterations (0: off)
ENV_CHECKPOINT_INTERVAL_S = "APPORTION_CHECKPOINT_INTERVAL_S"  # ... or every T seconds (0: off)
ENV_DEEPSPEED_CONFIG = "APPORTION_DEEPSPEED_CONFIG"  # kind deepspeed: DeepSpeed JSON for the plan
ENV_GPU_TYPE = "APPORTION_GPU_TYPE"
# the global batch this launch runs: the job's own, or the one the round chose for it (a job
# with a batch_range)
ENV_GLOBAL_BATCH = "APPORTION_GLOBAL_BATCH_SIZE"
# every rank starts with torch's loads forced to weights only (a pickle planted in the
# job's predictable checkpoint folder never runs); a user's own command that must load
# pickled objects of its own sets it to "0" in its workload env
ENV_TORCH_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
PROGRESS_FILE_NAME = "progress.jsonl"
CHECKPOINT_DIR_NAME = "checkpoint"



def plan_json(plan: Any) -> str:
    """``APPORTION_PLAN``: the plan's fields, plus the contract's short names."""
    d = dict(plan.as_dict())
    d.setdefault("zero", d.get("zero_stage", 0))
    return json.dumps(d, sort_keys=True)


def job_env(job_id: str, plan: Any, iterations: int, jobdir: str | Path, world: int,
            master_addr: str, master_port: int, *, launch_id: str = "",
            checkpoint_every: int = 0, checkpoint_interval_s: float = 0.0,
            global_batch_size: int | None = None) -> dict[str, str]:
    """The variables every rank of one launch shares (paths inside the job's own folder)."""
    d = Path(jobdir)
    env = {"WORLD_SIZE": str(world), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
           ENV_JOB_ID: job_id, ENV_PLAN: plan_json(plan), ENV_ITERATIONS: str(int(iterations)),
           ENV_CHECKPOINT_DIR: str(d / CHECKPOINT_DIR_NAME),
           ENV_PROGRESS_FILE: str(d / PROGRESS_FILE_NAME),
           ENV_CHECKPOINT_EVERY: str(int(checkpoint_every)),
           ENV_CHECKPOINT_INTERVAL_S: f"{float(checkpoint_interval_s):g}"}
    if launch_id:
        env[ENV_LAUNCH_ID] = launch_id
    if global_batch_size is not None:
        env[ENV_GLOBAL_BATCH] = str(int(global_batch_size))
    return env


def rank_env(rank: int, local_rank: int, local_world: int) -> dict[str, str]:
    """The variables that differ between ranks."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world)}


def ranks_by_node(placement: dict[str, int]) -> list[tuple[str, int, int, int]]:
    """``(node, rank, local_rank, local_world)`` for every rank of a placement, rank 0 first.

    Ranks are numbered node by node in the placement's order, so rank 0 is on
    the first node (whose address is ``MASTER_ADDR``) and local ranks count
    from 0 on every node.
    """
    out, r = [], 0
    for node, k in placement.items():
        for local in range(int(k)):
            out.append((node, r, local, int(k)))
            r += 1
    return out


# -- which plans a workload kind runs -------------------------------------------------------
def plan_supported(kind: str, plan: Any, device: str = "cpu") -> str | None:
    """None when a workload of ``kind`` runs ``plan`` exactly as given, else the reason.

    The round for an executor offers only plans its workloads accept (see
    ``RoundConfig.plan_filter``); the worker still checks again and fails with
    the reason rather than change a plan. What each kind runs:

    * ``builtin`` (the torch worker): DP, ZeRO-like sharding (FSDP), TP,
      pipeline (with DP replicas), accumulation, recomputation; not PP with TP
      or ZeRO, not TP with ZeRO; offload only where there is device memory;
    * ``torchrun``: what the contract's torch example honours: DP, FSDP and TP
      (one pipeline stage, no offload);
    * ``deepspeed``: DP with ZeRO 0-3 (offload needs ZeRO >= 1 and a GPU);
      one stage, no TP;
    * ``jax``: DP x TP shardings on a device mesh (one stage, no ZeRO, no offload).

    A spilled plan (Hydra: the model trained shard by shard, larger than the
    device) runs in the built-in trainer only, on one GPU without ZeRO, offload
    or accumulation; the other kinds run the user's own program, which apportion
    cannot split into shards: refused by name.
    """
    p = plan.as_dict() if hasattr(plan, "as_dict") else dict(plan)
    dp, tp, pp = int(p.get("dp", 1)), int(p.get("tp", 1)), int(p.get("pp", 1))
    zero = int(p.get("zero_stage", p.get("zero", 0)))
    offload = bool(p.get("offload", False))
    if kind not in WORKLOAD_KINDS:
        return f"unknown workload kind {kind!r}"
    if min(dp, tp, pp) < 1:
        return "parallel degrees must be positive"
    if zero not in (0, 1, 2, 3):
        return f"ZeRO stage {zero} does not exist (0-3)"
    if int(p.get("spill_shards", 0)) > 0:
        return _spill_supported(kind, dp * tp * pp, zero, offload, int(p.get("accumulation", 1)))
    if offload and device != "cuda":
        return "optimizer offload moves state from device to host memory; there is no GPU"
    if kind == "builtin":
        if pp > 1 and tp > 1:
            return "the torch worker does not combine pipeline and tensor parallelism"
        if pp > 1 and zero:
            return "the torch worker does not combine pipeline parallelism and ZeRO sharding"
        if tp > 1 and zero:
            return "the torch worker does not combine tensor parallelism and ZeRO sharding"
        if offload:
            return "the torch worker does not offload optimizer state"
        return None
    if pp > 1:
        return f"a {kind} workload runs one pipeline stage (pp=1)"
    if kind == "torchrun":
        if tp > 1 and zero:
            return "the torchrun contract's plans: DP, FSDP or TP (not TP with ZeRO)"
        if offload:
            return "a torchrun workload is not asked to offload"
        return None
    if kind == "deepspeed":
        if tp > 1:
            return "DeepSpeed workloads run DP/ZeRO plans (tp=1)"
        if offload and not zero:
            return "DeepSpeed offload needs ZeRO stage >= 1"
        return None
    if zero or offload:  # jax
        return "JAX workloads run DP x TP shardings (no ZeRO stage, no offload)"
    return None


def _spill_supported(kind: str, gpus: int, zero: int, offload: bool,
                     accumulation: int) -> str | None:
    """Why a workload of ``kind`` cannot run a spilled plan of this shape, or None."""
    if kind != "builtin":
        return (f"a {kind} workload runs the user's own program, which apportion cannot train "
                "shard by shard: spilled plans (Hydra) run in the built-in trainer only")
    if gpus != 1 or zero or offload or accumulation != 1:
        return ("the built-in trainer spills on one GPU, one stage, without ZeRO, offload or "
                "accumulation (each shard steps its own optimizer in its backward unit)")
    return None


def cuda_present() -> bool:
    """Whether this host has an NVIDIA GPU, without importing torch (cheap, for the round)."""
    return os.path.exists("/dev/nvidia0") or os.path.isdir("/proc/driver/nvidia/gpus")


# -- inside a workload ----------------------------------------------------------------------
def plan() -> dict[str, Any]:
    """The execution plan this launch runs (``APPORTION_PLAN``); DP-only when unset."""
    raw = os.environ.get(ENV_PLAN)
    return json.loads(raw) if raw else {"dp": int(os.environ.get("WORLD_SIZE", "1")), "tp": 1,
                                        "pp": 1, "micro_batches": 1, "zero": 0, "offload": False,
                                        "accumulation": 1, "checkpointing": False}


def iterations() -> int:
    """The job's target iteration count (``APPORTION_ITERATIONS``)."""
    return int(os.environ[ENV_ITERATIONS])


def global_batch_size(default: int | None = None) -> int:
    """The global batch this launch runs (``APPORTION_GLOBAL_BATCH_SIZE``): the job's own,
    constant across every plan, unless the job gives a ``batch_range`` and the round chose
    another for this allocation."""
    raw = os.environ.get(ENV_GLOBAL_BATCH)
    if raw is None:
        if default is None:
            raise KeyError(ENV_GLOBAL_BATCH)
        return default
    return int(raw)


def checkpoint_dir() -> Path:
    """Where to save and resume from (created if missing)."""
    p = Path(os.environ.get(ENV_CHECKPOINT_DIR, "checkpoint"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def device_index(visible: int) -> int:
    """The CUDA device this rank pins, given how many it sees.

    ``LOCAL_RANK`` when the process sees its node's GPUs; 0 when an engine
    already narrowed it to one (Ray, Slurm task binding, a Kubernetes pod).
    """
    lr = local_rank()
    return 0 if visible == 1 else lr % max(1, visible)


_STOP = {"requested": False, "installed": False}


def _on_term(signum: int, frame: Any) -> None:
    _STOP["requested"] = True


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGINT from now on (a rank that is done and exiting)."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_requested(install: bool = False) -> bool:
    """True once SIGTERM (or SIGINT) arrived: checkpoint at the next step boundary and exit 0.

    The first call installs the handlers (call it once before the loop);
    ``install=True`` installs them again (after a library such as
    ``jax.distributed`` replaced them with its own). At exit the signals are
    ignored: the interpreter's teardown restores the default action, and a
    stop that reaches a rank after its group agreed to stop (ranks are
    signalled one by one) would otherwise kill a rank that already
    checkpointed, and its exit would read as a failure.
    """
    if install or not _STOP["installed"]:
        import atexit
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_term)
            signal.signal(signal.SIGINT, _on_term)
            if not _STOP["installed"]:
                atexit.register(ignore_stop_signals)
        _STOP["installed"] = True
    return bool(_STOP["requested"])


class CheckpointPolicy:
    """Periodic checkpoints: every ``every`` iterations or ``interval_s`` seconds (0: off).

    ``due(it)`` is rank-local (the clock differs between ranks); a multi-rank
    script agrees on it with one all-reduce (MAX) before saving collectively.
    """

    def __init__(self, every: int | None = None, interval_s: float | None = None) -> None:
        self.every = int(os.environ.get(ENV_CHECKPOINT_EVERY, "0")) if every is None else every
        self.interval_s = (float(os.environ.get(ENV_CHECKPOINT_INTERVAL_S, "0"))
                           if interval_s is None else interval_s)
        self.last_wall = time.monotonic()

    def due(self, iteration: int) -> bool:
        if self.every > 0 and iteration % self.every == 0:
            return True
        return self.interval_s > 0 and time.monotonic() - self.last_wall >= self.interval_s

    def saved(self) -> None:
        self.last_wall = time.monotonic()


def report_progress(iteration: int, checkpoint: bool = False, **fields: Any) -> None:
    """Rank 0 appends ``{"iteration": N, ...}`` to the progress file; other ranks do nothing.

    ``checkpoint=True`` says a checkpoint holding iteration N is on disk (call
    it after the save): that is how far a killed group's job is rolled back.
    ``grad_sqr=`` and ``grad_var=`` report the gradient statistics (the squared norm of the
    true gradient, the variance of one sample's gradient; :func:`gradient_stats`): the
    scheduler fits the job's statistical efficiency from them and chooses its batch where
    the job gives a ``batch_range``.
    """
    if rank() != 0:
        return
    path = os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return
    rec: dict[str, Any] = {"iteration": int(iteration), **fields}
    if checkpoint:
        rec["checkpoint"] = True
    line = json.dumps(rec, sort_keys=True)
    with open(path, "a", encoding="utf-8") as fh:  # one write per line: readers see whole lines
        fh.write(line + "\n")


def init_jax_distributed() -> None:
    """``jax.distributed.initialize`` from the contract's variables (one process per rank)."""
    import jax
    if world_size() > 1:
        jax.distributed.initialize(
            coordinator_address=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            num_processes=world_size(), process_id=rank())


# -- the executor's side ----------------------------------------------------------------------
def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The last complete progress line of a workload (executors read this), or None."""
    return read_progress_since(path).last


class ProgressView:
    """What one launch reported: its last line, the last line that marked a checkpoint, and
    the last gradient statistics (``grad_sqr``, ``grad_var``) a line carried."""

    def __init__(self, last: dict[str, Any] | None = None,
                 checkpoint: dict[str, Any] | None = None, lines: int = 0,
                 grad_stats: tuple[float, float] | None = None) -> None:
        self.last, self.checkpoint, self.lines = last, checkpoint, lines
        self.grad_stats = grad_stats

    @property
    def iteration(self) -> int | None:
        return None if self.last is None else int(self.last["iteration"])

    @property
    def checkpoint_iteration(self) -> int | None:
        return None if self.checkpoint is None else int(self.checkpoint["iteration"])


def read_progress_since(path: str | Path, offset: int = 0,
                        window: int = 1 << 20) -> ProgressView:
    """Complete progress lines after byte ``offset`` (where this launch began): the last one,
    the last checkpoint line, and how many (counted within the last ``window`` bytes)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(offset, size - window)
            fh.seek(start)
            tail = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return ProgressView()
    lines = tail.split("\n")[:-1]  # the part after the last newline is not complete yet
    if start > offset and lines:
        lines = lines[1:]  # began mid-line
    view = ProgressView()
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("iteration"), int) or isinstance(
                rec.get("iteration"), bool):
            continue
        view.lines += 1
        view.last = rec
        if rec.get("checkpoint") is True:
            view.checkpoint = rec
        stats = gradient_stats(rec)
        if stats is not None:
            view.grad_stats = stats
    return view


def gradient_noise(small_sqr: float, small_batch: float, big_sqr: float,
                   big_batch: float) -> tuple[float, float]:
    """``(grad_sqr, grad_var)`` from the squared norms of two gradient estimates of one
    step, over ``small_batch`` and ``big_batch`` samples (``small < big``; McCandlish et al.,
    "An empirical model of large-batch training", appendix A, as Pollux's adaptdl measures
    them): ``E|g_B|^2 = |G|^2 + tr(S) / B`` for a B-sample mean, solved for the squared norm
    of the true gradient ``|G|^2`` and the variance of one sample's gradient ``tr(S)``.
    Single steps are noisy (either may come out negative): average them over steps."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"batches must satisfy 0 < small < big, got {small_batch}, "
                         f"{big_batch}")
    sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
    var = (small_sqr - big_sqr) / (1.0 / small_batch - 1.0 / big_batch)
    return sqr, var


def gradient_stats(rec: dict[str, Any]) -> tuple[float, float] | None:
    """``(grad_sqr, grad_var)`` of a progress line that reports both, finite and
    non-negative; None otherwise (a line may carry them or not)."""
    got = []
    for key in ("grad_sqr", "grad_var"):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                v >= 0 and v < float("inf")):
            return None
        got.append(float(v))
    return got[0], got[1]


def file_size(path: str | Path) -> int:
    """Bytes in ``path`` now (0 when absent): a launch reads progress after this offset."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
