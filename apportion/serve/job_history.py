"""One job's history, for its page: ``GET /api/v1/jobs/{id}?history=true``.

The job as ``GET /api/v1/jobs/{id}`` answers it (its state moves in ``events``), plus
what the rounds decided about it round by round, folded into runs
(:func:`apportion.store_decisions.job_decisions`), the worker groups executors launched
for it (:func:`apportion.store_launches.launches`) and counts read from its moves: how
often it was restarted, preempted, or interrupted by a fault.
"""

from __future__ import annotations

from typing import Any

from apportion.lifecycle import JobState
from apportion.serve.views import job_view, with_rfc3339
from apportion.store import StateStore
from apportion.store_decisions import job_decisions
from apportion.store_launches import launches

RUNNING = JobState.RUNNING.value
#: a move of a running job to running that relaunches its workers
RESHAPES = frozenset({"resize", "migrate"})
#: the most rounds' decisions one answer folds (the newest)
DECISION_ROUNDS = 2000


def move_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """From a job's state moves: ``starts`` (into running from waiting), ``restarts``
    (every start after the first, and every resize or migrate: each relaunches its
    workers), ``preemptions`` (a round preempted it) and ``interruptions`` (it stopped
    running for another cause: a fault, a lost worker, a launch that failed)."""
    starts = reshapes = preemptions = interruptions = 0
    for e in events:
        src, dst, why = e.get("src"), e.get("dst"), str(e.get("why") or "")
        if dst == RUNNING and src != RUNNING:
            starts += 1
        elif dst == RUNNING and why in RESHAPES:
            reshapes += 1
        elif src == RUNNING and dst in (JobState.QUEUED.value, JobState.CHECKPOINTED.value):
            if why.startswith("preempted"):
                preemptions += 1
            else:
                interruptions += 1
    return {"starts": starts, "restarts": max(0, starts - 1) + reshapes,
            "preemptions": preemptions, "interruptions": interruptions}


def job_history(store: StateStore, job_id: str,
                rounds: int = DECISION_ROUNDS) -> dict[str, Any]:
    """The job's row (:func:`apportion.serve.views.job_view`) with ``decisions`` (runs of
    identical decisions, newest first, from its last ``rounds`` rounds at most),
    ``decisions_truncated``, ``launches`` and the counts of :func:`move_counts`. Raises
    :class:`~apportion.store.UnknownJob`."""
    row = job_view(store, job_id)
    runs, more = job_decisions(store, job_id, rounds)
    row["decisions"] = [with_rfc3339(r, "first_at", "last_at") for r in runs]
    row["decisions_truncated"] = more
    row["launches"] = [with_rfc3339(rec.as_dict(), "created_at", "updated_at")
                       for rec in launches(store, job_id)]
    row.update(move_counts(row["events"]))
    return row
