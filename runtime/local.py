"""The local executor: real torch worker processes on this machine.

Each allocated job gets one process group sized by its allocation (gloo on
CPU, nccl on CUDA): ``plan.gpus`` processes of ``python -m
apportion.runtime.trainer`` with the torchrun environment. On a CPU-only
machine every worker process stands for one "GPU slot" of
:func:`local_cluster`, a cluster describing this machine.

Reconfiguration (resize, migrate) and preemption are checkpoint -> stop ->
relaunch -> resume: the executor creates the job's ``STOP`` file, the workers
agree at the next iteration boundary, save an atomic checkpoint and exit; the
new group loads it. All stops of a round are requested together and awaited
together before any launch, so capacity is released before it is reused.

The reconfiguration overhead reported by :meth:`LocalExecutor.poll` is the
wall time from the start of ``apply`` (the decision) to the first iteration
finished by the relaunched group.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.process
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
from apportion.runtime.executor import Event, Health, Progress, actions_for
from apportion.runtime.launch import LaunchSpec, launch_spec, read_json_file, write_json

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision
from apportion.jobs import JobSpec
from apportion.round import RoundConfig

log = logging.getLogger(__name__)

STOP_FILE = "STOP"
PROGRESS_FILE = "progress.json"


def local_cluster(slots: int = 4, gpu_type: str = "T4") -> Cluster:
    """This machine as a one-node cluster of ``slots`` worker slots.

    The GPU type is a stand-in name from the catalog (the estimator needs one);
    the slots are CPU worker processes. CPUs and host memory are this
    machine's, so the round's per-slot shares are real.
    """
    cpus = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = 8.0
    return Cluster("local", [NodeGroup("local", 1, gpu_type, slots, cpus_per_node=cpus,
                                       host_memory_gib=round(mem_gib, 1), intra_node_link="pcie",
                                       intra_node_bandwidth_GBps=10.0,
                                       inter_node_bandwidth_GBps=1.0)])


def local_round_config(time_budget_s: float = 5.0) -> RoundConfig:
    """Round settings for plans the torch worker runs: one pipeline stage per job.

    The torch worker runs pipeline-parallel plans only with ``tp = 1`` and no ZeRO
    (``runtime.pipeline_parallel``) and never changes a plan to fit; the cell
    estimators may combine PP with TP inside one multi-stage cell, so rounds that
    feed :class:`LocalExecutor` generate 1-stage cells. Pipeline plans reach the
    worker through decisions that name them (and through DeepSpeed).
    """
    return RoundConfig(time_budget_s=time_budget_s, candidates=CandidateOptions(max_stages=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One worker process, whether a subprocess or a forkserver child (one interface)."""

    def __init__(self, handle: subprocess.Popen | multiprocessing.process.BaseProcess) -> None:
        self.handle = handle

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    def poll(self) -> int | None:
        h = self.handle
        if isinstance(h, subprocess.Popen):
            return h.poll()
        return None if h.is_alive() else h.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        h = self.handle
        if isinstance(h, subprocess.Popen):
            return h.wait(timeout=timeout)
        h.join(timeout)
        if h.is_alive():
            raise subprocess.TimeoutExpired("worker", timeout or 0.0)
        return h.exitcode

    def kill(self) -> None:
        self.handle.kill()

    def terminate(self) -> None:
        self.handle.terminate()

    @property
    def returncode(self) -> int | None:
        return self.poll()


# Modules the forkserver imports once; every worker forked from it starts with torch, DDP and
# dynamo loaded (about 5-10 s of imports per process on this machine otherwise).
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
           "apportion.runtime.trainer", "apportion.runtime.parallel",
           "apportion.runtime.pipeline_parallel"]
_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CTX = ctx
    return _CTX


