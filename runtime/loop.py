"""The core of ``apportion run``: rounds every interval, applied through an executor.

Each round: read the jobs from the store, solve the round (``run_round``
validates its own decision and never returns an invalid one), record the
round (the intent: a run killed now leaves a store that says what it meant
to do), apply it through the executor, then record what the executor did;
between rounds, poll progress into the store. A job finishing triggers an early round (its
capacity is free) unless ``reschedule_on_finish`` is off; otherwise rounds
are ``interval_s`` apart (Crius uses 5 minutes).

SIGINT and SIGTERM stop the loop cleanly: every running job is checkpointed
through ``executor.shutdown(checkpoint=True)`` and its last progress
recorded, so each job is left either finished or resumable. The state store
is any object with the three calls of :class:`StoreLike`; :class:`MemoryStore`
is the in-memory one the tests use (the SQLite store implements the same
calls).

Measured iteration times are handed to ``on_measure`` (when given) with the
round's estimate, so an estimator can refit when its error grows.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any, Protocol

from apportion.runtime.executors.executor import Event, Executor, Health, Progress

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, policy_for, run_round

log = logging.getLogger(__name__)


class StoreLike(Protocol):
    """What the loop needs from a state store."""

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        """Jobs to schedule now (submitted, not finished or failed), each with
        ``iterations_done`` and ``running`` (its current allocation, or None)."""
        ...

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: list[Event]) -> None:
        """Persist one round: its decision and the actions the executor took."""
        ...

    def record_progress(self, progress: list[Progress]) -> None:
        """Persist polled progress; finished and failed jobs leave the schedule."""
        ...

    # optional: ``record_events(index, events)``, what the executor did for a recorded round


@dataclass
class MemoryStore:
    """An in-memory :class:`StoreLike` (for tests and embedding)."""

    jobs: dict[str, JobSpec] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)  # queued|running|finished|failed|...
    rounds: list[dict[str, Any]] = field(default_factory=list)
    progress_log: list[dict[str, Any]] = field(default_factory=list)

    def submit(self, job: JobSpec) -> None:
        self.jobs[job.id] = job
        self.states[job.id] = "queued"

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        return [j for j in self.jobs.values() if j.submit_time_s <= now_s
                and self.states[j.id] not in ("finished", "failed")]

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: list[Event]) -> None:
        self.rounds.append({"index": index, "now_s": now_s, "decision": decision.as_dict(),
                            "events": [e.as_dict() for e in events]})
        for a in decision.allocations:
            if self.states.get(a.job) in ("finished", "failed"):
                continue
            self.jobs[a.job] = replace(self.jobs[a.job], running=RunningState(
                a.gpu_type, a.gpus, a.stages, dict(a.placement), a.plan.tp))
            self.states[a.job] = "running"
        for p in decision.pending:
            if self.jobs[p.job].running is not None:
                self.jobs[p.job] = replace(self.jobs[p.job], running=None)
                self.states[p.job] = "checkpointed"

    def record_events(self, index: int, events: list[Event]) -> None:
        for r in self.rounds:
            if r["index"] == index:
                r["events"].extend(e.as_dict() for e in events)

    def record_progress(self, progress: list[Progress]) -> None:
        for p in progress:
            if p.job not in self.jobs:
                continue
            self.progress_log.append(p.as_dict())
            job = replace(self.jobs[p.job], iterations_done=p.iterations_done)
            if p.health in (Health.FINISHED, Health.FAILED):
                self.states[p.job] = p.health.value
                job = replace(job, running=None)
            elif p.health == Health.CHECKPOINTED and self.states[p.job] == "stopping":
                job = replace(job, running=None)
            self.jobs[p.job] = job

    def mark_stopped(self, job_ids: list[str]) -> None:
        """After a shutdown: the jobs hold no resources and resume from their checkpoints."""
        for j in job_ids:
            if self.states.get(j) not in ("finished", "failed"):
                self.jobs[j] = replace(self.jobs[j], running=None)
                self.states[j] = "checkpointed"


@dataclass
class LoopResult:
    rounds: int
    reason: str  # idle | timeout | signal | stopped (``should_stop`` said so)
    progress: list[Progress]
    events: list[Event]


@dataclass(frozen=True)
class RoundTick:
    """One pass of the loop, handed to ``on_round`` once it is over: what a process that
    embeds the loop (``apportion serve``: readiness, metrics) learns of each round.

    ``decision`` is None for a pass with nothing to schedule (the loop is alive all the
    same); ``duration_s`` spans reading the queue, solving, recording and applying.
    """

    index: int  # rounds solved so far, this one included
    finished_at: float  # wall clock
    duration_s: float
    decision: Decision | None
    events: list[Event]


class RestartMeter:
    """The restart cost this executor's launches have measured: the median, over every
    launch seen so far, of the time from the round's decision to its first iteration
    (``Progress.reconfig_overhead_s``: spawn, initialisation, the checkpoint's load).
    A move costs a job that much, so the objective charges it (``View.restart_s``); None
    until a launch has reported one (the objective then keeps its own figure)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], float] = {}

    def observe(self, progress: list[Progress]) -> None:
        for p in progress:
            if p.reconfig_overhead_s is not None:
                self._seen.setdefault((p.job, p.launch_id), float(p.reconfig_overhead_s))

    def seconds(self) -> float | None:
        return median(self._seen.values()) if self._seen else None


