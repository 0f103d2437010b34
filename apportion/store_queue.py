"""The queue and the tenants as the store holds them, read in SQL without loading a job.

``status --json`` and ``GET /api/v1/jobs`` read every job's row whole (its spec parsed,
its last round's decision parsed for the waiting reason): right for a list, and seconds
at 20,000 jobs. A dashboard that refreshes every few seconds, and ``/metrics`` scraped
every 30, need only a few columns of each waiting job and a count per reason. Here they
come from one query each: the spec's fields through SQLite's ``json_extract``, and a
waiting job's typed reason from the ``actions`` row of its last round (its primary key
is ``(round_id, job)``: one lookup per job), which holds the same reason the round's
decision gives it (:meth:`apportion.store.StateStore.commit_round` writes both in one
transaction), so the counts are those of :func:`apportion.store_status.pending_details`.
The longest waits are the first waiting jobs in submission order (the ``seq`` index), read
until there are enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apportion.lifecycle import JobState
from apportion.store import StateStore

#: the states of a job that waits for GPUs
WAITING = (JobState.SUBMITTED.value, JobState.QUEUED.value, JobState.CHECKPOINTED.value)
_IN_WAITING = ", ".join(f"'{s}'" for s in WAITING)
#: the reason of a waiting job no round has considered yet (``/metrics`` labels it so)
NOT_YET = "not-yet-considered"
#: a job's tenant as the metrics name it (a spec without one is the default tenant's)
TENANT_SQL = "COALESCE(json_extract(j.spec_json, '$.tenant'), 'default')"


@dataclass(frozen=True)
class WaitingJob:
    """One waiting job: what a queue's summary shows of it."""

    id: str
    state: str
    tenant: str
    requested_gpus: int | None
    requested_gpu_type: str | None
    guaranteed: bool
    submitted_at: float
    #: when it entered its state (a checkpointed job: when it stopped)
    since: float
    last_round: int | None
    #: the typed reason its last round left it out with; None: no round has considered it
    #: (or its last round placed it and it came back, a launch that failed)
    reason: str | None


@dataclass(frozen=True)
class ReasonCount:
    """The waiting jobs of one typed reason (None: no round has considered them yet)."""

    reason: str | None
    jobs: int
    #: the GPUs they ask for
    gpus: int
    #: the submission time of the earliest submitted of them
    oldest_submitted_at: float


# a waiting job's reason: its last round's action row (an empty reason: it was placed)
_WAITING_FROM = ("FROM jobs j LEFT JOIN actions a ON a.round_id = j.last_round AND a.job = j.id "
                 f"WHERE j.state IN ({_IN_WAITING})")


def reason_counts(store: StateStore) -> list[ReasonCount]:
    """The waiting jobs counted by reason, most first (one grouped query)."""
    rows = store.conn.execute(
        "SELECT NULLIF(a.reason, ''), COUNT(*), SUM(COALESCE(json_extract(j.spec_json, "
        f"'$.requested_gpus'), 0)), MIN(j.submitted_at) {_WAITING_FROM} "
        "GROUP BY NULLIF(a.reason, '')").fetchall()
    out = [ReasonCount(r[0], int(r[1]), int(r[2] or 0), float(r[3])) for r in rows]
    return sorted(out, key=lambda r: (-r.jobs, r.reason or ""))


def longest_waiting(store: StateStore, limit: int, reason: str | None = None,
                    any_reason: bool = True) -> list[WaitingJob]:
    """The ``limit`` waiting jobs submitted first (the longest waits): of every reason
    with ``any_reason``, else of ``reason`` only (None: those no round has considered).
    Walks the jobs in submission order and stops at ``limit``."""
    where = ""
    args: list[Any] = [int(limit)]
    if not any_reason:
        where = (" AND NULLIF(a.reason, '') IS NULL" if reason is None
                 else " AND a.reason = ?")
        args = ([] if reason is None else [reason]) + args
    rows = store.conn.execute(
        f"SELECT j.id, j.state, {TENANT_SQL}, json_extract(j.spec_json, '$.requested_gpus'), "
        "json_extract(j.spec_json, '$.requested_gpu_type'), "
        "json_extract(j.spec_json, '$.guaranteed'), j.submitted_at, j.updated_at, "
        f"j.last_round, NULLIF(a.reason, '') {_WAITING_FROM}{where} ORDER BY j.seq LIMIT ?",
        args).fetchall()
    return [WaitingJob(str(r[0]), str(r[1]), str(r[2]),
                       None if r[3] is None else int(r[3]),
                       None if r[4] is None else str(r[4]), bool(r[5]), float(r[6]),
                       float(r[7]), None if r[8] is None else int(r[8]), r[9])
            for r in rows]


@dataclass
class TenantUse:
    """One tenant: its jobs per state, the GPUs its running jobs hold (per type, and those
    of its guaranteed jobs, which its quota bounds) and its longest wait."""

    tenant: str
    jobs: dict[str, int]
    gpus: dict[str, int]
    guaranteed_gpus: int = 0
    #: the submission time of its earliest-submitted waiting job (None: none waits)
    oldest_waiting_since: float | None = None

    @property
    def gpus_held(self) -> int:
        return sum(self.gpus.values())

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "jobs": dict(sorted(self.jobs.items())),
                "gpus": dict(sorted(self.gpus.items())), "gpus_held": self.gpus_held,
                "guaranteed_gpus": self.guaranteed_gpus,
                "oldest_waiting_since": self.oldest_waiting_since}


def tenant_use(store: StateStore) -> dict[str, TenantUse]:
    """Every tenant that has a job, by name (two grouped queries, no job loaded)."""
    out: dict[str, TenantUse] = {}
    for tenant, state, n, oldest in store.conn.execute(
            f"SELECT {TENANT_SQL}, j.state, COUNT(*), MIN(j.submitted_at) FROM jobs j "
            "GROUP BY 1, 2"):
        t = out.setdefault(str(tenant), TenantUse(str(tenant), {}, {}))
        t.jobs[str(state)] = int(n)
        if state in WAITING and (t.oldest_waiting_since is None
                                 or oldest < t.oldest_waiting_since):
            t.oldest_waiting_since = float(oldest)
    for tenant, gtype, gpus, guaranteed in store.conn.execute(
            f"SELECT {TENANT_SQL}, json_extract(j.running_json, '$.gpu_type'), "
            "SUM(json_extract(j.running_json, '$.gpus')), "
            "SUM(CASE WHEN json_extract(j.spec_json, '$.guaranteed') THEN "
            "json_extract(j.running_json, '$.gpus') ELSE 0 END) "
            "FROM jobs j WHERE j.state = 'running' GROUP BY 1, 2"):
        t = out.setdefault(str(tenant), TenantUse(str(tenant), {}, {}))
        t.gpus[str(gtype)] = int(gpus or 0)
        t.guaranteed_gpus += int(guaranteed or 0)
    return out


def recent_finished(store: StateStore, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` jobs that finished last, oldest first: id, when it finished and its
    JCT (finish minus its spec's submission time, or the store's when it gave none: the
    rule of :func:`apportion.store_history.finished_jcts`)."""
    rows = store.conn.execute(
        "SELECT j.id, j.updated_at, j.updated_at - COALESCE(NULLIF(json_extract("
        "j.spec_json, '$.submit_time_s'), 0), j.submitted_at) FROM jobs j "
        "WHERE j.state = 'finished' ORDER BY j.updated_at DESC LIMIT ?",
        (int(limit),)).fetchall()
    return [{"id": str(r[0]), "finished_at": float(r[1]), "jct_s": max(0.0, float(r[2]))}
            for r in reversed(rows)]