def _worker_entry(config: str, env: dict[str, str], log_path: str) -> None:
    """A forked worker: its environment, its log, then the trainer's main."""
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives with the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from apportion.runtime import trainer
    code = trainer.main([config])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn(spec: LaunchSpec, env_base: dict[str, str] | None = None,
          method: str = "forkserver") -> list[Proc]:
    """Start the group's processes (one per rank) with logs in the job folder.

    ``method="forkserver"`` forks workers from a server that preloaded torch
    (the default: start-up drops from seconds to milliseconds per worker);
    ``"subprocess"`` runs exactly ``spec.command`` (what a user would type).
    """
    jobdir = Path(spec.workdir)
    jobdir.mkdir(parents=True, exist_ok=True)
    write_json(jobdir / "config.json", spec.config)
    (jobdir / STOP_FILE).unlink(missing_ok=True)
    procs = []
    for rank_env in spec.per_worker_env:
        log_path = jobdir / f"rank{rank_env['RANK']}.log"
        if method == "forkserver":
            env = {**spec.env, **rank_env}
            pr = _context().Process(target=_worker_entry, args=(spec.command[-1], env,
                                                                str(log_path)), daemon=False)
            pr.start()
            procs.append(Proc(pr))
            continue
        env = {**(env_base if env_base is not None else os.environ), **spec.env, **rank_env}
        with open(log_path, "ab") as fh:
            procs.append(Proc(subprocess.Popen(spec.command, env=env, stdout=fh, stderr=fh,
                                               stdin=subprocess.DEVNULL)))
    return procs


def stop(jobdir: Path, procs: list[Proc], timeout_s: float) -> bool:
    """Ask a group to checkpoint and exit; kill it after ``timeout_s``. True when clean."""
    (jobdir / STOP_FILE).touch()
    return wait(procs, timeout_s)


