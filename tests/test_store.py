"""The state store: commands, rounds as one transaction, idempotent reruns, the round lock,
schema migrations, measured progress and samples, and node/worker faults (store side)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from apportion.validator import validate
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import cluster_from_data, jobs_from_data
from apportion.decision import Action, Decision, Pending, Reason, SolveReport
from apportion.errors import InputError
from apportion.lifecycle import IllegalTransition, JobState
from apportion.policies import RoundConfig, run_round
from apportion.store import RoundLock, StoreBusy, open_store
from apportion.store_faults import (
    effective_cluster,
    excluded_nodes,
    node_fault,
    node_states,
    node_up,
    worker_fault,
)
from apportion.store_schema import SCHEMA_VERSION, migrate

runner = CliRunner()

CLUSTER = {"name": "t", "node_groups": [
    {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4},
    {"prefix": "a10", "count": 2, "gpu_type": "A10", "gpus_per_node": 4}]}
JOBS = [("j1", "bert-0.76b", 2), ("j2", "bert-1.3b", 4), ("j3", "moe-0.69b", 4),
        ("j4", "wresnet-1b", 2)]


def jobs_data(spec=JOBS, iterations: int = 1000) -> dict:
    return {"jobs": [{"id": i, "model": m, "global_batch_size": 128, "iterations": iterations,
                      "requested_gpus": n, "submit_time_s": 10.0 * k}
                     for k, (i, m, n) in enumerate(spec)]}


def write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {"cluster": write_yaml(tmp_path / "cluster.yaml", CLUSTER),
            "jobs": write_yaml(tmp_path / "jobs.yaml", jobs_data()),
            "db": tmp_path / "state.db", "tmp": tmp_path}


def cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def dump(db: Path) -> list[str]:
    """The logical content of a database (independent of WAL checkpoints)."""
    conn = sqlite3.connect(str(db))
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def store_round(store, cluster, key=None, now=100.0, backend="greedy"):
    snap = store.round_input()
    eff = effective_cluster(store, cluster, now)
    res = run_round(eff, snap.jobs, now, RoundConfig(backend=backend, time_budget_s=5))
    assert validate(res.decision, eff, snap.jobs).ok
    return res, store.commit_round(res.decision, snap, eff, now, key)


# -- the commands -------------------------------------------------------------------------
def test_submit_solve_status_history_cancel(files: dict[str, Path]) -> None:
    db = files["db"]
    r = cli("submit", files["jobs"], "--state", db)
    assert r.exit_code == 0, r.output
    st = json.loads(cli("status", "--state", db, "--json").stdout)
    assert [(j["id"], j["state"], j["iterations_done"]) for j in st["jobs"]] == \
        [(i, "submitted", 0) for i, _, _ in JOBS]

    out = files["tmp"] / "d.json"
    r = cli("solve-round", "--state", db, "--cluster", files["cluster"], "--json", out,
            "--backend", "highs")
    assert r.exit_code == 0, r.output
    assert "committed" in r.stderr
    decision = json.loads(out.read_text())
    with open_store(db) as s:
        (rnd,) = s.rounds()
        assert s.decision(rnd["id"]) == json.loads(json.dumps(decision))
        recs = {j.id: j for j in s.jobs()}
        assert s.check_invariants() == []
    cluster = cluster_from_data(CLUSTER, "t")
    jobs = [recs[i].to_jobspec() for i, _, _ in JOBS]
    placed = {a["job"]: a for a in decision["allocations"]}
    assert placed, "a round on an empty cluster places something"
    for job_id, rec in recs.items():
        if job_id in placed:
            assert rec.state is JobState.RUNNING
            assert rec.running["placement"] == placed[job_id]["placement"]
            assert rec.running["gpus"] == placed[job_id]["gpus"]
        else:
            assert rec.state is JobState.QUEUED
    # the jobs as running now are a valid allocation of the cluster (independent validator)
    d2 = run_round(cluster, jobs, 200.0, RoundConfig(backend="greedy", max_changes=0)).decision
    assert validate(d2, cluster, jobs).ok

    hist = json.loads(cli("history", "--state", db, "--json").stdout)["rounds"]
    assert len(hist) == 1 and hist[0]["solver"]["backend"] == "highs"
    assert {a["job"] for a in hist[0]["actions"]} == {i for i, _, _ in JOBS}
    assert cli("history", "--state", db).exit_code == 0
    assert cli("status", "--state", db).exit_code == 0

    running = next(iter(placed))
    r = cli("cancel", running, "--state", db)
    assert r.exit_code == 0 and "dropped" in r.stdout
    before = dump(db)
    assert cli("cancel", running, "--state", db).exit_code == 0  # twice: no error, no write
    assert dump(db) == before
    r = cli("cancel", "no-such-job", "--state", db)
    assert r.exit_code == 2 and "JOB" in r.stderr and "no-such-job" in r.stderr
    st = json.loads(cli("status", "--state", db, "--json").stdout)
    assert {j["id"]: j["state"] for j in st["jobs"]}[running] == "dropped"


def test_submit_is_all_or_nothing_and_ids_are_never_reused(files: dict[str, Path]) -> None:
    db = files["db"]
    assert cli("submit", files["jobs"], "--state", db).exit_code == 0
    before = dump(db)
    mixed = write_yaml(files["tmp"] / "mixed.yaml", jobs_data([("new1", "bert-0.76b", 2),
                                                               ("j2", "bert-1.3b", 4)]))
    r = cli("submit", mixed, "--state", db)
    assert r.exit_code == 2
    assert "mixed.yaml" in r.stderr and "jobs[1].id" in r.stderr and "already" in r.stderr
    assert dump(db) == before
    running = write_yaml(files["tmp"] / "running.yaml", {"jobs": [
        {**jobs_data([("r1", "bert-0.76b", 2)])["jobs"][0],
         "running": {"gpu_type": "A40", "gpus": 2}}]})
    r = cli("submit", running, "--state", db)
    assert r.exit_code == 2 and "jobs[0].running" in r.stderr
    assert dump(db) == before


def test_unicode_job_ids_round_trip(files: dict[str, Path]) -> None:
    db = files["db"]
    f = write_yaml(files["tmp"] / "u.yaml", jobs_data([("训练-ü-1", "bert-0.76b", 2)]))
    assert cli("submit", f, "--state", db).exit_code == 0
    st = json.loads(cli("status", "--state", db, "--json").stdout)
    assert st["jobs"][0]["id"] == "训练-ü-1"
    assert cli("solve-round", "--state", db, "--cluster", files["cluster"]).exit_code == 0
    assert cli("cancel", "训练-ü-1", "--state", db).exit_code == 0


def test_state_commands_refuse_bad_state_files(files: dict[str, Path]) -> None:
    garbage = files["tmp"] / "garbage.db"
    garbage.write_bytes(os.urandom(4096))
    other = files["tmp"] / "other.db"
    conn = sqlite3.connect(str(other))
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    for bad, frag in [(files["tmp"] / "missing.db", "no such state database"),
                      (files["tmp"], "directory"), (garbage, "not a SQLite file"),
                      (other, "no apportion schema")]:
        before = sorted(p.name for p in files["tmp"].iterdir())
        for args in (["status", "--state", bad], ["history", "--state", bad],
                     ["cancel", "x", "--state", bad],
                     ["solve-round", "--state", bad, "--cluster", files["cluster"]]):
            r = cli(*args)
            assert r.exit_code == 2, (args, r.output)
            assert str(bad) in r.stderr and "--state" in r.stderr and frag in r.stderr
        assert sorted(p.name for p in files["tmp"].iterdir()) == before
    r = cli("solve-round", "--state", files["db"], "--jobs", files["jobs"])
    assert r.exit_code == 2 and "--jobs" in r.stderr


# -- rounds -------------------------------------------------------------------------------
def test_rerunning_the_same_round_is_idempotent(files: dict[str, Path]) -> None:
    db = files["db"]
    assert cli("submit", files["jobs"], "--state", db).exit_code == 0
    args = ("solve-round", "--state", db, "--cluster", files["cluster"], "--round-key", "slot-1")
    assert cli(*args).exit_code == 0
    before = dump(db)
    out = files["tmp"] / "again.json"
    r = cli(*args, "--json", out)
    assert r.exit_code == 0 and "already committed" in r.stderr
    assert dump(db) == before
    with open_store(db) as s:
        assert len(s.rounds()) == 1
        assert json.loads(out.read_text()) == s.decision(1)

    # the library: the same snapshot committed twice under one key
    cluster = cluster_from_data(CLUSTER, "t")
    with open_store(db) as s:
        snap = s.round_input()
        res = run_round(cluster, snap.jobs, 500.0, RoundConfig(backend="greedy"))
        first = s.commit_round(res.decision, snap, cluster, 500.0)
        mid = dump(db)
        second = s.commit_round(res.decision, snap, cluster, 500.0)
        assert first.created and not second.created and first.round_id == second.round_id
        assert dump(db) == mid and s.check_invariants() == []


def test_a_job_changed_while_solving_is_left_alone(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    jobs, _ = jobs_from_data(jobs_data(), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        snap = s.round_input()
        res = run_round(cluster, snap.jobs, 100.0, RoundConfig(backend="greedy"))
        target = res.decision.allocations[0].job
        s.cancel(target, at=50.0)  # `apportion cancel` while the round was solving
        c = s.commit_round(res.decision, snap, cluster, 100.0, "k")
        assert target in c.skipped and target not in c.applied
        assert s.job(target).state is JobState.DROPPED
        acts = {a["job"]: a for a in s.actions(c.round_id)}
        assert acts[target]["applied"] is False
        assert all(acts[j]["applied"] for j in c.applied)
        assert s.check_invariants() == []


def test_preempted_jobs_checkpoint_and_resume(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    jobs, _ = jobs_from_data(jobs_data(), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        res, _ = store_round(s, cluster, "r1")
        victim = res.decision.allocations[0].job
        s.record_progress(victim, 300, at_s=150.0, checkpoint=True)
        s.record_progress(victim, 420, at_s=160.0)
        snap = s.round_input()
        keep = [a for a in res.decision.allocations if a.job != victim]
        pend = [Pending(victim, Reason.PREEMPTED, "test", Action.PREEMPT)]
        dec = Decision(keep, pend, SolveReport("greedy", "feasible", 1.0, None, None, 0.1, False))
        assert validate(dec, cluster, snap.jobs).ok
        s.commit_round(dec, snap, cluster, 200.0, "r2")
        rec = s.job(victim)
        # a planned preemption checkpoints at the current iteration
        assert rec.state is JobState.CHECKPOINTED and rec.running is None
        assert rec.iterations_done == rec.checkpoint_iterations == 420
        assert rec.to_jobspec().running is None and rec.to_jobspec().iterations_done == 420
        res3, _ = store_round(s, cluster, "r3", now=300.0)
        if res3.decision.allocation(victim) is not None:
            assert s.job(victim).state is JobState.RUNNING
        assert [e["dst"] for e in s.events(victim)][:4] == ["submitted", "queued", "running",
                                                           "checkpointed"]
        assert s.check_invariants() == []


def test_progress_finishes_jobs_and_samples_are_kept(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    jobs, _ = jobs_from_data(jobs_data(iterations=100), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        res, _ = store_round(s, cluster)
        a = res.decision.allocations[0]
        queued = next(j.id for j in s.jobs() if j.state is JobState.QUEUED) \
            if any(j.state is JobState.QUEUED for j in s.jobs()) else None
        s.record_progress(a.job, 40, at_s=10.0, checkpoint=True)
        with pytest.raises(ValueError, match="backwards"):
            s.record_progress(a.job, 30, at_s=11.0)
        if queued:
            with pytest.raises(IllegalTransition):
                s.record_progress(queued, 5, at_s=11.0)
        rec = s.record_progress(a.job, 100, at_s=20.0)
        assert rec.state is JobState.FINISHED and rec.running is None
        with pytest.raises(IllegalTransition):
            s.cancel(a.job)
        assert s.job(a.job).state is JobState.FINISHED
        s.record_sample(a.job, a.gpu_type, a.gpus, a.plan.as_dict(), a.placement, 0.42, 12.0,
                        mem_per_gpu_gib=11.5, source="worker")
        (smp,) = s.samples(a.job)
        assert smp["iter_time_s"] == 0.42 and smp["placement"] == a.placement
        for bad in (float("nan"), float("inf"), 0.0, -1.0):
            with pytest.raises(InputError, match="iter_time_s"):
                s.record_sample(a.job, a.gpu_type, a.gpus, {}, {}, bad, 13.0)
        with pytest.raises(InputError, match="mem_per_gpu_gib"):
            s.record_sample(a.job, a.gpu_type, a.gpus, {}, {}, 1.0, 13.0, float("nan"))
        assert len(s.samples()) == 1 and s.check_invariants() == []


def test_database_refuses_illegal_moves_and_deletes(files: dict[str, Path]) -> None:
    jobs, _ = jobs_from_data(jobs_data(), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        s.cancel("j1", at=1.0)
        with pytest.raises(IllegalTransition):
            s.fail("j1", "too late")
        with pytest.raises(sqlite3.IntegrityError, match="illegal job state transition"):
            s.conn.execute("UPDATE jobs SET state = 'running', running_json = '{}' "
                           "WHERE id = 'j1'")
        with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
            s.conn.execute("DELETE FROM jobs WHERE id = 'j2'")
        with pytest.raises(sqlite3.IntegrityError):  # running without a placement
            s.conn.execute("UPDATE jobs SET state = 'queued' WHERE id = 'j2'")
            s.conn.execute("UPDATE jobs SET state = 'running' WHERE id = 'j2'")
        assert len(s.jobs()) == len(JOBS)


def test_catalog_drift_fails_the_job_instead_of_the_round(files: dict[str, Path]) -> None:
    db = files["db"]
    assert cli("submit", files["jobs"], "--state", db).exit_code == 0
    with open_store(db) as s:
        spec = s.job("j3").spec
        spec["model"] = "gpt-9000"
        s.conn.execute("UPDATE jobs SET spec_json = ? WHERE id = 'j3'", (json.dumps(spec),))
    r = cli("solve-round", "--state", db, "--cluster", files["cluster"])
    assert r.exit_code == 0, r.output
    with open_store(db) as s:
        assert s.job("j3").state is JobState.FAILED and "gpt-9000" in s.job("j3").reason
        assert s.check_invariants() == []


# -- schema -------------------------------------------------------------------------------
def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(str(db), isolation_level=None)
    assert migrate(conn, target=1) == 1
    conn.execute("INSERT INTO jobs(id, seq, spec_json, state, iterations, submitted_at, "
                 "updated_at) VALUES ('old', 1, ?, 'queued', 10, 0, 0)",
                 (json.dumps({"id": "old", "model": "bert-0.76b", "global_batch_size": 8,
                              "iterations": 10, "requested_gpus": 1}),))
    conn.execute("INSERT INTO job_events(job, src, dst, at) VALUES ('old', NULL, 'submitted', 0)")
    conn.execute("INSERT INTO job_events(job, src, dst, at) VALUES ('old', 'submitted', "
                 "'queued', 0)")
    conn.close()
    with open_store(db) as s:
        assert s.schema_version() == SCHEMA_VERSION == 4
        assert s.job("old").to_jobspec().model == "bert-0.76b"
        assert s.samples() == [] and node_states(s) == []
        assert s.check_invariants() == []
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("INSERT INTO schema_version(version, applied_at) VALUES (99, 0)")
    conn.close()
    with pytest.raises(InputError, match="newer"):
        open_store(db)


# -- the round lock -----------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys
    from apportion.store import RoundLock
    lock = RoundLock(sys.argv[1], "test-holder")
    lock.acquire()
    print("locked", flush=True)
    sys.stdin.read()
""")


