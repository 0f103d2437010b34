"""Ray inside the round's budget, and nothing of it left behind.

Each case once went wrong: a local Ray instance spent a 5-s budget starting, so both parts
were cancelled and the greedy answered; when Ray's workers could not start, a 5-s round
hung in ``ray.init`` until killed at 120-150 s; a killed partitioned solve left Ray's
processes running. Through the CLI, with a real Ray: a workers-cannot-start environment
is made with a ``sitecustomize`` that ends Ray's worker processes at birth (the driver and
Ray's own daemons start normally).
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
from typer.testing import CliRunner

from apportion import ray_home
from apportion.cli import app

pytest.importorskip("ray")

APPORTION = [sys.executable, "-m", "apportion.cli"]
runner = CliRunner()


def _users(folder: Path) -> list[int]:
    """Pids whose command line names ``folder`` (Ray's processes of that instance)."""
    needle = str(folder).encode()
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _ours(before: set[str]) -> list[Path]:
    top = ray_home.root()
    return [p for p in top.iterdir() if p.name not in before] if top.exists() else []


def _entries() -> set[str]:
    top = ray_home.root()
    return {p.name for p in top.iterdir()} if top.exists() else set()


def test_a_short_budget_is_refused_before_ray_starts() -> None:
    r = runner.invoke(app, ["solve-round", "--partitions", "2", "--engine", "ray",
                            "--time-budget", "5"])
    assert r.exit_code == 2, r.output
    assert "--engine" in r.stderr and "--time-budget 5" in r.stderr


@pytest.mark.timeout(300)
def test_workers_that_cannot_start_leave_the_solve_to_the_local_engine(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nif sys.argv and sys.argv[0].endswith('default_worker.py'):\n"
        "    sys.exit(3)\n")
    before = _entries()
    out = tmp_path / "d.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([*APPORTION, "solve-round", "--partitions", "2", "--engine", "ray",
                        "--time-budget", "30", "--json", str(out)], env=env,
                       capture_output=True, text=True, timeout=280, check=False)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())["solver"]
    tried = {a["backend"]: a for a in report["attempts"]}
    assert "did not start" in tried["ray-engine"]["message"], tried
    assert report["backend"] == "pop-2" and "local engine" in tried["pop-2"]["message"]
    assert not report["fallback"]
    for folder in _ours(before):  # the child's Ray, removed with it
        assert not _users(folder), folder
    assert not [p for p in _ours(before) if p.name.startswith("engine-")]


@pytest.mark.timeout(300)
def test_a_killed_solve_leaves_no_ray_behind(tmp_path: Path) -> None:
    before = _entries()
    proc = subprocess.Popen([*APPORTION, "solve-round", "--partitions", "2", "--engine",
                             "ray", "--time-budget", "600"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        folder = None
        while folder is None:  # the event: its Ray's raylet runs in a folder of its own
            assert proc.poll() is None, "the solve ended before its Ray started"
            for f in _ours(before):
                if any(b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes()
                       for p in _users(f) if Path(f"/proc/{p}").exists()):
                    folder = f
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole command, as a kill -9 of its group
        proc.wait()
        while _users(folder) or folder.exists():  # the watcher removes both
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
