"""Worker and node faults, the store's side: requeue from the last checkpoint, mark capacity down.

The runtime executors (not written yet) will call these when a worker process
dies or a node stops answering; everything here is a single store
transaction, so a fault report is never half-applied:

* :func:`node_fault` records the fault, marks the node ``down`` and returns
  every job placed on it to the queue from its last checkpoint (the work since
  that checkpoint is lost: ``iterations_done`` goes back to the checkpoint).
  A node with ``threshold`` faults inside ``window_s`` is flapping and is
  ``quarantined`` for ``quarantine_s`` instead of merely down, so it does not
  come back at the next heartbeat and fail again.
* :func:`worker_fault` requeues one job; when the node is known the fault
  counts toward that node's flapping threshold.
* :func:`node_up` brings a down node back; a quarantine is not lifted early.
* :func:`effective_cluster` is the cluster the next round must plan on: the
  configured one without the down and quarantined nodes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from apportion.cluster import Cluster
from apportion.lifecycle import JobState
from apportion.store import JobRecord, StateStore

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 3600.0
DEFAULT_THRESHOLD = 3
DEFAULT_QUARANTINE_S = 6 * 3600.0


@dataclass
class FaultResult:
    node: str | None
    node_state: str | None  # up | down | quarantined (None for a worker fault with no node)
    faults_in_window: int
    requeued: list[str] = field(default_factory=list)


def _requeue(store: StateStore, rec: JobRecord, at_s: float, why: str) -> None:
    """Back to the queue from the last checkpoint (inside the caller's transaction)."""
    dst = JobState.CHECKPOINTED if rec.checkpoint_iterations > 0 else JobState.QUEUED
    store._move(rec, dst, why, at_s, iterations_done=rec.checkpoint_iterations)


def _count_fault(store: StateStore, node: str, at_s: float, kind: str, detail: str,
                 window_s: float, threshold: int, quarantine_s: float, down: bool) -> tuple[str, int]:
    c = store.conn
    c.execute("INSERT INTO node_faults(node, at_s, kind, detail) VALUES (?, ?, ?, ?)",
              (node, at_s, kind, detail))
    n = int(c.execute("SELECT COUNT(*) FROM node_faults WHERE node = ? AND at_s > ? AND at_s <= ?",
                      (node, at_s - window_s, at_s)).fetchone()[0])
    old = c.execute("SELECT state, until_s FROM nodes WHERE name = ?", (node,)).fetchone()
    if n >= threshold:
        state, until = "quarantined", at_s + quarantine_s
        reason = f"{n} faults within {window_s:g} s (flapping); last: {kind} {detail}".strip()
    elif old is not None and old[0] == "quarantined" and (old[1] is None or old[1] > at_s):
        state, until, reason = "quarantined", old[1], f"still quarantined; last fault: {kind}"
    elif down:
        state, until, reason = "down", None, f"{kind} {detail}".strip()
    else:
        state = old[0] if old is not None else "up"
        until = old[1] if old is not None else None
        reason = f"{n} fault(s) in window; last: {kind} {detail}".strip()
    c.execute("INSERT INTO nodes(name, state, since_s, until_s, reason) VALUES (?, ?, ?, ?, ?) "
              "ON CONFLICT(name) DO UPDATE SET state = excluded.state, "
              "since_s = CASE WHEN nodes.state = excluded.state THEN nodes.since_s "
              "ELSE excluded.since_s END, until_s = excluded.until_s, reason = excluded.reason",
              (node, state, at_s, until, reason))
    return state, n


def node_fault(store: StateStore, node: str, at_s: float, kind: str = "node-lost",
               detail: str = "", window_s: float = DEFAULT_WINDOW_S,
               threshold: int = DEFAULT_THRESHOLD,
               quarantine_s: float = DEFAULT_QUARANTINE_S) -> FaultResult:
    """A node disappeared: mark it down (or quarantined), requeue every job placed on it."""
    with store.transaction():
        state, n = _count_fault(store, node, at_s, kind, detail, window_s, threshold,
                                quarantine_s, down=True)
        res = FaultResult(node, state, n)
        for rec in store.jobs(frozenset({JobState.RUNNING})):
            if rec.running is not None and node in rec.running.get("placement", {}):
                _requeue(store, rec, at_s, f"node {node} {state}: {kind}")
                res.requeued.append(rec.id)
    log.warning("node %s %s (%d faults in window); requeued %s", node, state, n, res.requeued)
    return res


def worker_fault(store: StateStore, job_id: str, at_s: float, node: str | None = None,
                 detail: str = "", window_s: float = DEFAULT_WINDOW_S,
                 threshold: int = DEFAULT_THRESHOLD,
                 quarantine_s: float = DEFAULT_QUARANTINE_S) -> FaultResult:
    """A worker of a running job died: requeue the job; count it against ``node`` if known."""
    with store.transaction():
        rec = store.job(job_id)
        res = FaultResult(node, None, 0)
        if node is not None:
            res.node_state, res.faults_in_window = _count_fault(
                store, node, at_s, "worker-died", f"job {job_id} {detail}".strip(), window_s,
                threshold, quarantine_s, down=False)
        if rec.state is JobState.RUNNING:
            _requeue(store, rec, at_s, f"worker died{' on ' + node if node else ''}: {detail}")
            res.requeued.append(rec.id)
        if res.node_state == "quarantined":  # a flapping node takes its other jobs down too
            for other in store.jobs(frozenset({JobState.RUNNING})):
                if other.running is not None and node in other.running.get("placement", {}):
                    _requeue(store, other, at_s, f"node {node} quarantined")
                    res.requeued.append(other.id)
    return res


def node_up(store: StateStore, node: str, at_s: float) -> str:
    """The node answers again: down -> up; a quarantine runs its course. Returns the state."""
    with store.transaction() as c:
        row = c.execute("SELECT state, until_s FROM nodes WHERE name = ?", (node,)).fetchone()
        if row is None or row[0] == "up":
            return "up"
        if row[0] == "quarantined" and (row[1] is None or row[1] > at_s):
            return "quarantined"
        c.execute("UPDATE nodes SET state = 'up', since_s = ?, until_s = NULL, reason = ? "
                  "WHERE name = ?", (at_s, "back up", node))
        return "up"


def node_states(store: StateStore) -> list[dict[str, object]]:
    keys = ("name", "state", "since_s", "until_s", "reason")
    rows = store.conn.execute("SELECT name, state, since_s, until_s, reason FROM nodes "
                              "ORDER BY name").fetchall()
    return [dict(zip(keys, r)) for r in rows]


def excluded_nodes(store: StateStore, now_s: float) -> set[str]:
    """Nodes the next round must not use: down, or quarantined and not yet expired."""
    rows = store.conn.execute("SELECT name, state, until_s FROM nodes WHERE state != 'up'")
    return {n for n, s, until in rows if s == "down" or until is None or until > now_s}


def effective_cluster(store: StateStore, cluster: Cluster, now_s: float) -> Cluster:
    """The cluster the next round plans on: every excluded node holds zero usable GPUs.

    The node stays in the cluster with ``gpus = 0`` rather than being removed
    because the candidate builder expands each node group to ``prefix-0 ..
    prefix-(count-1)`` and would look for the removed name; a node with no
    GPUs gets no placement (node capacity rows) and the validator refuses any.
    The configured cluster is not modified.
    """
    out = excluded_nodes(store, now_s) & set(cluster.nodes)
    if not out:
        return cluster
    nodes = {n: (dataclasses.replace(v, gpus=0) if n in out else v)
             for n, v in cluster.nodes.items()}
    return Cluster(cluster.name, list(cluster.groups), nodes)
