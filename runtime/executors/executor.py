"""The Executor base class: turn a round's decision into running workers, report progress.

Every engine (dry-run, local processes, Slurm, Ray, Kubernetes, a plug-in's) implements
the same three calls. ``apply`` receives the validated decision and the jobs the round
was solved for, and returns one :class:`Event` per action taken. ``poll``
returns one :class:`Progress` per job the executor knows: iterations done,
the measured iteration time (what the estimator is refitted from), the loss
and a health word. ``shutdown`` stops everything, checkpointing when asked
(SIGINT/SIGTERM in ``apportion run``). What a run's setup and loop ask of an executor
besides (how long its groups take to stop, what an earlier run left, closing) the base
class answers for an engine that has nothing of the kind, so drivers call it and never
probe; :func:`as_executor` runs an object written to the three calls alone (a plug-in
older than the base class) as an :class:`Executor`.

The decision's action is a *suggestion* computed from the scheduler's view;
the executor's own view of what runs is authoritative: a job the decision
keeps but whose workers died is restarted from its checkpoint, and a running
job that the decision no longer mentions is preempted. :func:`actions_for`
writes that reconciliation once for every engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from apportion.decision import Action, Allocation, Decision
from apportion.jobs import JobSpec


class Health(str, Enum):
    STARTING = "starting"  # launched, no iteration finished yet in this launch
    RUNNING = "running"
    CHECKPOINTED = "checkpointed"  # stopped with a checkpoint (preempted or between launches)
    FINISHED = "finished"
    FAILED = "failed"


@dataclass
class Event:
    """One action an executor took for one job."""

    job: str
    action: str  # an Action value, or "restart" for a keep whose workers had died
    workers: int = 0
    gpu_type: str = ""
    detail: str = ""
    wall: float = field(default_factory=time.time)
    spec: dict[str, Any] | None = None  # the launch spec, where the engine has one

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Progress:
    """What the scheduler learns about one job."""

    job: str
    iterations_done: int
    iterations: int
    health: Health
    iter_time_s: float | None = None
    loss: float | None = None
    workers: int = 0
    plan: str = ""
    reconfig_overhead_s: float | None = None  # decision -> first resumed iteration, last change
    error: str | None = None
    checkpoint_iterations: int | None = None  # the last checkpoint's iteration, where known
    launch_id: str = ""  # the worker group this report is about
    # the gradient statistics its workload last reported, (grad_sqr, grad_var), where any
    grad_stats: tuple[float, float] | None = None
    # the global batch the group runs where its round chose one (a job with a batch_range;
    # it keeps it until relaunched), None: the job's own; its iter_time_s is a step of it
    batch: int | None = None

    @property
    def done(self) -> bool:
        return self.health in (Health.FINISHED, Health.FAILED)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["health"] = self.health.value
        return d


class Executor(ABC):
    """One engine that runs decisions: the three calls every engine implements, and what the
    run asks of every executor besides, answered here for an engine with nothing of the
    kind (nothing left by an earlier run, no processes of its own to wait for, nothing to
    close). Every executor subclasses it."""

    #: the executor's registered name (``--executor``; the launch records' ``executor``)
    name: str = ""
    #: seconds a stopped worker group has to checkpoint and exit before it is killed; a run
    #: ending idle waits as long for groups still exiting. None: no processes of its own to
    #: wait for (dry-run; Kubernetes' pods have their own grace period)
    stop_timeout_s: float | None = None

    @abstractmethod
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        """Start, keep, resize, migrate and preempt jobs as ``decision`` says."""

    @abstractmethod
    def poll(self) -> list[Progress]:
        """Progress of every job this executor has run."""

    @abstractmethod
    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        """Stop every job (checkpointing first when ``checkpoint``)."""

    def reconcile(self, records: Sequence[Any], jobs: dict[str, JobSpec],
                  adopt: bool = True) -> list[Reconciled]:
        """Settle the open launch records an earlier (killed) run of this executor left
        (``jobs``: the store's active jobs): adopt or stop each group, and say what it left.
        None settled here: the run closes them and requeues their jobs from their last
        checkpoints."""
        return []

    def adopted_jobs(self) -> set[str]:
        """Jobs whose workers, left by an earlier run, this executor took over when it
        started (a restarted run keeps them running instead of requeueing them)."""
        return set()

    def stop_adopted(self) -> bool:
        """``--orphans stop``: checkpoint and stop what :meth:`adopted_jobs` names. True once
        stopped (the run requeues them); False where the engine cannot stop them here (they
        keep running, and stay the run's)."""
        return False

    def close(self) -> None:
        """Release what the executor holds (an API client, an embedded Ray); a run calls it
        last, after :meth:`shutdown` where the run stopped its jobs."""


@runtime_checkable
class Runs(Protocol):
    """The three calls and a name: what an ``apportion.executors`` plug-in's factory
    returned before the base class, which :func:`as_executor` runs as an executor."""

    name: str

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]: ...

    def poll(self) -> list[Progress]: ...

    def shutdown(self, checkpoint: bool = True) -> list[Event]: ...


def as_executor(obj: Any) -> Executor:
    """``obj`` as an :class:`Executor`: itself, or an object with the three calls and a name
    (:class:`Runs`) wrapped so that it runs as it did: what it defines of the rest it keeps,
    the base class answers what it does not. A TypeError names anything else."""
    if isinstance(obj, Executor):
        return obj
    if isinstance(obj, Runs) and obj.name:
        return _Plain(obj)
    raise TypeError(f"{obj!r} is not an executor: subclass apportion.runtime.executors."
                    "Executor (name, apply, poll, shutdown)")


class _Plain(Executor):
    """An executor written to the three calls alone, as an :class:`Executor` (see
    :func:`as_executor`): the one place that asks such an object what else it has."""

    def __init__(self, inner: Runs) -> None:
        self.inner = inner
        self.name = str(inner.name)
        grace = getattr(inner, "stop_timeout_s", None)
        self.stop_timeout_s = None if grace is None else float(grace)

    def _own(self, method: str) -> Any:
        found = getattr(self.inner, method, None)
        return found if callable(found) else None

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        return self.inner.apply(decision, state)

    def poll(self) -> list[Progress]:
        return self.inner.poll()

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        return self.inner.shutdown(checkpoint=checkpoint)

    def reconcile(self, records: Sequence[Any], jobs: dict[str, JobSpec],
                  adopt: bool = True) -> list[Reconciled]:
        own = self._own("reconcile")
        return list(own(records, jobs, adopt=adopt)) if own else []

    def adopted_jobs(self) -> set[str]:
        own = self._own("adopted_jobs")
        return set(own()) if own else set()

    def stop_adopted(self) -> bool:
        own = self._own("stop_adopted")
        if own is None:
            return False
        own()
        return True

    def close(self) -> None:
        own = self._own("close")
        if own is not None:
            own()


class LaunchLog(Protocol):
    """Where an executor records the worker groups it starts, intent first (see
    :mod:`apportion.store_launches`; :class:`MemoryLaunchLog` without a store)."""

    def begin(self, job: str, executor: str, action: str, plan: dict[str, Any],
              placement: dict[str, int], jobdir: str, checkpoint_start: int) -> int:
        """Record the intent; returns the launch id (before any process exists)."""
        ...

    def started(self, launch_id: int, workers: list[dict[str, Any]]) -> None: ...

    def stopping(self, launch_id: int, why: str) -> None: ...

    def ended(self, launch_id: int, outcome: str, detail: str = "",
              checkpoint_end: int | None = None) -> None: ...


@dataclass
class MemoryLaunchLog:
    """Launch records in memory: ids count up from 1 for this process only."""

    records: dict[int, dict[str, Any]] = field(default_factory=dict)

    def begin(self, job: str, executor: str, action: str, plan: dict[str, Any],
              placement: dict[str, int], jobdir: str, checkpoint_start: int) -> int:
        lid = len(self.records) + 1
        self.records[lid] = {"id": lid, "job": job, "executor": executor, "action": action,
                             "state": "intended", "plan": plan, "placement": placement,
                             "jobdir": jobdir, "checkpoint_start": checkpoint_start,
                             "workers": [], "outcome": None}
        return lid

    def started(self, launch_id: int, workers: list[dict[str, Any]]) -> None:
        self.records[launch_id].update(state="running", workers=workers)

    def stopping(self, launch_id: int, why: str) -> None:
        if self.records[launch_id]["state"] != "ended":
            self.records[launch_id]["state"] = "stopping"

    def ended(self, launch_id: int, outcome: str, detail: str = "",
              checkpoint_end: int | None = None) -> None:
        if self.records[launch_id]["state"] != "ended":
            self.records[launch_id].update(state="ended", outcome=outcome, detail=detail,
                                           checkpoint_end=checkpoint_end)


@dataclass
class Reconciled:
    """What reconciling one open launch record did, for the store to record (a restarted
    run asks the executor about the launches an earlier run left open)."""

    launch_id: int
    job: str
    action: str  # adopted | finished | stopped | checkpointed
    error: str | None
    checkpoint: int
    detail: str


@dataclass(frozen=True)
class Step:
    """One reconciled action: what to do with ``job`` and, unless preempting, where."""

    job: str
    action: Action
    allocation: Allocation | None
    restart: bool = False  # a KEEP whose workers are gone: relaunch from the checkpoint


def actions_for(decision: Decision, running: Iterable[str], alive: Iterable[str],
                finished: Iterable[str] = ()) -> list[Step]:
    """Reconcile the decision with what the executor actually runs.

    ``running``: jobs the executor currently holds resources for; ``alive``:
    those whose workers are up; ``finished``: jobs that completed (never
    relaunched). The order is preempt/stop first, then launches, so capacity is
    released before it is reused.
    """
    running, alive, finished = set(running), set(alive), set(finished)
    steps: list[Step] = []
    allocated = {a.job for a in decision.allocations}
    for job in sorted(running - allocated):
        steps.append(Step(job, Action.PREEMPT, None))
    for a in sorted(decision.allocations, key=lambda a: a.job):
        if a.job in finished:
            continue
        if a.job not in running:
            steps.append(Step(a.job, Action.START, a))
        elif a.action in (Action.RESIZE, Action.MIGRATE):
            steps.append(Step(a.job, a.action, a))
        elif a.job not in alive:
            steps.append(Step(a.job, Action.KEEP, a, restart=True))
        else:
            steps.append(Step(a.job, Action.KEEP, a))
    order = {Action.PREEMPT: 0, Action.RESIZE: 1, Action.MIGRATE: 1, Action.KEEP: 2,
             Action.START: 3}
    return sorted(steps, key=lambda s: (order.get(s.action, 9), s.job))


class FailureGate:
    """Hold the relaunch of a group that failed until the caller has seen the failure.

    An executor settles exited groups at the start of :meth:`Executor.apply`
    (so finished jobs are not relaunched). A group that failed after the
    caller's last :meth:`Executor.poll` would then be relaunched by the same
    apply, and the failure never reach the caller's fault policy (a
    crash-looping job relaunched forever, its failures uncounted). Executors
    record what each public ``poll`` returned with :meth:`saw`, settle inside
    ``apply`` under :meth:`quiet`, and skip launching the jobs :meth:`unseen`
    names this round; the next poll reports the failure.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._quiet = False

    def saw(self, progress: list[Progress]) -> list[Progress]:
        if not self._quiet:
            self._seen.update((p.job, str(p.launch_id)) for p in progress
                              if p.health == Health.FAILED)
        return progress

    def quiet(self) -> _Quiet:
        return _Quiet(self)

    def unseen(self, stopped: dict[str, Any]) -> set[str]:
        """Jobs whose last group failed without a poll having said so."""
        return {j for j, g in stopped.items() if g.health == Health.FAILED
                and (j, str(g.launch_id)) not in self._seen}

    @staticmethod
    def held(job: str, gpu_type: str) -> Event:
        return Event(job, "pending", 0, gpu_type,
                     "its workers failed; relaunched once the fault policy has seen the failure")


def steps_to_launch(steps: Iterable[Step], held: set[str], events: list[Event]) -> list[Step]:
    """The steps of ``apply`` that start a worker group; a kept job and a relaunch the
    :class:`FailureGate` holds become events instead (every executor's launch loop)."""
    out = []
    for s in steps:
        if s.allocation is None:
            continue
        if s.action == Action.KEEP and not s.restart:
            events.append(Event(s.job, "keep", s.allocation.plan.gpus, detail="no change"))
        elif s.job in held:
            events.append(FailureGate.held(s.job, s.allocation.gpu_type))
        else:
            out.append(s)
    return out


class _Quiet:
    def __init__(self, gate: FailureGate) -> None:
        self.gate = gate

    def __enter__(self) -> None:
        self.gate._quiet = True

    def __exit__(self, *exc: object) -> None:
        self.gate._quiet = False


class LingerWatch:
    """When a group still alive after its final checkpoint at the target has lingered
    ``linger_s`` seconds: the job is done (that checkpoint stands) and its processes hold
    devices, so the executor kills it and records the job finished. Why: a two-rank local
    group was seen at 6 of 6 iterations, checkpointed, and alive 120 s later, under load.
    Every executor that runs processes (local, Ray) asks the same watch."""

    def __init__(self, linger_s: float = 30.0) -> None:
        self.linger_s = linger_s
        self._since: dict[str, float] = {}  # group key -> monotonic time first seen at target

    def due(self, key: str, checkpoint: int, target: int, stopping: bool) -> bool:
        """True once the group ``key`` has been at its final checkpoint for ``linger_s``."""
        if stopping or checkpoint < target:
            self._since.pop(key, None)
            return False
        now = time.monotonic()
        since = self._since.setdefault(key, now)
        if now - since < self.linger_s:
            return False
        del self._since[key]
        return True