def run_loop(cluster: Cluster, store: StoreLike, executor: Executor, interval_s: float = 300.0,
             until_idle: bool = False, timeout_s: float | None = None,
             round_config: RoundConfig | None = None, poll_s: float = 0.5,
             reschedule_on_finish: bool = True,
             on_measure: Callable[[str, float | None, float], None] | None = None,
             refit: Any = None, on_round: Callable[[RoundTick], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> LoopResult:
    """Run rounds until idle (with ``until_idle``), ``timeout_s``, SIGINT/SIGTERM, or
    ``should_stop()`` turning true (checked while waiting between rounds; it stops the
    loop as a signal would: every running job checkpointed). ``on_round`` sees every pass;
    an observer that raises is logged and never stops the rounds."""
    t0 = time.monotonic()
    stop: dict[str, int | None] = {"signal": None}
    all_events: list[Event] = []
    estimates: dict[str, float | None] = {}

    def on_signal(signum: int, frame: Any) -> None:
        stop["signal"] = signum
        log.warning("signal %d: checkpointing every job and stopping", signum)

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[int(sig)] = signal.signal(sig, on_signal)
    rounds, reason = 0, "signal"
    progress: list[Progress] = []
    # a store that keeps wall-clock submit times tells the loop its clock (queue bonuses
    # then see real waits); the in-memory store counts from the loop's start
    clock = getattr(store, "now", None)
    round_allocs: dict[str, Any] = {}
    round_jobs: dict[str, JobSpec] = {}
    cfg = round_config or RoundConfig()
    # one policy object for the whole run: a policy's memory (Gavel's rounds received, the
    # formulation's re-solve cadence) lasts across rounds
    policy = policy_for(cfg, refit.estimator if refit is not None else None)
    restart_meter = RestartMeter()
    try:
        while stop["signal"] is None:
            started = time.monotonic()
            now = clock() if clock is not None else started - t0
            jobs = store.list_jobs(now)
            decision: Decision | None = None
            events: list[Event] = []
            if until_idle and not jobs and not _future_jobs(store, now):
                reason = "idle"
                break
            if jobs:
                history = getattr(store, "history", None)
                # the nodes up now: a node the store recorded down or quarantined is out
                cluster_now = getattr(store, "cluster_now", None)
                cl = cluster_now(now) if callable(cluster_now) else cluster
                decision = run_round(cl, jobs, now, cfg,
                                     estimator=refit.estimator if refit is not None else None,
                                     policy=policy,
                                     history=history(now) if callable(history) else None,
                                     # the round's figures: its length is the loop's,
                                     # its restart cost the executor's, as measured
                                     interval_s=interval_s,
                                     restart_s=restart_meter.seconds()).decision
                round_allocs = {a.job: a for a in decision.allocations}
                round_jobs = {j.id: j for j in jobs}
                store.record_round(rounds, now, decision, [])  # the intent, before acting
                events = executor.apply(decision, jobs)
                record_events = getattr(store, "record_events", None)
                if record_events is not None:
                    record_events(rounds, events)
                all_events.extend(events)
                estimates.update({a.job: a.iter_time_s for a in decision.allocations})
                rounds += 1
                log.info("round %d at %.1fs: %d allocations, %d pending, %d events", rounds, now,
                         len(decision.allocations), len(decision.pending), len(events))
            if on_round is not None:
                _tell(on_round, RoundTick(rounds, time.time(), time.monotonic() - started,
                                          decision, events))
            deadline = time.monotonic() + interval_s
            seen_done = {p.job for p in progress if p.done}
            while stop["signal"] is None and time.monotonic() < deadline:
                progress = executor.poll()
                store.record_progress(progress)
                restart_meter.observe(progress)
                if refit is not None:  # measured times recalibrate the next rounds' estimates
                    for p in progress:
                        a = round_allocs.get(p.job)
                        if a is not None and p.iter_time_s and p.health == Health.RUNNING:
                            refit.observe(rounds, round_jobs[p.job], a, p.iter_time_s)
                if on_measure is not None:
                    for p in progress:
                        if p.iter_time_s is not None and p.health == Health.RUNNING:
                            on_measure(p.job, estimates.get(p.job), p.iter_time_s)
                if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
                    stop["signal"] = -1
                    break
                if should_stop is not None and should_stop():
                    stop["signal"] = -2
                    break
                newly_done = {p.job for p in progress if p.done} - seen_done
                if reschedule_on_finish and newly_done:
                    break
                if _arrivals(store, now, time.monotonic() - t0):
                    break
                time.sleep(poll_s)
        if stop["signal"] is not None:
            reason = {-1: "timeout", -2: "stopped"}.get(stop["signal"], "signal")
    finally:
        grace = getattr(executor, "stop_timeout_s", getattr(executor, "grace_s", None))
        if reason == "idle" and grace is not None:
            # the store may call a job finished before its group has exited
            progress = _drain(executor, store, poll_s, float(grace))
        if reason != "idle":
            stopped = executor.shutdown(checkpoint=True)
            all_events.extend(stopped)
            progress = executor.poll()
            store.record_progress(progress)
            mark = getattr(store, "mark_stopped", None)
            if mark is not None:
                mark([e.job for e in stopped])
        for signum, h in handlers.items():
            signal.signal(signum, h)
    return LoopResult(rounds, reason, progress, all_events)


def _tell(on_round: Callable[[RoundTick], None], tick: RoundTick) -> None:
    """Hand a pass to its observer; an observer's bug is logged, the rounds go on."""
    try:
        on_round(tick)
    except Exception:  # observers (metrics, readiness) never stop scheduling
        log.exception("round observer failed on round %d", tick.index)


def _drain(executor: Executor, store: StoreLike, poll_s: float,
           limit_s: float) -> list[Progress]:
    """Wait for groups still exiting (a job the store finished at its target iteration,
    whose group writes its final checkpoint), so their launches are closed and no worker
    outlives the run; a group still there after ``limit_s`` is stopped with a checkpoint."""
    def live(ps: list[Progress]) -> bool:
        return any(p.health in (Health.STARTING, Health.RUNNING) for p in ps)

    deadline = time.monotonic() + limit_s
    progress = executor.poll()
    while live(progress) and time.monotonic() < deadline:
        time.sleep(poll_s)
        progress = executor.poll()
    if live(progress):
        executor.shutdown(checkpoint=True)
        progress = executor.poll()
    store.record_progress(progress)
    return progress


def _future_jobs(store: StoreLike, now: float) -> bool:
    """Jobs submitted for a later time (only stores that expose ``jobs`` can tell)."""
    jobs = getattr(store, "jobs", None)
    states = getattr(store, "states", {})
    if not isinstance(jobs, dict):
        return False
    return any(j.submit_time_s > now and states.get(j.id) not in ("finished", "failed")
               for j in jobs.values())


def _arrivals(store: StoreLike, last_round: float, now: float) -> bool:
    """A job became visible since the last round: solve again now."""
    jobs = getattr(store, "jobs", None)
    if not isinstance(jobs, dict):
        return False
    return any(last_round < j.submit_time_s <= now for j in jobs.values())
