"""What the dashboard's first screen reads: summaries whose size does not grow with the
cluster or the queue.

``/api/v1/cluster`` names every GPU's holder and ``/api/v1/jobs`` every job: at 20,000
GPUs and 20,000 jobs that is megabytes a poll, and a page that draws all of it is
several screens of squares before the queue. These answers are bounded instead:

* :func:`cluster_summary`: per GPU type and per node group, capacity, allocated and free
  GPUs and nodes by health (the groups are the cluster file's ``node_groups``);
  :func:`group_page` one group's nodes a page at a time, GPU by GPU, for the group an
  operator expands;
* :func:`queue_view`: the waiting jobs counted by their typed reason, the longest
  waits, the states' counts and the last finished jobs' JCTs;
* :func:`tenants_view`: per tenant, its jobs, the GPUs it holds against its quota and its
  longest wait;
* :func:`rounds_summary`: the rounds' rows without their decisions and actions.

Times are Unix seconds with RFC 3339 twins, as everywhere in the API.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from apportion.cluster import Cluster
from apportion.lifecycle import JobState
from apportion.serve.decision_cache import DECISIONS
from apportion.serve.views import gpu_slots, gpu_use, node_view, rfc3339, with_rfc3339
from apportion.store import StateStore
from apportion.store_faults import excluded_nodes, node_states
from apportion.store_queue import (
    NOT_YET,
    WAITING,
    longest_waiting,
    reason_counts,
    recent_finished,
    tenant_use,
)
from apportion.store_status import pending_details

#: at most this many longest waits in one answer
MAX_TOP = 500


def _node_health(store: StateStore, cluster: Cluster, now: float) -> dict[str, str]:
    """Each node's health as a round sees it now: ``down``, ``quarantined`` (until its
    quarantine ends) or ``up``."""
    stored = {str(n["name"]): str(n["state"]) for n in node_states(store)}
    out = excluded_nodes(store, now)
    return {name: (stored.get(name, "up") if name in out else "up") for name in cluster.nodes}


def _held(store: StateStore) -> Counter[str]:
    """GPUs held per node by running jobs."""
    held: Counter[str] = Counter()
    for rec in store.jobs(frozenset({JobState.RUNNING})):
        for node, count in (rec.running or {}).get("placement", {}).items():
            held[str(node)] += int(count)
    return held


def cluster_key(store: StateStore, now: float) -> tuple[int, tuple[str, ...]]:
    """What :func:`cluster_summary` depends on: the store's generation (every write: a
    job's move, a node's fault) and the nodes excluded now (a quarantine also ends by the
    clock alone). Two equal keys give the same summary, so a server computes it once."""
    return store.generation(), tuple(sorted(excluded_nodes(store, now)))


def cluster_summary(store: StateStore, cluster: Cluster,
                    now: float | None = None) -> dict[str, Any]:
    """Per GPU type (capacity, allocated and free as ``/api/v1/cluster`` counts them) and
    within it per node group: nodes by health, and nodes full, partly used and idle."""
    now = time.time() if now is None else now
    health = _node_health(store, cluster, now)
    held = _held(store)
    use = gpu_use(store, cluster, now)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for n in cluster.nodes.values():
        g = groups.setdefault((n.gpu_type, n.group), {
            "group": n.group, "gpu_type": n.gpu_type, "nodes": 0, "gpus": 0,
            "gpus_per_node": n.gpus, "capacity": 0, "allocated": 0, "free": 0,
            "nodes_up": 0, "nodes_down": 0, "nodes_quarantined": 0,
            "nodes_full": 0, "nodes_partly_used": 0, "nodes_idle": 0})
        g["nodes"] += 1
        g["gpus"] += n.gpus
        g["gpus_per_node"] = max(g["gpus_per_node"], n.gpus)
        state = health[n.name]
        g[f"nodes_{state}"] += 1
        used = min(held.get(n.name, 0), n.gpus)
        g["allocated"] += used
        if state == "up":
            g["capacity"] += n.gpus
            g["free"] += n.gpus - used
            g["nodes_" + ("full" if used >= n.gpus else "partly_used" if used else
                          "idle")] += 1
    types = []
    for t in sorted(use):
        mine = [g for (gt, _), g in sorted(groups.items()) if gt == t]
        types.append({"gpu_type": t, **use[t], "gpus": sum(g["gpus"] for g in mine),
                      "nodes": sum(g["nodes"] for g in mine),
                      **{k: sum(g[k] for g in mine) for k in (
                          "nodes_up", "nodes_down", "nodes_quarantined")},
                      "groups": mine})
    return {"name": cluster.name, "nodes": len(cluster.nodes),
            "gpus": sum(n.gpus for n in cluster.nodes.values()), "gpu_types": types}


def group_names(cluster: Cluster) -> list[str]:
    return sorted({n.group for n in cluster.nodes.values()})


def group_page(store: StateStore, cluster: Cluster, group: str, after: int,
               limit: int) -> dict[str, Any]:
    """One node group's nodes from the ``after``-th on, at most ``limit``, each GPU by GPU
    as ``/api/v1/cluster`` shows them; ``next_cursor`` the cursor of the page after. The
    caller checks that ``group`` exists (:func:`group_names`)."""
    nodes = [n for n in cluster.nodes.values() if n.group == group]
    health = {n["name"]: n for n in node_states(store)}
    slots = gpu_slots(store, cluster)
    page = nodes[after:after + limit]
    more = after + limit < len(nodes)
    return {"group": group, "gpu_types": sorted({n.gpu_type for n in nodes}),
            "nodes_total": len(nodes), "offset": after,
            "nodes": [node_view(n, health, slots) for n in page],
            "next_cursor": str(after + limit) if more else None}


def queue_view(store: StateStore, top: int, reason: str | None = None,
               now: float | None = None) -> dict[str, Any]:
    """The queue first: how many wait, for which typed reasons (each with its count, the
    GPUs its jobs ask for and its longest wait), the ``top`` longest-waiting jobs (of
    ``reason`` only, if given) with their reason's detail, every state's count, and the
    last finished jobs' JCTs."""
    now = time.time() if now is None else now
    counts = reason_counts(store)
    reasons = [with_rfc3339({"reason": r.reason or NOT_YET, "jobs": r.jobs, "gpus": r.gpus,
                             "oldest_submitted_at": r.oldest_submitted_at,
                             "longest_wait_s": max(0.0, now - r.oldest_submitted_at)},
                            "oldest_submitted_at") for r in counts]
    longest = longest_waiting(store, top, None if reason == NOT_YET else reason,
                              any_reason=reason is None)
    detail = pending_details(store, [store.job(w.id) for w in longest],
                             DECISIONS.loader(store))
    rows = []
    for w in longest:
        why = detail.get(w.id, {})
        rows.append(with_rfc3339({
            "id": w.id, "state": w.state, "tenant": w.tenant,
            "requested_gpus": w.requested_gpus, "requested_gpu_type": w.requested_gpu_type,
            "guaranteed": w.guaranteed, "submitted_at": w.submitted_at, "since": w.since,
            "wait_s": max(0.0, now - w.submitted_at), "pending_reason": w.reason,
            "pending_detail": why.get("detail"), "pending_stage": why.get("stage"),
            "can_ever_fit": why.get("can_ever_fit")}, "submitted_at", "since"))
    waiting = sum(r.jobs for r in counts)
    return {"now": now, "now_rfc3339": rfc3339(now), "waiting": waiting,
            "waiting_gpus": sum(r.gpus for r in counts), "counts": store.job_counts(),
            "reasons": reasons, "reason": reason,
            "matching": waiting if reason is None else sum(
                r["jobs"] for r in reasons if r["reason"] == reason),
            "longest": rows,
            "finished": [with_rfc3339(f, "finished_at") for f in recent_finished(store, 200)]}


