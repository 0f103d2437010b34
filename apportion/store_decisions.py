"""What the rounds decided about each job: when a job was first decided, and one job's
decisions round by round.

**First decision.** A round that decides a submitted job (places it, or leaves it out
with a typed reason) moves it out of ``submitted`` in the round's own transaction
(:meth:`apportion.store.StateStore.commit_round`: ``admitted``, with the round's id), so
the first ``job_events`` row out of ``submitted`` that names a round is the job's first
decision, at the round's commit time. A job cancelled before any round leaves
``submitted`` without a round and has none; a round that read the job before a change
(its action stored ``applied = 0``) did not decide it either. ``/metrics`` reports the
time from submission to this moment as ``apportion_submit_to_decision_seconds``.

**A job's decisions.** Every round stores one ``actions`` row per job it considered
(start, keep, resize, migrate, preempt, drop, or pending with its reason). A job waiting
for a day under event-driven rounds has thousands of identical rows, so they are read
newest first, at most ``limit`` of them, and folded into runs: consecutive rounds that
decided the same thing are one entry with its first and last round and their count.
The rows are found through the primary key ``(round_id, job)`` over the rounds between
the job's first and last, never by scanning every round's actions.
"""

from __future__ import annotations

import json
from typing import Any

from apportion.store import StateStore

#: the fields of an action that make two rounds' decisions about a job the same
_SAME = ("action", "gpu_type", "gpus", "placement", "reason", "applied")


def first_decisions(store: StateStore) -> dict[str, float]:
    """Job id -> when the first round that decided it committed (jobs no round has decided
    yet are absent)."""
    rows = store.conn.execute(
        "SELECT job, MIN(at) FROM job_events WHERE src = 'submitted' AND round_id IS NOT NULL "
        "GROUP BY job").fetchall()
    return {str(j): float(at) for j, at in rows}


def job_decisions(store: StateStore, job_id: str, limit: int = 2000
                  ) -> tuple[list[dict[str, Any]], bool]:
    """The rounds' decisions about ``job_id`` folded into runs, newest first, from at most
    ``limit`` rounds; and whether older rounds decided about it too (left out)."""
    first = store.conn.execute("SELECT MIN(round_id) FROM job_events WHERE job = ? AND "
                               "round_id IS NOT NULL", (job_id,)).fetchone()[0]
    last = store.conn.execute("SELECT last_round FROM jobs WHERE id = ?",
                              (job_id,)).fetchone()
    if first is None or last is None or last[0] is None:
        return [], False
    rows = store.conn.execute(
        "SELECT r.id, r.committed_at, a.action, a.gpu_type, a.gpus, a.placement_json, "
        "a.reason, a.applied FROM rounds r JOIN actions a ON a.round_id = r.id AND a.job = ? "
        "WHERE r.id BETWEEN ? AND ? ORDER BY r.id DESC LIMIT ?",
        (job_id, int(first), int(last[0]), int(limit) + 1)).fetchall()
    more = len(rows) > limit
    runs: list[dict[str, Any]] = []
    for rid, at, action, gtype, gpus, place, reason, applied in rows[:limit]:
        row = {"action": str(action), "gpu_type": gtype, "gpus": gpus,
               "placement": json.loads(place) if place else None,
               "reason": reason or None, "applied": bool(applied)}
        if runs and all(runs[-1][k] == row[k] for k in _SAME):
            run = runs[-1]  # the same decision one round earlier: the run starts earlier
            run["first_round"], run["first_at"] = int(rid), float(at)
            run["rounds"] += 1
            continue
        runs.append({"first_round": int(rid), "last_round": int(rid), "rounds": 1,
                     "first_at": float(at), "last_at": float(at), **row})
    return runs, more
