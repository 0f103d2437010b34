"""What the API's read routes answer, read from one store connection.

Plain functions from a :class:`~apportion.store.StateStore` (and the cluster the loop
schedules) to JSON-ready dicts, so the answers are the same as ``status --json`` and
``history --json`` (they share :mod:`apportion.store_status`) and are testable without a
server.

**Times.** Every instant the API gives as Unix seconds (``submitted_at``, ``updated_at``,
``committed_at``, an event's ``at``: the keys clients already read, kept) comes with the
same instant in RFC 3339 (``submitted_at_rfc3339``, ...; UTC, milliseconds, ``Z``), the
convention of HTTP APIs and of Kubernetes' own.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from apportion.cluster import Cluster
from apportion.lifecycle import JobState
from apportion.serve.decision_cache import DECISIONS
from apportion.store import JobRecord, StateStore
from apportion.store_faults import effective_cluster, node_states
from apportion.store_status import estimate_sources, pending_details

RFC3339 = "_rfc3339"  # the suffix of a float time's RFC 3339 twin


def rfc3339(t: float | None) -> str | None:
    """Unix seconds as RFC 3339 (UTC, milliseconds: ``2026-12-07T16:35:00.123Z``)."""
    if t is None:
        return None
    at = datetime.datetime.fromtimestamp(float(t), datetime.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_rfc3339(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``row`` with an RFC 3339 twin beside each float time of ``keys`` it holds."""
    for k in keys:
        if k in row:
            row[k + RFC3339] = rfc3339(row[k])
    return row


