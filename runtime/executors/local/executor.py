"""The local executor: real worker processes on this machine, for every workload kind.

Each allocated job gets one process group sized by its allocation: ``plan.gpus``
ranks, each with the workload contract's environment
(``apportion.runtime.workload``). The built-in trainer's ranks are forked from
a server that preloaded torch; a job's own command (``workload.kind``
torchrun, deepspeed, jax, or apportion's DeepSpeed / JAX entries) runs as a
subprocess per rank, in ``workload.workdir`` (else the job folder) with
``workload.env``, stdout and stderr in ``rank<R>.log`` / ``rank<R>.err`` of
the job folder. On a CPU-only machine every rank stands for one "GPU slot" of
:func:`local_cluster`.

Progress comes from the contract's progress file (the lines this launch
appended), a non-zero exit is a failure whose reason is the rank's last
stderr lines (the built-in trainer's own message where it wrote one), and a
stop (preempt, resize, migrate, shutdown) is ``STOP`` in the job folder plus
SIGTERM to every rank, SIGKILL after the grace period: the workload
checkpoints and exits 0, the new group resumes. All stops of a round are
requested together and awaited together before any launch.

Surviving kills: every launch is recorded through a :class:`LaunchLog`
(intent, workers, stop, end; the SQLite store's launch ids are per store and
monotonic), the job folder's lock (``runtime.executors.procs``) is held by the ranks for
as long as any of them lives so no second group can start there, and
:meth:`LocalExecutor.reconcile` adopts or stops the groups a killed run left.
The built-in trainer is also fenced by the folder's ``OWNER`` file.

The reconfiguration overhead reported by :meth:`LocalExecutor.poll` is the
wall time from the start of ``apply`` (the decision) to the first iteration
finished by the relaunched group.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import multiprocessing.reduction
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.formulations.candidates import CandidateOptions
from apportion.runtime.executors.confined import (
    UnsafeFolder,
    confine,
    open_in,
    replace_in,
    touch_in,
    unlink_in,
)
from apportion.runtime.executors.executor import (
    Event,
    Executor,
    FailureGate,
    Health,
    LaunchLog,
    LingerWatch,
    MemoryLaunchLog,
    Progress,
    Reconciled,
    actions_for,
    steps_to_launch,
)
from apportion.runtime.executors.launch import LaunchSpec, launch_spec
from apportion.runtime.executors.local.gpus import catalog_type, local_gpus, pick_devices
from apportion.runtime.executors.procs import (
    EXIT_UNKNOWN,
    Proc,
    folder_free,
    lock_holders,
    stop_holders,
    try_lock,
    wait_all,
)
from apportion.runtime.plan_filter import workload_plan_filter
from apportion.runtime.workers.train_config import read_json_file
from apportion.runtime.workload import (
    CHECKPOINT_DIR_NAME,
    PROGRESS_FILE_NAME,
    ProgressView,
    file_size,
    read_progress_since,
)

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision
from apportion.errors import InputError
from apportion.jobs import JobSpec, Workload, job_dirname
from apportion.plans import ExecutionPlan
from apportion.policies import RoundConfig

log = logging.getLogger(__name__)

STOP_FILE = "STOP"
OWNER_FILE = "OWNER"
STATUS_FILE = "progress.json"  # the built-in trainer's own status (state, error, launch id)
EXIT_FENCED = 3  # = trainer.EXIT_FENCED (not imported: the trainer imports torch)
DEFAULT_CHECKPOINT_EVERY = 0  # iterations (0: off) ...
DEFAULT_CHECKPOINT_INTERVAL_S = 120.0  # ... or seconds: periodic checkpoints by default
STDERR_LINES = 8


def local_cluster(slots: int | None = None, gpu_type: str | None = None,
                  gpu_memory_gib: float | None = None) -> Cluster:
    """This machine as a one-node cluster of ``slots`` worker slots.

    With NVIDIA GPUs (:func:`local_gpus`) a slot is a GPU and the type is the
    catalog's name for it; without, the slots are 4 CPU worker processes and the
    type a stand-in name from the catalog (the estimator needs one). CPUs and
    host memory are this machine's, so the round's per-slot shares are real.

    ``APPORTION_LOCAL_GPU_MEMORY_GIB`` (or ``gpu_memory_gib``) says how much device
    memory a job may use per slot, when less than the type's (a GPU shared with other
    work; a CPU slot, which has no device memory of its own, a budget): a model larger
    than that is spilled (Hydra), shard by shard under it.
    """
    gpus = local_gpus()
    if gpus:
        slots = slots or len(gpus)
        gpu_type = gpu_type or catalog_type(gpus[0][1])
    cpus = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = 8.0
    if gpu_memory_gib is None:
        gpu_memory_gib = _positive_env(ENV_LOCAL_GPU_MEMORY)
    return Cluster("local", [NodeGroup("local", 1, gpu_type or "T4", slots or 4,
                                       cpus_per_node=cpus,
                                       host_memory_gib=round(mem_gib, 1), intra_node_link="pcie",
                                       intra_node_bandwidth_GBps=10.0,
                                       inter_node_bandwidth_GBps=1.0,
                                       gpu_memory_gib=gpu_memory_gib)])


ENV_LOCAL_GPU_MEMORY = "APPORTION_LOCAL_GPU_MEMORY_GIB"


def _positive_env(name: str) -> float | None:
    """A positive finite number from the environment, or None when unset; anything else is
    the user's error, named."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(name, name, f"must be a positive number of GiB, got {raw!r}")
    return value


