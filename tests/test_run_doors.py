"""``apportion run`` goes through the same doors as ``solve-round --state``: the user's
``--estimator`` is the one the rounds use and the decisions name (the online refit corrects
it; it used to replace it with the analytic model), ``--tables`` is accepted, a node the
store holds down is never planned on, and a job no catalog can plan is failed by the
round's commit, with its reason, whichever command committed the round."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from apportion.jobs import JobSpec
from apportion.store import open_store
from apportion.store_faults import node_fault


def _cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _decisions(tmp: Path) -> list[dict]:
    with open_store(tmp / "s.db") as store:
        return [store.decision(r["id"]) for r in store.rounds()]


CLUSTER = {"name": "two", "node_groups": [
    {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4}]}


def test_run_rounds_use_the_chosen_estimator(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "a", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 4,
         "requested_gpus": 1}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", "local", "--cluster", "local", "--state", "s.db",
             "--estimator", "morphling", "--interval", "2", "--until-idle", "--timeout", "300",
             "--time-budget", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    allocs = [a for d in _decisions(tmp_path) for a in d["allocations"]]
    assert allocs and all(a["estimator"] == "morphling" for a in allocs), allocs


def test_run_refuses_tables_without_a_table_estimator(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text("model,gpu_type,gpus,iter_time_s\ngpt-tiny,A40,1,0.1\n")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "a", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 4,
         "requested_gpus": 1}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--state", "s.db", "--tables", "m.csv", "--timeout", "1", cwd=tmp_path)
    assert r.returncode == 2 and "--tables" in r.stderr, r.stderr


def test_run_plans_around_a_down_node_and_fails_what_no_catalog_plans(tmp_path: Path) -> None:
    """A node recorded down in the store is out of ``run``'s rounds (``solve-round --state``
    always planned around it; ``run`` planned on the configured cluster), and a job whose
    model left the catalog is failed with its reason at the commit (``run`` kept it queued
    with a pending reason every round for ever)."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "a", "model": "bert-336m", "global_batch_size": 32, "iterations": 100,
         "requested_gpus": 4}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    with open_store(tmp_path / "s.db") as store:
        store.submit([JobSpec("gone", "a-model-no-catalog-has", 32, 100, 1)], source="test")
        node_fault(store, "a40-0", time.time(), detail="lost in a test")
    r = _cli("run", "--executor", "dry-run", "--cluster", "c.yaml", "--state", "s.db",
             "--interval", "1", "--timeout", "3", "--time-budget", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    decisions = _decisions(tmp_path)
    placed = [a for d in decisions for a in d["allocations"] if a["job"] == "a"]
    assert placed and all(set(a["placement"]) == {"a40-1"} for a in placed), placed
    st = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    gone = next(j for j in st["jobs"] if j["id"] == "gone")
    assert gone["state"] == "failed" and "cannot be planned" in gone["reason"], gone
