"""What the store says about its jobs and the cluster right now: ``status --json``'s data.

Kept apart from the commands that print it (:mod:`apportion.cli.store`) so that
``apportion serve`` answers ``GET /api/v1/jobs`` from the very same reading: one
definition of a job's row and of why a waiting job waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from apportion.lifecycle import JobState
from apportion.store import StateStore

#: a round's decision by its id (:meth:`StateStore.decision`, or a cache of it: a committed
#: decision never changes, and at 20,000 jobs it is megabytes of JSON to parse)
DecisionLoader = Callable[[int], dict[str, Any]]


def pending_details(store: StateStore, jobs: list[Any],
                    load: DecisionLoader | None = None) -> dict[str, dict[str, Any]]:
    """Why each waiting job is waiting, from its last round's decision: the reason, the
    detail, the stage that held it (``admit``, ``solve``, ...) and whether it can ever fit
    this cluster (a job that never can waits for a change, not for a round). ``load``
    reads a round's decision (by default from the store)."""
    load = load or store.decision
    out: dict[str, dict[str, Any]] = {}
    decisions: dict[int, dict[str, dict[str, str]]] = {}
    for j in jobs:
        if j.state not in (JobState.SUBMITTED, JobState.QUEUED, JobState.CHECKPOINTED) \
                or j.last_round is None:
            continue
        if j.last_round not in decisions:
            try:
                d = load(j.last_round)
            except KeyError:
                d = {}
            decisions[j.last_round] = {p.get("job"): p for p in d.get("pending", [])
                                       if isinstance(p, dict)}
        p = decisions[j.last_round].get(j.id)
        if p is not None:
            fit = p.get("can_ever_fit")
            out[j.id] = {"reason": str(p.get("reason", "")), "detail": str(p.get("detail", "")),
                         "stage": str(p["stage"]) if p.get("stage") is not None else None,
                         "can_ever_fit": fit if isinstance(fit, bool) else None}
    return out


def estimate_sources(store: StateStore, jobs: list[Any],
                     load: DecisionLoader | None = None) -> dict[str, dict[str, Any]]:
    """Per running job, what its allocation's figures rest on, from the decision of the
    round that placed it: ``estimator`` (``auto:crius``, ...) and ``source`` (``kind``:
    measured, fitted, profiled or analytic, with its detail)."""
    load = load or store.decision
    out: dict[str, dict[str, Any]] = {}
    decisions: dict[int, dict[str, dict[str, Any]]] = {}
    for j in jobs:
        if j.state is not JobState.RUNNING or j.last_round is None:
            continue
        if j.last_round not in decisions:
            try:
                d = load(j.last_round)
            except KeyError:
                d = {}
            decisions[j.last_round] = {a.get("job"): a for a in d.get("allocations", [])
                                       if isinstance(a, dict)}
        a = decisions[j.last_round].get(j.id)
        if a is not None:
            out[j.id] = {"estimator": a.get("estimator"), "source": a.get("source")}
    return out


def status_data(store: StateStore) -> dict[str, Any]:
    """What ``status --json`` prints: every job with ``id`` and ``state``, and cluster use.

    A waiting job also carries ``pending_reason``, ``pending_detail``, ``pending_stage``
    and ``can_ever_fit`` (from its last round's decision) when a round has considered it;
    a running job ``estimator`` and ``estimate_source`` (:func:`estimate_sources`).
    """
    from apportion.store_faults import node_states

    jobs = store.jobs()
    rounds = store.rounds(limit=1)
    last = rounds[-1] if rounds else None
    used: Counter[str] = Counter()
    for j in jobs:
        if j.state is JobState.RUNNING and j.running:
            used[j.running["gpu_type"]] += int(j.running["gpus"])
    cap = last["cluster"]["capacity"] if last else {}
    pending = pending_details(store, jobs)
    sources = estimate_sources(store, jobs)
    rows = []
    for j in jobs:
        row = j.as_dict()
        if j.id in sources:
            row["estimator"] = sources[j.id]["estimator"]
            row["estimate_source"] = sources[j.id]["source"]
        if j.id in pending:
            row["pending_reason"] = pending[j.id]["reason"]
            row["pending_detail"] = pending[j.id]["detail"]
            row["pending_stage"] = pending[j.id]["stage"]
            row["can_ever_fit"] = pending[j.id]["can_ever_fit"]
        rows.append(row)
    return {
        "state_db": str(store.path),
        "schema_version": store.schema_version(),
        "generation": store.generation(),
        "jobs": rows,
        "counts": dict(sorted(Counter(j.state.value for j in jobs).items())),
        "cluster_use": {t: {"used": used.get(t, 0), "capacity": cap.get(t)}
                        for t in sorted(set(cap) | set(used))},
        "nodes": node_states(store),
        "last_round": last,
    }