def test_concurrent_rounds_are_serialized_with_a_clear_message(files: dict[str, Path]) -> None:
    db = files["db"]
    assert cli("submit", files["jobs"], "--state", db).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = dump(db)
        r = cli("solve-round", "--state", db, "--cluster", files["cluster"])
        assert r.exit_code == 75, r.output
        assert "another apportion invocation holds the round lock" in r.stderr
        assert f"pid {holder.pid}" in r.stderr and "test-holder" in r.stderr
        assert "did nothing" in r.stderr
        assert dump(db) == before
        # submit and status do not wait for a round
        extra = write_yaml(files["tmp"] / "extra.yaml", jobs_data([("x1", "bert-0.76b", 1)]))
        assert cli("submit", extra, "--state", db).exit_code == 0
        assert cli("status", "--state", db).exit_code == 0
        with pytest.raises(StoreBusy):
            RoundLock(db).acquire(wait_s=0.2)
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed holder leaves no stale lock
        holder.wait()
    r = cli("solve-round", "--state", db, "--cluster", files["cluster"])
    assert r.exit_code == 0, r.output
    with RoundLock(db):
        pass


# -- node and worker faults (store side) --------------------------------------------------
def test_node_fault_requeues_from_checkpoint_and_excludes_capacity(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    jobs, _ = jobs_from_data(jobs_data(), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        res, _ = store_round(s, cluster, "r1", backend="highs")
        a = res.decision.allocations[0]
        node = min(a.placement)
        on_node = {j.id for j in s.jobs() if j.running and node in j.running["placement"]}
        s.record_progress(a.job, 200, at_s=110.0, checkpoint=True)
        s.record_progress(a.job, 260, at_s=120.0)
        fr = node_fault(s, node, at_s=130.0, detail="heartbeat lost")
        assert fr.node_state == "down" and set(fr.requeued) == on_node
        rec = s.job(a.job)
        assert rec.state is JobState.CHECKPOINTED and rec.iterations_done == 200  # 60 lost
        for j in on_node - {a.job}:
            assert s.job(j).state is JobState.QUEUED and s.job(j).iterations_done == 0
        assert excluded_nodes(s, 140.0) == {node}
        eff = effective_cluster(s, cluster, 140.0)
        assert eff.nodes[node].gpus == 0 and cluster.nodes[node].gpus == 4
        assert eff.total_gpus == cluster.total_gpus - 4
        for backend in ("highs", "cp-sat", "greedy"):  # store_round validates each decision
            snap = s.round_input()
            d = run_round(eff, snap.jobs, 140.0, RoundConfig(backend=backend)).decision
            assert validate(d, eff, snap.jobs).ok
            assert all(node not in al.placement for al in d.allocations)
        res2, _ = store_round(s, cluster, "r2", now=140.0, backend="highs")
        assert all(node not in al.placement for al in res2.decision.allocations)
        assert node_up(s, node, 150.0) == "up" and excluded_nodes(s, 150.0) == set()
        assert s.check_invariants() == []


def test_a_flapping_node_is_quarantined(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs_from_data(jobs_data(), "jobs")[0], at=0.0)
        for t in (10.0, 20.0):
            assert node_fault(s, "a10-1", t, window_s=100, threshold=3).node_state == "down"
            assert node_up(s, "a10-1", t + 1) == "up"
        fr = node_fault(s, "a10-1", 30.0, window_s=100, threshold=3, quarantine_s=1000)
        assert fr.node_state == "quarantined" and fr.faults_in_window == 3
        assert node_up(s, "a10-1", 40.0) == "quarantined"  # not lifted early
        assert "a10-1" in excluded_nodes(s, 500.0)
        assert effective_cluster(s, cluster, 500.0).nodes["a10-1"].gpus == 0
        assert "a10-1" not in excluded_nodes(s, 1031.0)  # the quarantine ran its course
        assert node_up(s, "a10-1", 1031.0) == "up"
        # faults outside the window do not add up
        assert node_fault(s, "a40-0", 0.0, window_s=10).node_state == "down"
        node_up(s, "a40-0", 1.0)
        assert node_fault(s, "a40-0", 50.0, window_s=10).faults_in_window == 1


def test_worker_faults_requeue_and_count_against_the_node(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    jobs, _ = jobs_from_data(jobs_data(), "jobs")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs, at=0.0)
        t = 100.0
        for k in range(3):
            store_round(s, cluster, f"r{k}", now=t, backend="highs")
            victim = next(j for j in s.jobs() if j.state is JobState.RUNNING)
            fr = worker_fault(s, victim.id, t + 1, node="a40-0", detail="exit 137",
                              window_s=1000, threshold=3)
            assert victim.id in fr.requeued
            assert s.job(victim.id).state in (JobState.QUEUED, JobState.CHECKPOINTED)
            t += 10
        assert fr.node_state == "quarantined"
        assert all("a40-0" not in (j.running or {}).get("placement", {}) for j in s.jobs())
        assert effective_cluster(s, cluster, t).nodes["a40-0"].gpus == 0
        assert s.check_invariants() == []


def test_all_nodes_down_gives_an_empty_round_not_a_crash(files: dict[str, Path]) -> None:
    cluster = cluster_from_data(CLUSTER, "t")
    with open_store(files["db"], create=True) as s:
        s.submit(jobs_from_data(jobs_data(), "jobs")[0], at=0.0)
        for n in cluster.nodes:
            node_fault(s, n, 5.0)
        eff = effective_cluster(s, cluster, 10.0)
        assert eff.total_gpus == 0
        res, c = store_round(s, cluster, "empty", now=10.0)
        assert res.decision.allocations == [] and c.created
        assert all(j.state is JobState.QUEUED for j in s.jobs())
