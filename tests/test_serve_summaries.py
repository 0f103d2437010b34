"""The dashboard's bounded reads against the full ones, on a real store that real rounds
wrote: the queue's reasons are those of the rounds' decisions, the cluster summary adds up
to the cluster view node by node, a group's pages cover its nodes once, the filtered jobs
pages are the filtered jobs, a job's folded decisions cover every round that decided it,
and the first decision of each job is the first round that did.

Each summary is checked against a second reading written independently (the decision
JSON, the GPU slots, ``store.jobs()`` filtered in Python, the rounds' actions), never
against itself.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")

from apportion.config import cluster_from_data, jobs_from_data
from apportion.lifecycle import JobState
from apportion.policies import RoundConfig, run_round
from apportion.serve import summaries, views
from apportion.serve.job_history import job_history, move_counts
from apportion.serve.metrics import StoreCollector
from apportion.store import StateStore, open_store
from apportion.store_decisions import first_decisions, job_decisions
from apportion.store_faults import effective_cluster, node_fault, worker_fault
from apportion.store_queue import NOT_YET, WAITING
from apportion.store_status import pending_details

CLUSTER = {"name": "t", "node_groups": [
    {"prefix": "a40", "count": 3, "gpu_type": "A40", "gpus_per_node": 4},
    {"prefix": "a10", "count": 2, "gpu_type": "A10", "gpus_per_node": 4},
    {"prefix": "a10b", "count": 2, "gpu_type": "A10", "gpus_per_node": 2}]}
TENANTS = ("vision", "nlp", "speech")
QUOTAS = {"vision": 8, "nlp": 4, "nobody": 2}


def _jobs(n: int, start: int = 0) -> dict:
    sizes = (1, 2, 4, 8, 2, 64)  # 64: larger than the cluster (too-large)
    return {"jobs": [{"id": f"j{i:03d}", "model": "gpt-tiny", "global_batch_size": 16,
                      "iterations": 10_000, "requested_gpus": sizes[i % len(sizes)],
                      "tenant": TENANTS[i % len(TENANTS)], "guaranteed": i % 4 == 0}
                     for i in range(start, start + n)]}


def _round(store: StateStore, cluster, now: float) -> None:
    snap = store.round_input()
    eff = effective_cluster(store, cluster, now)
    res = run_round(eff, snap.jobs, now, RoundConfig(backend="greedy", time_budget_s=5))
    store.commit_round(res.decision, snap, eff, now, at=now)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    """A store after three rounds, a worker's death, a node lost, a cancellation and a
    submission no round has seen yet."""
    db = tmp_path_factory.mktemp("summaries") / "s.db"
    cluster = cluster_from_data(CLUSTER, "t")
    t0 = time.time() - 3600.0
    with open_store(db, create=True) as store:
        store.submit(jobs_from_data(_jobs(30), "jobs")[0], at=t0)
        _round(store, cluster, t0 + 10)
        running = [r.id for r in store.jobs(frozenset({JobState.RUNNING}))]
        worker_fault(store, running[0], t0 + 20, node=None, detail="killed")
        _round(store, cluster, t0 + 30)
        node_fault(store, "a40-1", t0 + 40)
        store.cancel(running[-1], at=t0 + 45)
        _round(store, cluster, t0 + 50)
        store.submit(jobs_from_data(_jobs(3, 30), "late")[0], at=t0 + 60)
    yield db, cluster


def test_the_queue_counts_the_reasons_the_rounds_gave(built) -> None:
    db, _ = built
    with open_store(db, readonly=True) as store:
        waiting = [r for r in store.jobs() if r.state.value in WAITING]
        why = pending_details(store, waiting)  # the decisions' JSON: another reading
        want = Counter(why[r.id]["reason"] if r.id in why else NOT_YET for r in waiting)
        q = summaries.queue_view(store, top=5)
        assert {r["reason"]: r["jobs"] for r in q["reasons"]} == dict(want)
        assert q["waiting"] == len(waiting) == sum(want.values())
        assert {"too-large", NOT_YET} <= set(want)
        assert [r["jobs"] for r in q["reasons"]] == sorted((r["jobs"] for r in q["reasons"]),
                                                           reverse=True)
        assert q["counts"] == store.job_counts()
        # the longest waits: the earliest submitted, with the details of their decisions
        order = sorted(waiting, key=lambda r: r.submitted_at)
        assert [w["id"] for w in q["longest"]] == [r.id for r in order[:5]]
        for w in q["longest"]:
            assert w["pending_reason"] == (why[w["id"]]["reason"] if w["id"] in why else None)
            assert w["pending_detail"] == why.get(w["id"], {}).get("detail")
        # one reason's longest waits, and the count of its jobs
        for reason, n in want.items():
            one = summaries.queue_view(store, top=100, reason=reason)
            assert one["matching"] == n == len(one["longest"])
            assert {w["pending_reason"] or NOT_YET for w in one["longest"]} == {reason}
    # and /metrics counts the same (its collector, read as a scrape reads it)
    scraped = {m.name: m for m in StoreCollector(db, cluster_from_data(CLUSTER, "t"),
                                                 lambda: 0).collect()}
    assert {s.labels["reason"]: s.value for s in scraped["apportion_pending_jobs"].samples} \
        == {k: float(v) for k, v in want.items()}


def test_the_cluster_summary_adds_up_to_the_cluster_view(built) -> None:
    db, cluster = built
    with open_store(db, readonly=True) as store:
        full = views.cluster_view(store, cluster)
        summary = summaries.cluster_summary(store, cluster)
    assert summary["nodes"] == len(cluster.nodes)
    assert summary["gpus"] == sum(n.gpus for n in cluster.nodes.values())
    for t, s in zip(full["gpu_types"], summary["gpu_types"], strict=True):
        assert (s["gpu_type"], s["capacity"], s["allocated"], s["free"]) == (
            t["gpu_type"], t["capacity"], t["allocated"], t["free"])
        held = {n["name"]: sum(x is not None for x in n["slots"]) for n in t["nodes"]}
        for g in s["groups"]:
            mine = [n for n in t["nodes"] if cluster.nodes[n["name"]].group == g["group"]]
            assert g["nodes"] == len(mine) == (g["nodes_up"] + g["nodes_down"]
                                                + g["nodes_quarantined"])
            assert g["allocated"] == sum(held[n["name"]] for n in mine)
            assert g["nodes_down"] == sum(n["state"] == "down" for n in mine)
            up = [n for n in mine if n["state"] == "up"]
            assert g["capacity"] == sum(n["gpus"] for n in up)
            assert g["nodes_full"] + g["nodes_partly_used"] + g["nodes_idle"] == len(up)
        assert sum(g["capacity"] for g in s["groups"]) == s["capacity"]
    assert any(g["nodes_down"] for t in summary["gpu_types"] for g in t["groups"])


@pytest.mark.parametrize("limit", [1, 2, 64])
def test_a_groups_pages_cover_its_nodes_once(built, limit: int) -> None:
    db, cluster = built
    with open_store(db, readonly=True) as store:
        full = {n["name"]: n for t in views.cluster_view(store, cluster)["gpu_types"]
                for n in t["nodes"]}
        for group in summaries.group_names(cluster):
            seen, after = [], 0
            while True:
                page = summaries.group_page(store, cluster, group, after, limit)
                assert len(page["nodes"]) <= limit
                seen += page["nodes"]
                if page["next_cursor"] is None:
                    break
                after = int(page["next_cursor"])
            assert [n["name"] for n in seen] == [n.name for n in cluster.nodes.values()
                                                if n.group == group]
            assert all(n == full[n["name"]] for n in seen)


STATES = st.frozensets(st.sampled_from(list(JobState)), max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(states=st.none() | STATES, tenant=st.none() | st.sampled_from([*TENANTS, "nobody"]),
       limit=st.none() | st.integers(1, 12))
def test_filtered_job_pages_are_the_filtered_jobs(built, states, tenant, limit) -> None:
    db, _ = built
    with open_store(db, readonly=True) as store:
        want = [r.id for r in store.jobs() if (states is None or r.state in states)
                and (tenant is None or (r.spec.get("tenant") or "default") == tenant)]
        got, after = [], 0
        while True:
            page = views.jobs_view(store, after, limit, states, tenant)
            assert limit is None or len(page["jobs"]) <= limit
            got += [j["id"] for j in page["jobs"]]
            if page["next_cursor"] is None:
                break
            after = int(page["next_cursor"])
        assert got == want
        assert page["counts"] == store.job_counts()  # every job, whatever the filter


def _decided(store: StateStore) -> dict[str, list[tuple[int, float, dict]]]:
    """Job -> (round, commit time, action) of every round that decided it, from the
    rounds' own action lists (a second reading)."""
    out: dict[str, list[tuple[int, float, dict]]] = {}
    for r in store.rounds():
        for a in store.actions(r["id"]):
            out.setdefault(a["job"], []).append((r["id"], r["committed_at"], a))
    return out


