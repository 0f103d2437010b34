"""The core of ``apportion run``: rounds every interval, applied through an executor.

Each round: read the jobs from the store, solve the round through the run's one
:class:`~apportion.policies.scheduler.Scheduler` (the pipeline validates its own decision
and never returns an invalid one), commit it through the store (the intent: a run killed
now leaves a store that says what it meant to do), apply it through the executor and
record what the executor did — the pipeline's commit and apply hooks, in that order;
between rounds, poll progress into the store. A job finishing triggers an early round (its
capacity is free) unless ``reschedule_on_finish`` is off; otherwise rounds are
``interval_s`` apart (Crius uses 5 minutes).

SIGINT and SIGTERM stop the loop cleanly: every running job is checkpointed
through ``executor.shutdown(checkpoint=True)`` and its last progress
recorded, so each job is left either finished or resumable. The state store
is any :class:`~apportion.round_store.RoundStore`; :class:`MemoryStore` is the in-memory
one the tests use (the SQLite store implements the same calls through
:class:`~apportion.runtime.store_adapter.SqliteRoundStore`).

Measured iteration times are handed to ``on_measure`` (when given) with the
round's estimate, so an estimator can refit when its error grows.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from apportion.runtime.executors.executor import Event, Executor, Health, Progress

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, Scheduler
from apportion.round_store import RoundStore, catalog_failures

log = logging.getLogger(__name__)

DONE_STATES = ("finished", "failed")
#: how long an event (a submission, a cancellation, a node's change) waits for more before
#: its round starts: a burst of submissions is decided in one round
DEBOUNCE_S = 1.0
#: the least time between the starts of two rounds an event brings forward
MIN_GAP_S = 2.0


@dataclass
class MemoryStore:
    """An in-memory :class:`~apportion.round_store.RoundStore` (for tests and embedding):
    its clock counts from the loop's start, and a job's submit time is on that clock."""

    jobs: dict[str, JobSpec] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)  # queued|running|finished|failed|...
    rounds: list[dict[str, Any]] = field(default_factory=list)
    progress_log: list[dict[str, Any]] = field(default_factory=list)

    def submit(self, job: JobSpec) -> None:
        self.jobs[job.id] = job
        self.states[job.id] = "queued"

    def now(self, elapsed_s: float) -> float:
        return elapsed_s

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        return [j for j in self.jobs.values() if j.submit_time_s <= now_s
                and self.states[j.id] not in DONE_STATES]

    def waiting(self, now_s: float) -> bool:
        return any(j.submit_time_s > now_s and self.states.get(j.id) not in DONE_STATES
                   for j in self.jobs.values())

    def arrived(self, since_s: float, until_s: float) -> bool:
        return any(since_s < j.submit_time_s <= until_s for j in self.jobs.values())

    def cluster_now(self, cluster: Cluster, now_s: float) -> Cluster:
        return cluster  # no node faults are kept in memory

    def history(self, now_s: float) -> Mapping[str, Any]:
        return {}  # no attained service is kept in memory: each round starts a job afresh

    def finished_jcts(self) -> Mapping[str, float]:
        return {}

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: Sequence[Event]) -> None:
        self.rounds.append({"index": index, "now_s": now_s, "decision": decision.as_dict(),
                            "events": [e.as_dict() for e in events]})
        for a in decision.allocations:
            if self.states.get(a.job) in DONE_STATES:
                continue
            self.jobs[a.job] = replace(self.jobs[a.job], running=RunningState(
                a.gpu_type, a.gpus, a.stages, dict(a.placement), a.plan.tp))
            self.states[a.job] = "running"
        for p in decision.pending:
            if self.jobs[p.job].running is not None:
                self.jobs[p.job] = replace(self.jobs[p.job], running=None)
                self.states[p.job] = "checkpointed"

    def record_events(self, index: int, events: Sequence[Event]) -> None:
        for r in self.rounds:
            if r["index"] == index:
                r["events"].extend(e.as_dict() for e in events)

    def record_progress(self, progress: Sequence[Progress]) -> None:
        for p in progress:
            if p.job not in self.jobs:
                continue
            self.progress_log.append(p.as_dict())
            job = replace(self.jobs[p.job], iterations_done=p.iterations_done)
            if p.grad_stats is not None:  # what its workload measured of its gradients
                job = replace(job, grad_stats=p.grad_stats)
            if p.health in (Health.FINISHED, Health.FAILED):
                self.states[p.job] = p.health.value
                job = replace(job, running=None)
            elif p.health == Health.CHECKPOINTED and self.states[p.job] == "stopping":
                job = replace(job, running=None)
            self.jobs[p.job] = job

    def mark_stopped(self, job_ids: Sequence[str]) -> None:
        """After a shutdown: the jobs hold no resources and resume from their checkpoints."""
        for j in job_ids:
            if self.states.get(j) not in DONE_STATES:
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


def run_loop(cluster: Cluster, store: RoundStore, executor: Executor, interval_s: float = 300.0,
             until_idle: bool = False, timeout_s: float | None = None,
             round_config: RoundConfig | None = None, poll_s: float = 0.5,
             reschedule_on_finish: bool = True,
             on_measure: Callable[[str, float | None, float], None] | None = None,
             refit: Any = None, on_round: Callable[[RoundTick], None] | None = None,
             should_stop: Callable[[], bool] | None = None,
             debounce_s: float = DEBOUNCE_S, min_gap_s: float = MIN_GAP_S) -> LoopResult:
    """Run rounds until idle (with ``until_idle``), ``timeout_s``, SIGINT/SIGTERM, or
    ``should_stop()`` turning true (checked while waiting between rounds; it stops the
    loop as a signal would: every running job checkpointed). ``on_round`` sees every pass;
    an observer that raises is logged and never stops the rounds.

    Rounds are event-driven, the interval their upper bound: a job's end, and anything the
    store saw since the last round read it (a submission, a cancellation, a node's fault or
    return: ``store.arrived``) start the next round ``debounce_s`` after the wait first saw
    it (a burst of submissions within that is one round) and at least ``min_gap_s`` after
    the last round started."""
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
    round_allocs: dict[str, Any] = {}
    round_jobs: dict[str, JobSpec] = {}
    applied: list[Event] = []  # what the executor did for this round (the apply hook's)

    def apply(decision: Decision) -> None:
        """The pipeline's apply hook: the round is committed (the intent); the executor
        acts on it, and what it did is recorded against the round."""
        applied[:] = executor.apply(decision, list(round_jobs.values()))
        store.record_events(rounds, applied)

    # one scheduler for the whole run: a policy's memory (Gavel's rounds received, the
    # formulation's re-solve cadence) lasts across rounds
    scheduler = Scheduler(round_config, store, apply,
                          estimator=refit.estimator if refit is not None else None)
    restart_meter = RestartMeter()
    try:
        while stop["signal"] is None:
            started = time.monotonic()
            # the store's clock: wall-clock where submit times are (queue bonuses then see
            # real waits); the in-memory store counts from the loop's start
            now = store.now(started - t0)
            jobs = store.list_jobs(now)
            decision: Decision | None = None
            events: list[Event] = []
            if until_idle and not jobs and not store.waiting(now):
                reason = "idle"
                break
            if jobs:
                round_jobs = {j.id: j for j in jobs}
                applied.clear()
                # the round's figures: its length is the loop's, its restart cost the
                # executor's, as measured; the nodes the store holds down are out
                decision = scheduler.step(cluster, now, rounds, jobs=jobs, interval_s=interval_s,
                                          restart_s=restart_meter.seconds()).decision
                events = list(applied)
                round_allocs = {a.job: a for a in decision.allocations}
                for p in catalog_failures(decision):  # failed by the commit
                    log.warning("job %s: failed: cannot be planned: %s", p.job, p.detail)
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
            event_at: float | None = None  # when the wait first saw a change
            while stop["signal"] is None and time.monotonic() < deadline:
                progress = executor.poll()
                store.record_progress(progress)
                restart_meter.observe(progress)
                _measured(progress, rounds, round_allocs, round_jobs, estimates, refit,
                          on_measure)
                if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
                    stop["signal"] = -1
                    break
                if should_stop is not None and should_stop():
                    stop["signal"] = -2
                    break
                newly_done = {p.job for p in progress if p.done} - seen_done
                if reschedule_on_finish and newly_done:
                    break
                if store.arrived(now, time.monotonic() - t0):
                    at = time.monotonic()
                    event_at = at if event_at is None else event_at
                    if at - event_at >= debounce_s and at - started >= min_gap_s:
                        break
                time.sleep(poll_s)
        if stop["signal"] is not None:
            reason = {-1: "timeout", -2: "stopped"}.get(stop["signal"], "signal")
    finally:
        last = _wind_down(executor, store, reason, poll_s, all_events)
        progress = progress if last is None else last
        scheduler.close()
        for signum, h in handlers.items():
            signal.signal(signum, h)
    return LoopResult(rounds, reason, progress, all_events)


def _measured(progress: list[Progress], rounds: int, round_allocs: dict[str, Any],
              round_jobs: dict[str, JobSpec], estimates: dict[str, float | None], refit: Any,
              on_measure: Callable[[str, float | None, float], None] | None) -> None:
    """Measured step times where jobs run: they recalibrate the next rounds' estimates
    (``refit``) and reach the caller's ``on_measure`` beside the round's estimate."""
    if refit is not None:
        for p in progress:
            a = round_allocs.get(p.job)
            if a is not None and p.iter_time_s and p.health == Health.RUNNING:
                job = round_jobs[p.job]
                if p.batch is not None:  # a step at the batch its group runs
                    job = replace(job, global_batch_size=p.batch)
                refit.observe(rounds, job, a, p.iter_time_s)
    if on_measure is not None:
        for p in progress:
            if p.iter_time_s is not None and p.health == Health.RUNNING:
                on_measure(p.job, estimates.get(p.job), p.iter_time_s)


def _wind_down(executor: Executor, store: RoundStore, reason: str, poll_s: float,
               all_events: list[Event]) -> list[Progress] | None:
    """The loop's end: idle, the last groups drained (the store may call a job finished
    before its group has exited); otherwise every job checkpointed and stopped. The last
    progress read, or None where nothing was read."""
    progress = None
    grace = executor.stop_timeout_s
    if reason == "idle" and grace is not None:
        progress = _drain(executor, store, poll_s, float(grace))
    if reason != "idle":
        stopped = executor.shutdown(checkpoint=True)
        all_events.extend(stopped)
        progress = executor.poll()
        store.record_progress(progress)
        store.mark_stopped([e.job for e in stopped])
    return progress


def _tell(on_round: Callable[[RoundTick], None], tick: RoundTick) -> None:
    """Hand a pass to its observer; an observer's bug is logged, the rounds go on."""
    try:
        on_round(tick)
    except Exception:  # observers (metrics, readiness) never stop scheduling
        log.exception("round observer failed on round %d", tick.index)


def _drain(executor: Executor, store: RoundStore, poll_s: float,
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