def local_round_config(time_budget_s: float = 5.0, device: str | None = None) -> RoundConfig:
    """Round settings for the real workers: only plans each job's workload kind runs.

    The torch worker runs pipeline-parallel plans only with ``tp = 1`` and no
    ZeRO and never changes a plan to fit; the round drops every candidate a
    job's workload refuses (``workload.plan_supported``), so multi-stage cells
    reach the built-in trainer as pipeline plans, and never reach a user
    command that runs one stage.
    """
    return RoundConfig(time_budget_s=time_budget_s, candidates=CandidateOptions(),
                       plan_filter=workload_plan_filter(device))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Modules the forkserver imports once; every worker forked from it starts with torch, DDP and
# dynamo loaded (about 5-10 s of imports per process on this machine otherwise).
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
           "apportion.runtime.workers.trainer", "apportion.runtime.workers.parallel",
           "apportion.runtime.workers.pipeline_parallel"]
_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CTX = ctx
    return _CTX


class _InheritedFd:
    """An fd handed to a forkserver child (the same open file: the folder lock is shared)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        return (_rebuild_fd, (multiprocessing.reduction.DupFd(self.fd),))


def _rebuild_fd(dup: Any) -> int:
    return int(dup.detach())


def _worker_entry(config: str, env: dict[str, str], log_path: str, err_path: str,
                  lock: Any) -> None:
    """A forked worker: its own session, the folder lock, its environment, its logs, then the
    trainer's main."""
    os.setsid()  # the executor signals the rank's whole group
    os.environ.update(env)
    out = open_in(Path(log_path).parent, Path(log_path).name)  # never through a link
    err = open_in(Path(err_path).parent, Path(err_path).name)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives with the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from apportion.runtime.workers import trainer
    code = trainer.main([config], exiting=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def prepare(spec: LaunchSpec) -> Path:
    """Write the launch's files (config, DeepSpeed JSON) and owner; clear a stale STOP."""
    jobdir = confine(spec.workdir, (CHECKPOINT_DIR_NAME,))  # no links, this user's only
    for name, content in spec.files.items():
        replace_in(jobdir, name, json.dumps(content, sort_keys=True).encode())
    if spec.launch_id:
        replace_in(jobdir, OWNER_FILE, spec.launch_id.encode())
    unlink_in(jobdir, STOP_FILE)
    return jobdir


def spawn(spec: LaunchSpec, env_base: dict[str, str] | None = None,
          method: str = "forkserver", lock_fd: int | None = None) -> list[Proc]:
    """Start the group's processes (one per rank) with logs in the job folder.

    The built-in trainer's ranks are forked from a server that preloaded torch
    (``method="forkserver"``, the default: start-up drops from seconds to
    milliseconds per worker); ``"subprocess"``, and every workload with its own
    command, runs exactly ``spec.command``. ``lock_fd`` (the job folder's
    lock) is inherited by every rank.
    """
    jobdir = prepare(spec)
    base = dict(env_base if env_base is not None else os.environ)
    # `python` in a workload's command is the interpreter apportion runs under, whatever
    # PATH the job sets (its own PATH follows it)
    path = spec.env.get("PATH", base.get("PATH", ""))
    base["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), path])
    procs: list[Proc] = []
    try:
        _spawn_ranks(spec, jobdir, base, method, lock_fd, procs)
    except BaseException:  # a rank that could not start: the ones that did go too
        for p in procs:
            p.kill()
        wait_all(procs, 5.0)
        raise
    return procs


def _spawn_ranks(spec: LaunchSpec, jobdir: Path, base: dict[str, str], method: str,
                 lock_fd: int | None, procs: list[Proc]) -> None:
    own_command = spec.kind != "builtin" or method != "forkserver"
    for rank_env in spec.per_worker_env:
        r = rank_env["RANK"]
        log_path, err_path = jobdir / f"rank{r}.log", jobdir / f"rank{r}.err"
        env = {**spec.env, **rank_env}
        if not own_command:
            pr = _context().Process(target=_worker_entry, args=(
                spec.command[-1], env, str(log_path), str(err_path),
                _InheritedFd(lock_fd) if lock_fd is not None else None), daemon=False)
            pr.start()
            procs.append(Proc(pr))
            continue
        with os.fdopen(open_in(jobdir, log_path.name), "ab") as out, \
                os.fdopen(open_in(jobdir, err_path.name), "ab") as err:
            procs.append(Proc(subprocess.Popen(
                spec.command, env={**base, **env, "PATH": base["PATH"]},
                cwd=spec.cwd or str(jobdir), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(lock_fd,) if lock_fd is not None else ())))


def stop(jobdir: Path, procs: list[Proc], timeout_s: float) -> bool:
    """Ask a group to checkpoint and exit (STOP file and SIGTERM); SIGKILL after
    ``timeout_s``. True when every rank exited 0 in time."""
    request_stop(jobdir, procs)
    return wait(procs, timeout_s)


def request_stop(jobdir: Path, procs: list[Proc]) -> None:
    touch_in(jobdir, STOP_FILE)
    for p in procs:
        p.terminate()


def wait(procs: list[Proc], timeout_s: float) -> bool:
    clean = wait_all(procs, timeout_s)
    return clean and all(p.returncode == 0 for p in procs)


def stderr_tail(jobdir: Path, ranks: Sequence[int], lines: int = STDERR_LINES) -> str:
    """The last non-empty stderr lines of the first of ``ranks`` that wrote any."""
    for r in ranks:
        try:
            with open(jobdir / f"rank{r}.err", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16384))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        got = [x.rstrip() for x in text.splitlines() if x.strip()][-lines:]
        if got:
            return "\n".join(got)
    return ""


class FolderBusy(RuntimeError):
    """A job folder's lock stayed held: no second group is launched into it."""


@dataclass
class _Run:
    job: JobSpec
    alloc: Allocation
    procs: list[Proc]
    dir: Path
    decision_wall: float
    launch_wall: float
    launch_id: str = ""
    offset: int = 0  # progress file size at launch: later lines are this group's
    checkpoint_start: int = 0
    overhead_s: float | None = None
    health: Health = Health.STARTING
    error: str | None = None
    action: str = "start"
    kind: str = "builtin"
    view: ProgressView = field(default_factory=ProgressView)
    rate: tuple[int, float, int, float] | None = None  # (it0, t0, it1, t1) seen by polls
    loss: float | None = None  # the last loss the workload reported
    history: list[tuple[str, float]] = field(default_factory=list)  # reconfiguration overheads
    stopping: bool = False
    closed: bool = False  # its launch record is ended
    devices: list[str] = field(default_factory=list)  # the CUDA devices of its ranks, if any

    @property
    def adopted(self) -> bool:
        return any(p.adopted for p in self.procs)

    @property
    def progress_file(self) -> Path:
        return self.dir / PROGRESS_FILE_NAME

    @property
    def iterations_done(self) -> int:
        it = self.view.iteration
        return max(self.checkpoint_start, it) if it is not None else max(
            self.checkpoint_start, self.job.iterations_done)

    @property
    def checkpoint(self) -> int:
        ck = self.view.checkpoint_iteration
        return max(self.checkpoint_start, ck) if ck is not None else self.checkpoint_start


class LocalExecutor(Executor):
    """Real worker process groups on this machine."""

    name = "local"

    def __init__(self, workdir: str | Path, seed: int = 0, stop_timeout_s: float = 120.0,
                 threads_per_worker: int = 1,
                 checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
                 checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
                 lr: float = 1e-3, spawn_method: str = "forkserver",
                 launch_log: LaunchLog | None = None, linger_s: float = 30.0) -> None:
        self.workdir = Path(workdir).absolute()
        # a group still alive ``linger_s`` after its final checkpoint at the target is killed
        # and its job finished (a rank hung in teardown would hold its devices for ever)
        self.linger = LingerWatch(linger_s)
        self.seed = seed
        self.stop_timeout_s = stop_timeout_s
        self.threads = threads_per_worker
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self.lr = lr
        self.spawn_method = spawn_method
        self.launch_log: LaunchLog = launch_log if launch_log is not None else MemoryLaunchLog()
        self.runs: dict[str, _Run] = {}
        self.stopped: dict[str, _Run] = {}  # checkpointed, finished or failed
        self.failures = FailureGate()
        # with GPUs every rank gets one of its own (CUDA_VISIBLE_DEVICES): two jobs never
        # share a device, and NCCL refuses two ranks of one group on one
        self.gpus = [idx for idx, _ in local_gpus()]

    # -- state -----------------------------------------------------------------
    def _alive(self) -> set[str]:
        return {j for j, r in self.runs.items() if all(p.poll() is None for p in r.procs)}

    def _finished(self) -> set[str]:
        return {j for j, r in self.stopped.items() if r.health == Health.FINISHED}

    def jobdir(self, job_id: str) -> Path:
        return self.workdir / job_dirname(job_id)

    # -- the protocol ------------------------------------------------------------
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        t0 = time.time()
        with self.failures.quiet():
            self.poll()  # settle exits first so finished jobs are not relaunched
        held = self.failures.unseen(self.stopped)
        by_id = {j.id: j for j in state}
        steps = actions_for(decision, self.runs, self._alive(), self._finished())
        events: list[Event] = []
        stopping = [s for s in steps if s.action in (Action.PREEMPT, Action.RESIZE, Action.MIGRATE)
                    or s.restart]
        why = {s.job: s.action.value for s in stopping}
        for s in stopping:  # record and request every stop first, then wait for all of them
            run = self.runs.get(s.job)
            if run is not None:
                self._request_stop(run, why[s.job])
        for s in stopping:
            run = self.runs.pop(s.job, None)
            if run is None:
                continue
            clean = self._finish_stop(run)
            self.stopped[s.job] = run
            if s.action == Action.PREEMPT:
                events.append(Event(s.job, "preempt", 0, run.alloc.gpu_type,
                                    "checkpointed" if clean else "killed after stop timeout"))
        for s in steps_to_launch(steps, held, events):
            job = by_id.get(s.job) or (self.stopped[s.job].job if s.job in self.stopped else None)
            if job is None:
                raise KeyError(f"decision allocates unknown job {s.job!r}")
            try:
                events.append(self._launch(job, s.allocation, "restart" if s.restart
                                           else s.action.value, t0))
            except FolderBusy as exc:  # the next round tries again
                log.error("%s", exc)
                events.append(Event(s.job, "pending", 0, s.allocation.gpu_type, str(exc)))
        return events

    def _request_stop(self, run: _Run, why: str) -> None:
        if run.launch_id and not run.stopping:
            self.launch_log.stopping(int(run.launch_id), why)
        run.stopping = True
        request_stop(run.dir, run.procs)

    def _finish_stop(self, run: _Run) -> bool:
        """Wait for a group asked to stop; record how it ended. True when it checkpointed."""
        in_time = wait_all(run.procs, self.stop_timeout_s)
        codes = self._codes(run)
        self._settle(run)
        # an adopted group's exit status went to its new parent: its last checkpoint line tells
        clean = in_time and (all(c == 0 for c in codes) or (
            run.adopted and all(c in (0, EXIT_UNKNOWN) for c in codes)
            and run.health in (Health.CHECKPOINTED, Health.FINISHED)))
        if run.health not in (Health.FINISHED, Health.FAILED):
            run.health = Health.CHECKPOINTED
        self._close(run, "finished" if run.health == Health.FINISHED else
                    "checkpointed" if clean else "stopped",
                    "" if clean else f"stopped uncleanly: exit codes {self._codes(run)}")
        return clean

    def _codes(self, run: _Run) -> list[int | None]:
        return [p.poll() for p in run.procs]

    def _close(self, run: _Run, outcome: str, detail: str = "") -> None:
        if run.closed or not run.launch_id:
            return
        run.closed = True
        self.launch_log.ended(int(run.launch_id), outcome, detail, run.checkpoint)

    def _take_folder(self, jobdir: Path) -> int:
        """The job folder's lock. A group still holding it (an orphan of a killed run that
        reconcile did not see, such as a rank its forkserver forked after the run died) is
        stopped first: SIGTERM, SIGKILL after the grace period, again until the lock is
        free. Never two groups in one folder: :class:`FolderBusy` if it stays held."""
        deadline = time.monotonic() + self.stop_timeout_s + 60.0
        while True:
            fd = try_lock(jobdir)
            if fd is not None:
                return fd
            if time.monotonic() > deadline:
                raise FolderBusy(f"{jobdir}: the job folder is still held (pids "
                                 f"{lock_holders(jobdir)}); not launching a second group")
            pids = stop_holders(jobdir, self.stop_timeout_s)
            if pids:
                log.warning("%s: a worker group (pids %s) still held the job folder; stopped "
                            "it", jobdir.name, pids)
            time.sleep(0.5)  # a lock file in flight to a forkserver shows up in a moment

    def _refused(self, job: JobSpec, alloc: Allocation, action: str, t0: float, jobdir: Path,
                 why: str) -> Event:
        """A launch refused before any worker started (an unsafe job folder): recorded in
        the launch log and reported by the next poll as this job's failure."""
        prev = self.stopped.pop(job.id, None)
        lid = self.launch_log.begin(job.id, self.name, action, alloc.plan.as_dict(),
                                    dict(alloc.placement), str(jobdir), 0)
        self.launch_log.ended(lid, "failed", why, 0)
        log.error("job %s: %s", job.id, why)
        self.stopped[job.id] = _Run(job, alloc, [], jobdir, t0, time.time(), launch_id=str(lid),
                                    health=Health.FAILED, error=why, action=action,
                                    kind=(job.workload or Workload()).kind, closed=True,
                                    history=prev.history if prev else [])
        return Event(job.id, "failed", 0, alloc.gpu_type, why)

    def _launch(self, job: JobSpec, alloc: Allocation, action: str, t0: float) -> Event:
        jobdir = self.jobdir(job.id)
        try:  # the folder made or checked (no links, this user's) before its lock is taken
            confine(jobdir, (CHECKPOINT_DIR_NAME,))
            fd = self._take_folder(jobdir)
        except UnsafeFolder as exc:
            return self._refused(job, alloc, action, t0, jobdir, f"launch refused: {exc}"[:2000])
        try:
            prev = self.stopped.pop(job.id, None)
            progress = jobdir / PROGRESS_FILE_NAME
            ck_start = read_progress_since(progress).checkpoint_iteration or 0
            lid = self.launch_log.begin(job.id, self.name, action, alloc.plan.as_dict(),
                                        dict(alloc.placement), str(jobdir), ck_start)
            spec = launch_spec(job, alloc, action, self.workdir, master_port=free_port(),
                               python=sys.executable, seed=self.seed, threads=self.threads,
                               lr=self.lr, checkpoint_every=self.checkpoint_every,
                               checkpoint_interval_s=self.checkpoint_interval_s,
                               launch_id=str(lid))
            offset = file_size(progress)
            devices = self._devices(spec)
            try:
                procs = spawn(spec, method=self.spawn_method, lock_fd=fd)
            except Exception as exc:  # noqa: BLE001 - a missing binary, a bad env: this job's
                # failure, reported by the next poll and counted by the fault policy
                why = f"launch failed: {type(exc).__name__}: {exc}"[:2000]
                self.launch_log.ended(lid, "failed", why, ck_start)
                log.error("job %s: %s", job.id, why)
                self.stopped[job.id] = _Run(job, alloc, [], jobdir, t0, time.time(),
                                            launch_id=str(lid), checkpoint_start=ck_start,
                                            health=Health.FAILED, error=why, action=action,
                                            kind=spec.kind, closed=True,
                                            history=prev.history if prev else [])
                return Event(job.id, "failed", 0, alloc.gpu_type, why)
            self.launch_log.started(lid, [p.describe(r) for r, p in enumerate(procs)])
        finally:
            os.close(fd)  # the ranks hold the lock now
        run = _Run(job, alloc, procs, jobdir, t0, time.time(), launch_id=str(lid), offset=offset,
                   checkpoint_start=ck_start, action=action, kind=spec.kind,
                   history=prev.history if prev else [], devices=devices)
        self.runs[job.id] = run
        log.info("%s %s: %d workers, plan %s, launch %s", action, job.id, spec.workers,
                 alloc.plan.label(), lid)
        return Event(job.id, action, spec.workers, alloc.gpu_type, alloc.plan.label(),
                     spec=spec.as_dict())

    def _devices(self, spec: LaunchSpec) -> list[str]:
        """Give each rank a GPU no live group holds (in its ``CUDA_VISIBLE_DEVICES``); none on
        a machine without GPUs, or when too few are free (an adopted group's are unknown)."""
        if not self.gpus:
            return []
        alive = self._alive()
        busy = {d for j, r in self.runs.items() if j in alive for d in r.devices}
        devices = pick_devices(self.gpus, busy, spec.workers)
        if devices is None:
            log.warning("%s: %d ranks, %d GPUs free: ranks pin cuda:LOCAL_RANK", spec.job,
                        spec.workers, len(self.gpus) - len(busy))
            return []
        for rank_env, dev in zip(spec.per_worker_env, devices):
            rank_env["CUDA_VISIBLE_DEVICES"] = dev
        return devices

    # -- progress ----------------------------------------------------------------
    def _read(self, run: _Run) -> None:
        run.view = read_progress_since(run.progress_file, run.offset)
        loss = (run.view.last or {}).get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            run.loss = float(loss)
        it = run.view.iteration
        if it is None or it <= run.checkpoint_start and "loss" not in (run.view.last or {}):
            return
        now = time.monotonic()
        if run.rate is None:
            run.rate = (it, now, it, now)
        elif it != run.rate[2]:
            run.rate = (run.rate[0], run.rate[1], it, now)
        if run.health == Health.STARTING:
            run.health = Health.RUNNING
            wall = run.view.last.get("wall") if run.view.last else None
            first = float(wall) if isinstance(wall, (int, float)) else time.time()
            run.overhead_s = max(0.0, first - run.decision_wall)
            run.history.append((run.action, run.overhead_s))

    def _iter_time(self, run: _Run) -> float | None:
        last = run.view.last or {}
        t = last.get("iter_time_s")
        if isinstance(t, (int, float)) and t > 0:
            return float(t)
        if run.rate is not None and run.rate[2] > run.rate[0]:
            return (run.rate[3] - run.rate[1]) / (run.rate[2] - run.rate[0])
        return None

    def _settle(self, run: _Run) -> None:
        """Classify a group whose processes have all exited (or were stopped)."""
        self._read(run)
        codes = self._codes(run)
        status = read_json_file(run.dir / STATUS_FILE) or {}
        own = status.get("launch_id") == run.launch_id
        done = run.iterations_done >= run.job.iterations
        if run.kind == "builtin":  # the trainer says so itself (after its final checkpoint)
            done = own and status.get("state") == "finished" or run.checkpoint >= run.job.iterations
        if any(c == EXIT_FENCED for c in codes):
            run.health, run.error = Health.CHECKPOINTED, "fenced: a newer launch owns the folder"
        elif all(c == 0 for c in codes):
            # exiting 0 short of the target unasked is a failure, so a workload that does
            # it counts towards --max-retries instead of being relaunched for ever
            run.health = Health.FINISHED if done else (
                Health.CHECKPOINTED if run.stopping else Health.FAILED)
            if run.health == Health.FAILED:
                run.error = (f"the workload exited 0 at iteration {run.iterations_done} of "
                             f"{run.job.iterations} without being asked to stop (it must train "
                             "to APPORTION_ITERATIONS, or checkpoint and exit 0 on SIGTERM)")
        elif run.adopted and all(c in (0, EXIT_UNKNOWN) for c in codes):
            # an adopted group's exit status went to its new parent: judge by what it left
            last = run.view.last or {}
            if done:
                run.health = Health.FINISHED
            elif last.get("checkpoint") is True or (own and status.get("state") == "checkpointed"):
                run.health = Health.CHECKPOINTED
            else:
                run.health = Health.FAILED
                run.error = ("adopted worker group exited (exit status unknown) without a final "
                             "checkpoint" + self._reason_suffix(run, codes))
        elif run.stopping:  # killed after the grace period: its last checkpoint stands, and
            # one at the target is a finished job (a slow exit after the final checkpoint)
            run.health = Health.FINISHED if done else Health.CHECKPOINTED
        else:
            run.health = Health.FAILED
            msg = status.get("error") if own and status.get("error") else None
            run.error = msg or ("workload failed" + self._reason_suffix(run, codes))

    def _reason_suffix(self, run: _Run, codes: list[int | None], with_tail: bool = True) -> str:
        if not with_tail:
            return ""
        bad = [r for r, c in enumerate(codes) if c not in (0, None)] or list(range(len(codes)))
        tail = stderr_tail(run.dir, bad)
        return f"; exit codes {codes}; last stderr lines:\n{tail}" if tail else \
            f"; exit codes {codes}"

    def poll(self) -> list[Progress]:
        out: list[Progress] = []
        for job_id in sorted(set(self.runs) | set(self.stopped)):
            run = self.runs.get(job_id) or self.stopped[job_id]
            if job_id in self.runs:
                codes = self._codes(run)
                if any(c not in (None, 0, EXIT_UNKNOWN) for c in codes):  # a rank failed:
                    wait_all(run.procs, 5.0)  # the group is gone; the others have 5 s to exit
                if all(c is not None for c in self._codes(run)):
                    self._settle(run)
                    self._close(run, {Health.FINISHED: "finished", Health.FAILED: "failed"}
                                .get(run.health, "checkpointed"), run.error or "")
                    self.stopped[job_id] = self.runs.pop(job_id)
                else:
                    self._read(run)
                    self._reap_lingering(run)
            out.append(Progress(job_id, run.iterations_done, run.job.iterations, run.health,
                                self._iter_time(run), run.loss,
                                run.alloc.plan.gpus, run.alloc.plan.label(), run.overhead_s,
                                run.error, run.checkpoint, run.launch_id,
                                run.view.grad_stats if run.view is not None else None,
                                run.alloc.global_batch_size))
        return self.failures.saw(out)

    def _reap_lingering(self, run: _Run) -> None:
        """Kill a group still alive ``linger_s`` after its final checkpoint at the target: the
        job is done (its checkpoint stands, the next poll records it finished) and its
        processes hold devices (a two-rank group was seen at 6 of 6 iterations, checkpointed,
        and alive 120 s later, under load)."""
        if self.linger.due(f"{run.job.id}/{run.launch_id}", run.checkpoint, run.job.iterations,
                           run.stopping):
            self._request_stop(run, f"alive {self.linger.linger_s:g} s after its final checkpoint")
            if run.kind == "builtin":
                self._log_stacks(run)
            for p in run.procs:
                p.kill()
            wait_all(run.procs, 5.0)

    def _log_stacks(self, run: _Run) -> None:
        """Ask a hung built-in group's ranks for their stacks (``trainer.STACKS_SIGNAL``)
        and log them: where a group hangs after its final checkpoint is the diagnosis."""
        from apportion.runtime.workers.trainer import STACKS_SIGNAL

        alive = [r for r, p in enumerate(run.procs) if p.poll() is None]
        for r in alive:
            try:
                run.procs[r].signal(STACKS_SIGNAL)
            except OSError:
                continue
        time.sleep(1.0)
        for r in alive:
            log.warning("%s: rank %d alive %g s after its final checkpoint; its stack:\n%s",
                        run.job.id, r, self.linger.linger_s, stderr_tail(run.dir, [r], 40))

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = []
        for run in list(self.runs.values()):
            if checkpoint:
                self._request_stop(run, "shutdown")
            else:
                for p in run.procs:
                    p.kill()
        for job_id, run in list(self.runs.items()):
            clean = self._finish_stop(run)
            self.stopped[job_id] = self.runs.pop(job_id)
            events.append(Event(job_id, "preempt", 0, run.alloc.gpu_type,
                                "checkpointed on shutdown" if clean else "killed on shutdown"))
        return events

    def overheads(self) -> dict[str, list[tuple[str, float]]]:
        """(action, seconds from decision to the first iteration of the new group) per launch."""
        self.poll()
        return {j: list(r.history) for j, r in {**self.stopped, **self.runs}.items() if r.history}

    # -- a restarted run ---------------------------------------------------------------
    def reconcile(self, records: Sequence[Any], jobs: dict[str, JobSpec],
                  adopt: bool = True) -> list[Reconciled]:
        """Adopt or stop the groups an earlier run left (its open launch records).

        A group is adopted when ``adopt`` is on, its record says it runs, every
        rank it recorded is alive (same pid and start time), and its job is
        still running in the store (``jobs``: the store's running jobs). Any
        other survivor is stopped: SIGTERM (checkpoint and exit), SIGKILL after
        the grace period; so is any process still holding a job folder's
        lock. What each group left (its last checkpoint) is returned for the
        store to apply.
        """
        out: list[Reconciled] = []
        for rec in records:
            r = rec if isinstance(rec, dict) else rec.as_dict()
            lid, job_id, jobdir = int(r["id"]), r["job"], Path(r["jobdir"])
            workers = r.get("workers") or []
            procs = [Proc(pid=int(w["pid"]), ticks=w.get("start_ticks")) for w in workers
                     if w.get("pid")]
            live = [p for p in procs if p.poll() is None]
            job = jobs.get(job_id)
            if adopt and r["state"] == "running" and job is not None and job.running \
                    and procs and len(live) == len(procs) and not folder_free(jobdir):
                alloc = _allocation(job, r)
                run = _Run(job, alloc, procs, jobdir, time.time(), time.time(),
                           launch_id=str(lid), checkpoint_start=int(r.get("checkpoint_start") or 0),
                           action="adopt", kind=job.workload.kind if job.workload else "builtin")
                run.health = Health.RUNNING
                self._read(run)
                self.runs[job_id] = run
                out.append(Reconciled(lid, job_id, "adopted", None, run.checkpoint,
                                      f"{len(procs)} workers adopted"))
                continue
            found = lock_holders(jobdir)
            if live or found:
                for p in live:
                    p.terminate()
                touch_in(jobdir, STOP_FILE)
                wait_all(live, self.stop_timeout_s)
                stop_holders(jobdir, self.stop_timeout_s)
            view = read_progress_since(jobdir / PROGRESS_FILE_NAME, 0)
            ck = max(int(r.get("checkpoint_start") or 0), view.checkpoint_iteration or 0)
            status = read_json_file(jobdir / STATUS_FILE) or {}
            target = job.iterations if job is not None else 0
            finished = (status.get("launch_id") == str(lid) and status.get("state") == "finished"
                        ) or (target > 0 and ck >= target)
            outcome = "finished" if finished else "stopped" if (live or found) else "checkpointed"
            detail = (f"orphan of a killed run: {len(live) or len(found)} processes stopped"
                      if live or found else "its workers were gone when the run restarted")
            out.append(Reconciled(lid, job_id, outcome, None, ck, detail))
        return out


def _allocation(job: JobSpec | None, rec: dict[str, Any]) -> Allocation:
    plan = ExecutionPlan(**rec.get("plan") or {})
    placement = {k: int(v) for k, v in (rec.get("placement") or {}).items()}
    gtype = job.running.gpu_type if job is not None and job.running else ""
    stages = job.running.stages if job is not None and job.running else plan.pp
    return Allocation(rec["job"], gtype, plan.gpus, stages, plan, placement, 0.0, Action.KEEP)

