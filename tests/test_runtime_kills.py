"""Runs survive kills: launch records (intent first, per-store monotonic ids), a SIGKILLed run's
workers adopted (or stopped) by the next run and never doubled, and a short random-kill soak
(the full 200-kill soak is `python -m apportion.runtime.killtest --kills 200`)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from apportion.runtime.killtest import audit, soak
from apportion.runtime.executors.procs import alive

from apportion import store_launches as sl
from apportion.config import jobs_from_data
from apportion.store import open_store
from apportion.store_schema import SCHEMA_VERSION
from apportion.store_schema import migrate


def _store(tmp: Path, n: int = 1):
    store = open_store(tmp / "s.db", create=True)
    jobs, _ = jobs_from_data({"jobs": [{"id": f"j{i}", "model": "gpt-tiny",
                                        "global_batch_size": 4, "iterations": 10,
                                        "requested_gpus": 1} for i in range(n)]}, "j.yaml")
    store.submit(jobs)
    return store


def test_launch_ids_are_monotonic_and_states_move_legally(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        a = sl.begin_launch(store, "j0", "local", "start", {"dp": 1}, {"n": 1}, "d", "me")
        b = sl.begin_launch(store, "j0", "local", "restart", {"dp": 1}, {"n": 1}, "d", "me")
        assert (a, b) == (1, 2)
        sl.launch_started(store, a, [{"rank": 0, "pid": 1}])
        sl.launch_stopping(store, a, "resize")
        assert sl.launch_ended(store, a, "checkpointed", checkpoint_end=5)
        assert not sl.launch_ended(store, a, "failed")  # closing twice writes nothing
        with pytest.raises(sqlite3.IntegrityError, match="illegal launch state"):
            store.conn.execute("UPDATE launches SET state = 'running' WHERE id = ?", (a,))
        with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
            store.conn.execute("DELETE FROM launches WHERE id = ?", (a,))
        assert [r.id for r in sl.open_launches(store)] == [b]
        assert [e["dst"] for e in sl.launch_events(store, a)] == [
            "intended", "running", "stopping", "ended"]
    with open_store(tmp_path / "s.db") as store:  # ids never restart, whatever happened
        c = sl.begin_launch(store, "j0", "local", "start", {}, {}, "d", "me")
        assert c == 3
        sl.launch_ended(store, b, "failed", checkpoint_end=0)
        sl.launch_ended(store, c, "failed", checkpoint_end=0)
        assert sl.consecutive_failures(store, "j0") == 2
        d = sl.begin_launch(store, "j0", "local", "start", {}, {}, "d", "me", checkpoint_start=0)
        sl.launch_ended(store, d, "failed", checkpoint_end=4)  # it saved progress first
        assert sl.consecutive_failures(store, "j0") == 0


def test_a_version_2_store_gains_launch_records(tmp_path: Path) -> None:
    db = tmp_path / "v2.db"
    conn = sqlite3.connect(str(db), isolation_level=None)
    assert migrate(conn, target=2) == 2
    conn.close()
    with open_store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION and sl.launches(store) == []


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def _run(cwd: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "apportion.cli", "run", "--executor", "local",
                             "--cluster", "local", "--state", "s.db", "--workdir", "runs",
                             "--interval", "2", "--until-idle", "--checkpoint-every", "5",
                             "--checkpoint-interval", "0", "--grace-period", "30", *extra],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _workers(db: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT workers_json FROM launches WHERE state = 'running'").fetchall()
    return [(w["pid"], w["start_ticks"]) for (wj,) in rows for w in json.loads(wj)]


def _until(cond, limit: float = 240.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("orphans", ["adopt", "stop"])
def test_a_killed_runs_workers_are_adopted_or_stopped_never_doubled(tmp_path: Path,
                                                                     orphans: str) -> None:
    pytest.importorskip("torch")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "long", "model": "bert-tiny", "global_batch_size": 4, "iterations": 150,
         "requested_gpus": 2}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    db = tmp_path / "s.db"
    first = _run(tmp_path)

    def progressed() -> bool:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            row = c.execute("SELECT iterations_done FROM jobs").fetchone()
        return bool(_workers(db)) and row[0] >= 6

    _until(progressed)
    workers = _workers(db)
    os.kill(first.pid, signal.SIGKILL)  # the run only: its workers train on
    first.wait()
    time.sleep(1.0)
    assert all(alive(p, t) for p, t in workers), "workers died with their run"
    second = _run(tmp_path, "--orphans", orphans)
    _, err = second.communicate(timeout=400)
    assert second.returncode == 0, err[-3000:]
    st = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    (job,) = st["jobs"]
    assert job["state"] == "finished" and job["iterations_done"] == 150, job
    assert not any(alive(p, t) for p, t in workers)
    with open_store(db) as store:
        recs = sl.launches(store, "long")
        whys = [e["why"] for e in sl.launch_events(store)]
    if orphans == "adopt":
        assert any(w.startswith("adopted by") for w in whys), whys
        # the adopted group ran on (a later round may still resize it, from its checkpoint)
        assert recs[0].outcome in ("finished", "checkpointed") and recs[-1].outcome == "finished"
    else:
        assert any(r.outcome == "stopped" and "orphan" in r.detail for r in recs), [
            (r.outcome, r.detail) for r in recs]
        assert len(recs) >= 2 and recs[-1].outcome == "finished", [
            (r.id, r.action, r.outcome, r.detail) for r in recs]
    res = audit(tmp_path, ["long"])
    assert res["jobs_lost"] == 0 and res["steps_trained_twice"] == 0, res
    assert res["resumed_from_older_checkpoint"] == res["resumed_from_newer_checkpoint"] == 0
    assert res["progress_lost_steps"]["over_one_interval"] == 0, res
    assert res["processes_left_holding_job_folders"] == []


def test_random_kills_of_run_and_workers_lose_nothing(tmp_path: Path) -> None:
    """A short soak (the full one: `python -m apportion.runtime.killtest --kills 200`)."""
    pytest.importorskip("torch")
    res = soak(tmp_path / "soak", kills=int(os.environ.get("APPORTION_KILLS", "6")), seed=3,
               jobs=2, iterations=24, final_timeout_s=600.0)
    assert res["final_run_exit"] == 0, res
    assert res["jobs_lost"] == 0 and res["jobs_finished"] == res["jobs_submitted"], res
    assert res["steps_trained_twice"] == 0, res
    assert res["resumed_from_older_checkpoint"] == res["resumed_from_newer_checkpoint"] == 0
    assert res["progress_lost_steps"]["over_one_interval"] == 0, res
    assert res["max_loss_difference_on_retrained_steps"] < 1e-3, res
    assert res["launch_ids_monotonic"] and res["processes_left_holding_job_folders"] == []
