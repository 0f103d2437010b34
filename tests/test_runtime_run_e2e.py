"""End to end: submit three small jobs, `apportion run` trains them for real, the store shows it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

JOBS = """jobs:
  - {id: a, model: gpt-tiny, global_batch_size: 8, iterations: 24, requested_gpus: 2}
  - {id: b, model: bert-tiny, global_batch_size: 8, iterations: 16, requested_gpus: 1}
  - {id: c, model: gpt-tiny, global_batch_size: 8, iterations: 32, requested_gpus: 2}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=400)


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_run_trains_submitted_jobs_to_completion(tmp_path: Path, executor: str) -> None:
    pytest.importorskip("torch")
    if executor == "ray":
        pytest.importorskip("ray")
    (tmp_path / "jobs.yaml").write_text(JOBS)
    assert _cli("submit", "jobs.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", executor, "--cluster", "local", "--state", "s.db",
             "--interval", "3", "--until-idle", "--timeout", "300", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    status = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    by_id = {j["id"]: j for j in status["jobs"]}
    for jid, iters in (("a", 24), ("b", 16), ("c", 32)):
        assert by_id[jid]["state"] == "finished", by_id[jid]
        assert by_id[jid]["iterations_done"] == iters
    hist = json.loads(_cli("history", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    rounds = hist["rounds"] if isinstance(hist, dict) else hist
    assert rounds and all(r["status"] in ("optimal", "feasible") for r in rounds)
    started = {a["job"] for r in rounds for a in r.get("actions", []) if a["action"] == "start"}
    assert started == {"a", "b", "c"}


def test_run_refuses_bad_input(tmp_path: Path) -> None:
    r = _cli("run", "--executor", "warp", "--state", "nope.db", cwd=tmp_path)
    assert r.returncode == 2 and "executor" in r.stderr
    r = _cli("run", "--executor", "dry-run", "--state", "nope.db", cwd=tmp_path)
    assert r.returncode == 2 and "nope.db" in r.stderr