def test_a_jobs_decisions_fold_every_round_that_decided_it(built) -> None:
    db, _ = built
    with open_store(db, readonly=True) as store:
        decided = _decided(store)
        for rec in store.jobs():
            runs, more = job_decisions(store, rec.id)
            rows = decided.get(rec.id, [])
            assert not more
            assert sum(r["rounds"] for r in runs) == len(rows)
            # newest first, runs back to back, each the action its rounds stored
            expanded = [(r["first_round"], r["last_round"], r["action"], r["reason"])
                        for r in runs]
            assert expanded == sorted(expanded, reverse=True)
            by_round = {rid: a for rid, _, a in rows}
            for r in runs:
                assert by_round[r["first_round"]]["action"] == r["action"]
                assert by_round[r["last_round"]]["action"] == r["action"]
            if len(rows) > 1:
                newest, cut = job_decisions(store, rec.id, limit=1)
                assert cut and len(newest) == 1 and newest[0]["last_round"] == rows[-1][0]


def test_first_decisions_are_the_first_rounds_that_decided_each_job(built) -> None:
    db, _ = built
    with open_store(db, readonly=True) as store:
        decided = _decided(store)
        first = first_decisions(store)
        for rec in store.jobs():
            applied = [at for _, at, a in decided.get(rec.id, []) if a["applied"]]
            assert first.get(rec.id) == (min(applied) if applied else None), rec.id
        assert any(r.state is JobState.SUBMITTED for r in store.jobs())  # the late ones
        assert all(r.id not in first for r in store.jobs()
                   if r.state is JobState.SUBMITTED)
        waits = sorted(first[r.id] - r.submitted_at for r in store.jobs() if r.id in first)
    # /metrics' histogram holds exactly these waits
    fam = next(m for m in StoreCollector(db, cluster_from_data(CLUSTER, "t"), lambda: 0)
               .collect() if m.name == "apportion_submit_to_decision_seconds")
    got = {s.name.rsplit("_", 1)[-1]: s for s in fam.samples if not s.labels}
    assert got["count"].value == len(waits) and abs(got["sum"].value - sum(waits)) < 1e-6
    for b in (s for s in fam.samples if "le" in s.labels):
        bound = float(b.labels["le"])
        assert b.value == sum(w <= bound for w in waits), b


