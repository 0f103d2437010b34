"""Launch records: every worker group ``apportion run`` starts, written before it starts.

A run that is SIGKILLed leaves its workers training. The next run must find
them (to adopt or stop them), must never start a second group into the same
job folder, and must not lose the job. So every launch goes through the
store, intent first, one transaction per step:

* :func:`begin_launch` -- ``intended``: the store assigns the **launch id**
  (``AUTOINCREMENT``: per store, strictly increasing, never reused, even
  across crashes) before a process exists;
* :func:`launch_started` -- ``running`` with the workers (pid, process start
  time, host, or an engine's ids);
* :func:`launch_stopping` -- ``stopping``, recorded before the stop is sent;
* :func:`launch_ended` -- ``ended`` with an outcome (``finished``,
  ``checkpointed``, ``failed``, ``stopped``) and the last checkpoint;
* :func:`adopt_launch` -- a new run takes over a running group (the owner
  changes; the launch id does not).

Every state change is logged in ``launch_events``; a trigger refuses illegal
moves and deletions. :func:`open_launches` is what a restarted run
reconciles. The fault policy reads :func:`consecutive_failures`: failed
launches in a row that saved no new checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from apportion.lifecycle import JobState
from apportion.store import StateStore

log = logging.getLogger(__name__)

OUTCOMES = ("finished", "checkpointed", "failed", "stopped")


@dataclass
class LaunchRecord:
    id: int
    job: str
    executor: str
    action: str
    state: str
    plan: dict[str, Any]
    placement: dict[str, int]
    jobdir: str
    workers: list[dict[str, Any]]
    owner: str
    checkpoint_start: int
    checkpoint_end: int | None
    outcome: str | None
    detail: str
    created_at: float
    updated_at: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_COLS = ("id, job, executor, action, state, plan_json, placement_json, jobdir, workers_json, "
         "owner, checkpoint_start, checkpoint_end, outcome, detail, created_at, updated_at")


def _record(row: tuple[Any, ...]) -> LaunchRecord:
    return LaunchRecord(int(row[0]), row[1], row[2], row[3], row[4], json.loads(row[5]),
                        json.loads(row[6]), row[7], json.loads(row[8]), row[9], int(row[10]),
                        None if row[11] is None else int(row[11]), row[12], row[13], row[14],
                        row[15])


def _move(store: StateStore, launch_id: int, dst: str, why: str, at: float,
          **cols: Any) -> LaunchRecord:
    """Change one launch's state and columns and log it (inside the caller's transaction)."""
    c = store.conn
    row = c.execute(f"SELECT {_COLS} FROM launches WHERE id = ?", (launch_id,)).fetchone()
    if row is None:
        raise KeyError(f"no launch {launch_id}")
    rec = _record(row)
    sets, args = ["state = ?", "updated_at = ?"], [dst, at]
    for k, v in cols.items():
        sets.append(f"{k} = ?")
        args.append(json.dumps(v, sort_keys=True) if k.endswith("_json") else v)
    c.execute(f"UPDATE launches SET {', '.join(sets)} WHERE id = ?", (*args, launch_id))
    c.execute("INSERT INTO launch_events(launch, src, dst, at, why) VALUES (?, ?, ?, ?, ?)",
              (launch_id, rec.state, dst, at, why))
    return rec


def begin_launch(store: StateStore, job: str, executor: str, action: str, plan: dict[str, Any],
                 placement: dict[str, int], jobdir: str, owner: str, checkpoint_start: int = 0,
                 at: float | None = None) -> int:
    """Record the intent to launch a group; returns its launch id (committed before any spawn)."""
    at = time.time() if at is None else at
    with store.transaction() as c:
        cur = c.execute(
            "INSERT INTO launches(job, executor, action, state, plan_json, placement_json, "
            "jobdir, owner, checkpoint_start, created_at, updated_at) "
            "VALUES (?, ?, ?, 'intended', ?, ?, ?, ?, ?, ?, ?)",
            (job, executor, action, json.dumps(plan, sort_keys=True),
             json.dumps(placement, sort_keys=True), jobdir, owner, int(checkpoint_start), at, at))
        lid = int(cur.lastrowid or 0)
        c.execute("INSERT INTO launch_events(launch, src, dst, at, why) VALUES (?, NULL, "
                  "'intended', ?, ?)", (lid, at, action))
    return lid


def launch_started(store: StateStore, launch_id: int, workers: list[dict[str, Any]],
                   at: float | None = None) -> None:
    at = time.time() if at is None else at
    with store.transaction():
        _move(store, launch_id, "running", f"{len(workers)} workers", at, workers_json=workers)


def launch_stopping(store: StateStore, launch_id: int, why: str, at: float | None = None) -> None:
    """Record that the group is being stopped (before the stop request is sent)."""
    at = time.time() if at is None else at
    with store.transaction():
        rec = launch(store, launch_id)
        if rec.state in ("intended", "running"):
            _move(store, launch_id, "stopping", why, at)


def launch_ended(store: StateStore, launch_id: int, outcome: str, detail: str = "",
                 checkpoint_end: int | None = None, at: float | None = None) -> bool:
    """Close a launch; False (and nothing written) when it was already closed."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    at = time.time() if at is None else at
    with store.transaction():
        rec = launch(store, launch_id)
        if rec.state == "ended":
            return False
        _move(store, launch_id, "ended", f"{outcome}: {detail}"[:2000], at, outcome=outcome,
              detail=detail[:4000], checkpoint_end=checkpoint_end)
    return True