def wait(procs: list[Proc], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    clean = True
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            clean = False
    if not clean:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return clean and all(p.returncode == 0 for p in procs)


@dataclass
class _Run:
    job: JobSpec
    alloc: Allocation
    procs: list[Proc]
    dir: Path
    decision_wall: float
    launch_wall: float
    overhead_s: float | None = None
    health: Health = Health.STARTING
    error: str | None = None
    action: str = "start"
    launch_id: str = ""
    history: list[tuple[str, float]] = field(default_factory=list)  # reconfiguration overheads measured


class LocalExecutor:
    """Real worker process groups on this machine."""

    name = "local"

    def __init__(self, workdir: str | Path, seed: int = 0, stop_timeout_s: float = 120.0,
                 threads_per_worker: int = 1, checkpoint_every: int = 0,
                 lr: float = 1e-3, spawn_method: str = "forkserver") -> None:
        self.workdir = Path(workdir)
        self.seed = seed
        self.stop_timeout_s = stop_timeout_s
        self.threads = threads_per_worker
        self.checkpoint_every = checkpoint_every
        self.lr = lr
        self.spawn_method = spawn_method
        self.runs: dict[str, _Run] = {}
        self.stopped: dict[str, _Run] = {}  # checkpointed, finished or failed
        self._launches = 0

    # -- state -----------------------------------------------------------------
    def _alive(self) -> set[str]:
        return {j for j, r in self.runs.items() if all(p.poll() is None for p in r.procs)}

    def _finished(self) -> set[str]:
        return {j for j, r in self.stopped.items() if r.health in (Health.FINISHED, Health.FAILED)}

    # -- the protocol ------------------------------------------------------------
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        t0 = time.time()
        self.poll()  # settle exits first so finished jobs are not relaunched
        by_id = {j.id: j for j in state}
        steps = actions_for(decision, self.runs, self._alive(), self._finished())
        events: list[Event] = []
        stopping = [s for s in steps if s.action in (Action.PREEMPT, Action.RESIZE, Action.MIGRATE)
                    or s.restart]
        for s in stopping:  # request every stop first, then wait for all of them
            run = self.runs.get(s.job)
            if run is not None:
                (run.dir / STOP_FILE).touch()
        for s in stopping:
            run = self.runs.pop(s.job, None)
            if run is None:
                continue
            clean = wait(run.procs, self.stop_timeout_s)
            run.health = Health.CHECKPOINTED
            self.stopped[s.job] = run
            if s.action == Action.PREEMPT:
                events.append(Event(s.job, "preempt", 0, run.alloc.gpu_type,
                                    "checkpointed" if clean else "killed after stop timeout"))
        for s in steps:
            if s.allocation is None or (s.action == Action.KEEP and not s.restart):
                if s.action == Action.KEEP:
                    events.append(Event(s.job, "keep", s.allocation.plan.gpus if s.allocation
                                        else 0, detail="no change"))
                continue
            job = by_id.get(s.job) or (self.stopped[s.job].job if s.job in self.stopped else None)
            if job is None:
                raise KeyError(f"decision allocates unknown job {s.job!r}")
            events.append(self._launch(job, s.allocation, "restart" if s.restart
                                       else s.action.value, t0))
        return events

    def _launch(self, job: JobSpec, alloc: Allocation, action: str, t0: float) -> Event:
        self._launches += 1
        spec = launch_spec(job, alloc, action, self.workdir, master_port=free_port(),
                           python=sys.executable, seed=self.seed, threads=self.threads,
                           lr=self.lr, checkpoint_every=self.checkpoint_every,
                           launch_id=f"{job.id}-{self._launches}")
        procs = spawn(spec, method=self.spawn_method)
        prev = self.stopped.pop(job.id, None)
        run = _Run(job, alloc, procs, Path(spec.workdir), t0, time.time(),
                   action=action, history=prev.history if prev else [],
                   launch_id=spec.config["launch_id"])
        self.runs[job.id] = run
        log.info("%s %s: %d workers, plan %s", action, job.id, spec.workers, alloc.plan.label())
        return Event(job.id, action, spec.workers, alloc.gpu_type, alloc.plan.label(),
                     spec=spec.as_dict())

    def poll(self) -> list[Progress]:
        out: list[Progress] = []
        for job_id in sorted(set(self.runs) | set(self.stopped)):
            run = self.runs.get(job_id) or self.stopped[job_id]
            prog = read_json_file(run.dir / PROGRESS_FILE) or {}
            fresh = prog.get("launch_id") == run.launch_id  # this group's report, not the last's
            if job_id in self.runs:
                codes = [p.poll() for p in run.procs]
                if any(c not in (None, 0) for c in codes):  # one rank failed: the group is gone
                    for p in run.procs:  # a few seconds for the others to report and exit
                        if p.poll() is None:
                            try:
                                p.wait(timeout=5.0)
                            except subprocess.TimeoutExpired:
                                p.kill()
                                p.wait()
                    prog = read_json_file(run.dir / PROGRESS_FILE) or {}
                    run.health = Health.FAILED
                    run.error = prog.get("error") or f"worker exit codes {codes}"
                    self.stopped[job_id] = self.runs.pop(job_id)
                elif all(c == 0 for c in codes):
                    run.health = (Health.FINISHED if prog.get("state") == "finished"
                                  else Health.CHECKPOINTED)
                    self.stopped[job_id] = self.runs.pop(job_id)
                elif fresh and prog.get("first_step_wall"):
                    run.health = Health.RUNNING
                    if run.overhead_s is None:
                        run.overhead_s = float(prog["first_step_wall"]) - run.decision_wall
                        run.history.append((run.action, run.overhead_s))
            elif run.health == Health.FAILED and prog.get("error") and \
                    (run.error or "").startswith("worker exit codes"):
                run.error = prog["error"]  # the worker's own reason, reported after its exit was seen
            out.append(Progress(job_id, int(prog.get("iterations_done", run.job.iterations_done)),
                                run.job.iterations, run.health, prog.get("iter_time_s"),
                                prog.get("loss"), run.alloc.plan.gpus, run.alloc.plan.label(),
                                run.overhead_s, run.error))
        return out

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = []
        for job_id, run in list(self.runs.items()):
            if checkpoint:
                (run.dir / STOP_FILE).touch()
            else:
                for p in run.procs:
                    p.terminate()
        for job_id, run in list(self.runs.items()):
            clean = wait(run.procs, self.stop_timeout_s)
            run.health = Health.CHECKPOINTED
            self.stopped[job_id] = self.runs.pop(job_id)
            events.append(Event(job_id, "preempt", 0, run.alloc.gpu_type,
                                "checkpointed on shutdown" if clean else "killed on shutdown"))
        return events

    def overheads(self) -> dict[str, list[tuple[str, float]]]:
        """(action, seconds from decision to the first iteration of the new group) per launch."""
        self.poll()
        return {j: list(r.history) for j, r in {**self.stopped, **self.runs}.items() if r.history}