def test_the_tenants_hold_what_the_cluster_has_allocated(built) -> None:
    db, cluster = built
    with open_store(db, readonly=True) as store:
        view = summaries.tenants_view(store, QUOTAS)
        use = views.gpu_use(store, cluster)
        recs = store.jobs()
    rows = {t["tenant"]: t for t in view["tenants"]}
    assert set(rows) == set(TENANTS) | set(QUOTAS)
    assert rows["nobody"]["jobs"] == {} and rows["nobody"]["quota_gpus"] == 2
    for t, row in rows.items():
        mine = [r for r in recs if (r.spec.get("tenant") or "default") == t]
        assert row["jobs"] == dict(sorted(Counter(r.state.value for r in mine).items()))
        running = [r for r in mine if r.state is JobState.RUNNING]
        assert row["gpus_held"] == sum(int(r.running["gpus"]) for r in running)
        assert row["guaranteed_gpus"] == sum(int(r.running["gpus"]) for r in running
                                             if r.spec.get("guaranteed"))
        assert row["quota_gpus"] == QUOTAS.get(t)
    for gtype, u in use.items():
        assert sum(row["gpus"].get(gtype, 0) for row in rows.values()) == u["allocated"]


def test_a_jobs_history_counts_its_restarts_and_interruptions(built) -> None:
    db, _ = built
    with open_store(db, readonly=True) as store:
        for rec in store.jobs():
            h = job_history(store, rec.id)
            moves = [(e["src"], e["dst"]) for e in h["events"]]
            starts = sum(d == "running" and s != "running" for s, d in moves)
            assert h["starts"] == starts
            assert h["restarts"] >= max(0, starts - 1)
            assert h["interruptions"] + h["preemptions"] == sum(
                s == "running" and d in ("queued", "checkpointed") for s, d in moves)
            # every move a round made is one of the rounds its decisions name
            rounds = {n for r in h["decisions"]
                      for n in range(r["first_round"], r["last_round"] + 1)}
            assert {e["round_id"] for e in h["events"] if e["round_id"] is not None} <= rounds
        interrupted = [r.id for r in store.jobs()
                       if job_history(store, r.id)["interruptions"]]
    assert len(interrupted) >= 2  # the worker that died, the jobs of the lost node