def tenants_view(store: StateStore, quotas: Mapping[str, int],
                 now: float | None = None) -> dict[str, Any]:
    """Every tenant that has a job or a quota: its jobs per state, waiting and running,
    the GPUs its running jobs hold (per type; its guaranteed jobs' against ``quotas``,
    which bound guaranteed jobs only) and its longest wait. Most GPUs held first."""
    now = time.time() if now is None else now
    use = tenant_use(store)
    rows = []
    for name in sorted(set(use) | set(quotas)):
        u = use.get(name)
        row: dict[str, Any] = (u.as_dict() if u is not None else
                               {"tenant": name, "jobs": {}, "gpus": {}, "gpus_held": 0,
                                "guaranteed_gpus": 0, "oldest_waiting_since": None})
        row["waiting"] = sum(row["jobs"].get(s, 0) for s in WAITING)
        row["running"] = row["jobs"].get(JobState.RUNNING.value, 0)
        q = quotas.get(name)
        row["quota_gpus"] = q
        row["quota_used"] = (row["guaranteed_gpus"] / q) if q else None
        since = row["oldest_waiting_since"]
        row["longest_wait_s"] = None if since is None else max(0.0, now - since)
        rows.append(with_rfc3339(row, "oldest_waiting_since"))
    rows.sort(key=lambda r: (-r["gpus_held"], -r["waiting"], r["tenant"]))
    return {"now": now, "now_rfc3339": rfc3339(now), "quotas": bool(quotas),
            "tenants": rows}


def rounds_summary(store: StateStore, limit: int, before: int | None = None
                   ) -> dict[str, Any]:
    """The last ``limit`` rounds (below ``before``), oldest first: each round's row (its
    backend, status, objective, bound, gap, wall time, fallback, placed and pending)
    without the decision and actions ``/api/v1/rounds`` adds; ``next_cursor`` as there."""
    rounds = store.rounds(limit, before)
    for r in rounds:
        r.pop("cluster", None)
        with_rfc3339(r, "committed_at")
    older = bool(rounds) and bool(store.rounds(1, rounds[0]["id"]))
    return {"rounds": rounds, "next_cursor": str(rounds[0]["id"]) if older else None}