def adopt_launch(store: StateStore, launch_id: int, owner: str, at: float | None = None) -> None:
    """A restarted run takes over a group that is still running."""
    at = time.time() if at is None else at
    with store.transaction() as c:
        rec = launch(store, launch_id)
        c.execute("UPDATE launches SET owner = ?, updated_at = ? WHERE id = ?",
                  (owner, at, launch_id))
        c.execute("INSERT INTO launch_events(launch, src, dst, at, why) VALUES (?, ?, ?, ?, ?)",
                  (launch_id, rec.state, rec.state, at, f"adopted by {owner} from {rec.owner}"))


def launch(store: StateStore, launch_id: int) -> LaunchRecord:
    row = store.conn.execute(f"SELECT {_COLS} FROM launches WHERE id = ?",
                             (launch_id,)).fetchone()
    if row is None:
        raise KeyError(f"no launch {launch_id}")
    return _record(row)


def launches(store: StateStore, job: str | None = None) -> list[LaunchRecord]:
    q = f"SELECT {_COLS} FROM launches"
    rows = (store.conn.execute(q + " WHERE job = ? ORDER BY id", (job,)) if job is not None
            else store.conn.execute(q + " ORDER BY id")).fetchall()
    return [_record(r) for r in rows]


def open_launches(store: StateStore, executor: str | None = None) -> list[LaunchRecord]:
    """Launches not yet ended (a restarted run reconciles these), oldest first."""
    q = f"SELECT {_COLS} FROM launches WHERE state != 'ended'"
    rows = (store.conn.execute(q + " AND executor = ? ORDER BY id", (executor,))
            if executor is not None else store.conn.execute(q + " ORDER BY id")).fetchall()
    return [_record(r) for r in rows]


def launch_events(store: StateStore, launch_id: int | None = None) -> list[dict[str, Any]]:
    q = "SELECT seq, launch, src, dst, at, why FROM launch_events"
    rows = (store.conn.execute(q + " WHERE launch = ? ORDER BY seq", (launch_id,))
            if launch_id is not None else store.conn.execute(q + " ORDER BY seq")).fetchall()
    return [dict(zip(("seq", "launch", "src", "dst", "at", "why"), r)) for r in rows]


def consecutive_failures(store: StateStore, job: str) -> int:
    """Failed launches of ``job`` in a row (newest first) that saved no new checkpoint."""
    n = 0
    for rec in reversed(launches(store, job)):
        if rec.state != "ended":
            continue
        if rec.outcome != "failed":
            break
        if rec.checkpoint_end is not None and rec.checkpoint_end > rec.checkpoint_start:
            break  # it failed, but only after saving progress: the job is not crash-looping
        n += 1
    return n


def settle_checkpoint(store: StateStore, job: str, checkpoint: int, why: str,
                      at: float | None = None) -> None:
    """What a stopped or vanished group left on disk, applied to the job.

    A running job goes back to the queue from ``checkpoint`` (its workers are
    gone; this is the scheduler's restart, not the job's fault, so nothing is
    counted against it). A job that is not running records ``checkpoint`` as
    its progress when it is further than what the store knows.
    """
    at = time.time() if at is None else at
    with store.transaction() as c:
        rec = store.job(job)
        if checkpoint >= rec.iterations and rec.state in (JobState.RUNNING,
                                                           JobState.CHECKPOINTED):
            store._move(rec, JobState.FINISHED, f"reached its iterations ({why})", at,
                        iterations_done=rec.iterations, checkpoint_iterations=rec.iterations)
        elif rec.state is JobState.RUNNING:
            ck = max(rec.checkpoint_iterations, min(checkpoint, rec.iterations))
            dst = JobState.CHECKPOINTED if ck > 0 else JobState.QUEUED
            store._move(rec, dst, why, at, iterations_done=ck, checkpoint_iterations=ck)
        elif rec.state in (JobState.CHECKPOINTED, JobState.QUEUED) and \
                checkpoint > rec.checkpoint_iterations:
            ck = min(checkpoint, rec.iterations)
            c.execute("UPDATE jobs SET iterations_done = ?, checkpoint_iterations = ?, "
                      "version = version + 1, updated_at = ? WHERE id = ?", (ck, ck, at, job))