def test_move_counts_reads_preemptions_restarts_and_faults() -> None:
    ev = [{"src": None, "dst": "submitted", "why": "submitted"},
          {"src": "submitted", "dst": "queued", "why": "admitted"},
          {"src": "queued", "dst": "running", "why": "start"},
          {"src": "running", "dst": "running", "why": "keep"},
          {"src": "running", "dst": "running", "why": "resize"},
          {"src": "running", "dst": "checkpointed", "why": "preempted: no-capacity"},
          {"src": "checkpointed", "dst": "running", "why": "start"},
          {"src": "running", "dst": "queued", "why": "worker died: killed"},
          {"src": "queued", "dst": "running", "why": "start"},
          {"src": "running", "dst": "running", "why": "migrate"}]
    assert move_counts(ev) == {"starts": 3, "restarts": 4, "preemptions": 1,
                               "interruptions": 1}


def test_a_quarantine_that_ends_by_the_clock_changes_the_summarys_key(tmp_path: Path) -> None:
    """No write marks the end of a quarantine: the summary a server keeps is recomputed
    because the nodes excluded now are part of its key, not only the store's generation."""
    cluster = cluster_from_data(CLUSTER, "t")
    t = time.time()
    with open_store(tmp_path / "q.db", create=True) as store:
        node_fault(store, "a10-0", t, threshold=1, quarantine_s=100.0)
        during, after = t + 50.0, t + 150.0
        assert summaries.cluster_key(store, during) != summaries.cluster_key(store, after)
        assert summaries.cluster_key(store, during) == summaries.cluster_key(store, t + 60.0)
        a10 = {s: {g["group"]: g for g in next(
            ty for ty in summaries.cluster_summary(store, cluster, s)["gpu_types"]
            if ty["gpu_type"] == "A10")["groups"]} for s in (during, after)}
    assert a10[during]["a10"]["nodes_quarantined"] == 1
    assert a10[after]["a10"]["nodes_quarantined"] == 0
    assert a10[after]["a10"]["capacity"] == a10[during]["a10"]["capacity"] + 4
    # and the type's capacity, counted as /api/v1/cluster counts it, at the same moment
    with open_store(tmp_path / "q.db", readonly=True) as store:
        caps = [next(ty for ty in summaries.cluster_summary(store, cluster, s)["gpu_types"]
                     if ty["gpu_type"] == "A10")["capacity"] for s in (during, after)]
    assert caps[1] == caps[0] + 4
