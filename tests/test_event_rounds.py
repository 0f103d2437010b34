"""Rounds start on events, the interval only their upper bound: a job submitted to a
running `run` (or `serve`) is decided within seconds, not at the next tick.

The loop runs with a one-hour interval, so any decision the test sees came from an event;
the verdicts wait for what the store says (no clock in them: a round that never comes
fails by the test's timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

APPORTION = [sys.executable, "-m", "apportion.cli"]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APPORTION, *argv], capture_output=True, text=True, timeout=120,
                          check=False)


def _status(db: Path) -> dict[str, dict]:
    r = _cli("status", "--state", str(db), "--json")
    assert r.returncode == 0, r.stderr
    return {j["id"]: j for j in json.loads(r.stdout)["jobs"]}


def _rounds(db: Path) -> int:
    r = _cli("history", "--state", str(db), "--json")
    assert r.returncode == 0, r.stderr
    return len(json.loads(r.stdout)["rounds"])


def _jobs(path: Path, ids: list[str]) -> Path:
    path.write_text(yaml.safe_dump({"jobs": [
        {"id": i, "model": "bert-0.76b", "global_batch_size": 64, "iterations": 10**6,
         "requested_gpus": 2} for i in ids]}))
    return path


@pytest.mark.timeout(300)
def test_a_submission_and_a_cancellation_are_decided_without_waiting_for_the_tick(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert _cli("submit", str(_jobs(tmp_path / "a.yaml", ["a"])), "--state", str(db)
                ).returncode == 0
    run = subprocess.Popen([*APPORTION, "run", "--executor", "dry-run", "--cluster",
                            "crius-testbed", "--state", str(db), "--interval", "3600",
                            "--timeout", "280", "--workdir", str(tmp_path / "runs")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        while _status(db)["a"]["state"] != "running":  # the first round, at the start
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
        # a burst: two jobs in one submission, a third just after
        assert _cli("submit", str(_jobs(tmp_path / "b.yaml", ["b", "c"])), "--state",
                    str(db)).returncode == 0
        assert _cli("submit", str(_jobs(tmp_path / "d.yaml", ["d"])), "--state",
                    str(db)).returncode == 0
        while {_status(db)[j]["state"] for j in "bcd"} != {"running"}:
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
        after_submit = _rounds(db)
        assert 2 <= after_submit <= 3  # one round per event burst, never one per poll
        assert _cli("cancel", "b", "--state", str(db)).returncode == 0
        while _rounds(db) == after_submit:  # the cancelled job's GPUs go to a round now
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGTERM)
            run.wait(60)


def test_bench_decide_measures_submit_to_decision_through_a_real_serve(tmp_path: Path) -> None:
    """``apportion bench decide``: a real serve over a store with a queue, probes submitted
    over HTTP, each waited for until a round decided it; the server's histogram counted
    the queue and every probe."""
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "apportion.cli", "bench", "decide", "--queued",
                        "12", "--gpus", "16", "--probes", "2", "--time-budget", "2",
                        "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(out.read_text())
    assert row["probes"] == 2 and row["rounds"] >= 2  # each probe decided by a round
    assert 0 < row["wait_median_s"] <= row["wait_p99_s"] <= row["wait_max_s"]
    assert row["server_count"] == 12 + 2
    assert row["debounce_s"] > 0 and row["min_gap_s"] > 0
