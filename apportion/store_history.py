"""Attained service from the state store: the history a scheduler keeps about each job.

Policies such as Tiresias (least attained service first), Gandiva, Gavel
(rounds received) and Sia read what a job has had so far: GPU-seconds,
seconds run, time per GPU type, when it first started, how often it was
preempted or restarted. In a replay the simulator keeps that bookkeeping; on
a real cluster it is in the store, and :func:`job_histories` reads it back,
so ``solve-round --state`` and ``apportion run`` give every policy the same
view of history the simulator gives it.

Running intervals come from the job's state transitions (``job_events``:
into ``running`` opens one, out of it closes it); the GPUs held during an
interval from the applied actions of the rounds (``actions`` joined with
``rounds``: start, keep, resize and migrate name the GPU type and count from
that round on).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

RUNNING_ACTIONS = ("start", "keep", "resize", "migrate")


@dataclass
class JobHistory:
    """What one job has had so far (the fields of :class:`apportion.view.JobView`)."""

    gpu_seconds: float = 0.0
    run_seconds: float = 0.0
    time_on_type: dict[str, float] = field(default_factory=dict)
    first_start: float | None = None
    restarts: int = 0  # relaunches on a new shape or place (resize, migrate)
    preemptions: int = 0
    rounds_run: int = 0


def job_histories(store: Any, now_s: float, jobs: set[str] | None = None) -> dict[str, JobHistory]:
    """Every job's (or those in ``jobs``) attained service up to ``now_s``."""
    conn = store.conn
    timeline: dict[str, list[tuple[float, int, str, Any, Any]]] = defaultdict(list)
    for job, dst, at in conn.execute("SELECT job, dst, at FROM job_events ORDER BY seq"):
        if jobs is None or job in jobs:
            timeline[job].append((float(at), 1, "state", dst, None))
    for job, action, gtype, gpus, t in conn.execute(
            "SELECT a.job, a.action, a.gpu_type, a.gpus, r.committed_at FROM actions a "
            "JOIN rounds r ON r.id = a.round_id WHERE a.applied = 1 ORDER BY r.id"):
        if jobs is None or job in jobs:
            timeline[job].append((float(t), 0, "action", action, (gtype, int(gpus or 0))))
    return {job: _fold(sorted(items, key=lambda x: (x[0], x[1])), now_s)
            for job, items in timeline.items()}  # a round's action before the move it causes


def finished_jcts(store: Any) -> dict[str, float]:
    """Every finished job's JCT (its finish minus its spec's submission time): what a
    policy that ranks against the jobs it has seen (``tail_quantile``) remembers between
    rounds, which ``solve-round --state`` makes one process at a time."""
    from apportion.lifecycle import JobState

    return {r.id: max(0.0, r.updated_at - float(r.spec.get("submit_time_s") or r.submitted_at))
            for r in store.jobs(frozenset({JobState.FINISHED}))}


def _fold(items: list[tuple[float, int, str, Any, Any]], now_s: float) -> JobHistory:
    """One job's time line (actions and state moves, in time order) summed up to ``now_s``."""
    h = JobHistory()
    running_since: float | None = None
    held: tuple[str | None, int] = (None, 0)

    def close(until: float) -> None:
        nonlocal running_since
        if running_since is None:
            return
        dt = max(0.0, min(until, now_s) - running_since)
        gtype, gpus = held
        h.run_seconds += dt
        h.gpu_seconds += dt * gpus
        if gtype:
            h.time_on_type[gtype] = h.time_on_type.get(gtype, 0.0) + dt
        running_since = None

    for t, _, kind, what, alloc in items:
        if t > now_s:
            break
        if kind == "action":
            if what in RUNNING_ACTIONS and alloc[1] > 0:
                if running_since is not None:  # a new shape from this round on
                    close(t)
                    running_since = t
                held = alloc
                h.rounds_run += 1
                h.restarts += what in ("resize", "migrate")
            elif what == "preempt":
                h.preemptions += 1
            continue
        if what == "running":
            if running_since is None:
                running_since = t
            if h.first_start is None:
                h.first_start = t
        else:
            close(t)
    close(now_s)
    return h