def _row(rec: JobRecord, pending: dict[str, dict[str, str]],
         sources: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    row = rec.as_dict()
    row["submitted_at"] = rec.submitted_at
    row["updated_at"] = rec.updated_at
    with_rfc3339(row, "submitted_at", "updated_at")
    # a finished job's JCT as the policies remember it (store_history.finished_jcts)
    row["jct_s"] = (max(0.0, rec.updated_at - float(rec.spec.get("submit_time_s")
                                                    or rec.submitted_at))
                    if rec.state is JobState.FINISHED else None)
    why = pending.get(rec.id)
    row["pending_reason"] = why["reason"] if why else None
    row["pending_detail"] = why["detail"] if why else None
    row["pending_stage"] = why["stage"] if why else None
    row["can_ever_fit"] = why["can_ever_fit"] if why else None
    src = (sources or {}).get(rec.id)  # what a running job's estimate rests on
    row["estimator"] = src["estimator"] if src else None
    row["estimate_source"] = src["source"] if src else None
    return row


def jobs_view(store: StateStore, after: int = 0, limit: int | None = None,
              states: frozenset[JobState] | None = None,
              tenant: str | None = None) -> dict[str, Any]:
    """The jobs (submission order) with their waiting reasons, and the count per state of
    every job. With ``limit``, one page: the jobs after the one numbered ``after``, and in
    ``next_cursor`` the number to ask the next page after (None on the last page).
    ``states`` and ``tenant`` keep only those jobs (``counts`` counts every job)."""
    recs, cursor = store.jobs_page(after, limit, states, tenant)
    load = DECISIONS.loader(store)
    pending = pending_details(store, recs, load)
    sources = estimate_sources(store, recs, load)
    return {"jobs": [_row(r, pending, sources) for r in recs], "counts": store.job_counts(),
            "next_cursor": None if cursor is None else str(cursor)}


def job_view(store: StateStore, job_id: str) -> dict[str, Any]:
    """One job: its row, allocation and plan while running, progress and its state moves.
    Raises :class:`~apportion.store.UnknownJob`."""
    rec = store.job(job_id)
    load = DECISIONS.loader(store)
    row = _row(rec, pending_details(store, [rec], load), estimate_sources(store, [rec], load))
    plan = None
    if rec.state is JobState.RUNNING and rec.last_round is not None:
        try:
            decision = load(rec.last_round)
        except KeyError:
            decision = {}
        for a in decision.get("allocations", []):
            if isinstance(a, dict) and a.get("job") == rec.id:
                plan = a.get("plan")
    row["allocation"] = rec.running if rec.state is JobState.RUNNING else None
    row["plan"] = plan
    row["progress"] = {"iterations_done": rec.iterations_done, "iterations": rec.iterations,
                       "checkpoint_iterations": rec.checkpoint_iterations,
                       "fraction": rec.iterations_done / rec.iterations if rec.iterations
                       else 0.0}
    row["events"] = [with_rfc3339(e, "at") for e in store.events(rec.id)]
    return row


def rounds_view(store: StateStore, limit: int, before: int | None = None) -> dict[str, Any]:
    """The last ``limit`` rounds (numbered below ``before``, if given), oldest first, each
    with its solver report and actions (what ``history --json`` prints); ``next_cursor`` is
    the number to ask older rounds before (None when there are none)."""
    rounds = store.rounds(limit, before)
    for r in rounds:
        try:
            r["solver"] = store.decision(r["id"])["solver"]
        except KeyError:
            r["solver"] = {}
        r["actions"] = store.actions(r["id"])
        r.pop("cluster", None)  # the capacity the round saw: /api/v1/cluster has it now
        with_rfc3339(r, "committed_at")
    older = bool(rounds) and bool(store.rounds(1, rounds[0]["id"]))
    return {"rounds": rounds, "next_cursor": str(rounds[0]["id"]) if older else None}


def gpu_use(store: StateStore, cluster: Cluster,
            now: float | None = None) -> dict[str, dict[str, int]]:
    """Per GPU type: capacity (down and quarantined nodes count for none), allocated to
    running jobs, and free."""
    now = time.time() if now is None else now
    cap = effective_cluster(store, cluster, now).capacity_by_type()
    used: Counter[str] = Counter()
    for rec in store.jobs(frozenset({JobState.RUNNING})):
        if rec.running:
            used[str(rec.running["gpu_type"])] += int(rec.running["gpus"])
    return {t: {"capacity": cap.get(t, 0), "allocated": used.get(t, 0),
                "free": max(0, cap.get(t, 0) - used.get(t, 0))}
            for t in sorted(set(cap) | set(used))}


def gpu_slots(store: StateStore, cluster: Cluster) -> dict[str, list[str | None]]:
    """Per node, one entry per GPU: the running job that holds it (None: free). A
    placement says how many GPUs of a node a job holds, not which: slots are filled in
    submission order, so a job's GPUs stay together."""
    slots: dict[str, list[str | None]] = {n.name: [None] * n.gpus
                                          for n in cluster.nodes.values()}
    for rec in store.jobs(frozenset({JobState.RUNNING})):
        for node, count in sorted((rec.running or {}).get("placement", {}).items()):
            free = [i for i, s in enumerate(slots.get(node, [])) if s is None]
            for i in free[:int(count)]:
                slots[node][i] = rec.id
    return slots


def node_view(node: Any, health: Mapping[Any, Mapping[str, Any]],
              slots: dict[str, list[str | None]]) -> dict[str, Any]:
    """One node as ``/api/v1/cluster`` shows it: its health and its GPUs' holders."""
    return {"name": node.name, "gpu_type": node.gpu_type, "gpus": node.gpus,
            "state": str(health.get(node.name, {}).get("state") or "up"),
            "reason": str(health.get(node.name, {}).get("reason") or ""),
            "slots": slots[node.name]}


def cluster_view(store: StateStore, cluster: Cluster) -> dict[str, Any]:
    """The cluster node by node and GPU by GPU, grouped by GPU type, each GPU slot naming
    the running job that holds it (:func:`gpu_slots`)."""
    health = {n["name"]: n for n in node_states(store)}
    slots = gpu_slots(store, cluster)
    use = gpu_use(store, cluster)
    types = []
    for t in sorted(use):
        nodes = [node_view(n, health, slots) for n in cluster.nodes.values()
                 if n.gpu_type == t]
        types.append({"gpu_type": t, **use[t], "nodes": nodes})
    return {"name": cluster.name, "gpu_types": types}
