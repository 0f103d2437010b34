"""Ray inside the budget and leaving nothing behind: a dead address is refused at once with
the flag named (Ray itself retried for minutes: 400 s on a 5 s budget), and what a killed
owner's Ray instance left — its processes and its folder — is removed by the next start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion import ray_home
from apportion.cli import app
from apportion.procinfo import alive

runner = CliRunner()
DEAD = "127.0.0.1:9"  # the discard port: nothing listens on it here


@pytest.mark.parametrize("argv", [
    ["solve-round", "--partitions", "2", "--engine", "ray", "--ray-address", DEAD,
     "--time-budget", "5"],
    ["compare", "--trace", "synthetic:4", "--cluster", "crius-testbed", "--policies", "fcfs",
     "--engine", "ray", "--ray-address", DEAD, "--out", "OUT"],
])
def test_a_dead_address_is_refused_by_name(argv: list[str], tmp_path: Path) -> None:
    r = runner.invoke(app, [a.replace("OUT", str(tmp_path / "out")) for a in argv])
    assert r.exit_code == 2, r.output
    assert "--ray-address" in r.stderr and DEAD in r.stderr


@pytest.mark.timeout(120)
def test_what_a_killed_owner_left_is_removed_by_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a root of this test's own: another apportion on the host (a second test run, an
    # operator's) sweeps the shared root too, and once removed the folder between its owner
    # file and its agent's start, leaving the agent to this test's verdict
    top = tmp_path / "ray-root"
    monkeypatch.setattr(ray_home, "root", lambda: top)
    top.mkdir(mode=0o700, exist_ok=True)
    left = top / "killed-owner"
    left.mkdir(exist_ok=True)
    # the owner: a process that has exited (a killed run)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (left / ray_home.OWNER_FILE).write_text(f"{gone.pid} 1\n")
    # one of its "agents", still running with the folder on its command line
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                              str(left / "session_latest")])
    # a process just started may show an empty command line for a moment (its exec is
    # still replacing it): the sweep finds agents by their command line, as a killed
    # owner's long-running ones always show it, so wait until this one shows it too
    needle = str(left).encode()
    while needle not in Path(f"/proc/{agent.pid}/cmdline").read_bytes():
        assert agent.poll() is None, "the agent ended before it started"
    try:
        mine = ray_home.owned_temp_dir("test-")
        assert not left.exists()
        # the sweep signalled it (TERM, then KILL) before returning: it has ended, and only
        # its exit status waits to be collected (no clock: a missed agent hangs here, and
        # the test's timeout names it)
        assert agent.wait() != 0, "the stale agent exited by itself"
        assert Path(mine).is_dir() and alive(os.getpid(), None)
        ray_home.remove(mine)
        assert not Path(mine).exists()
    finally:
        if agent.poll() is None:
            agent.kill()
