"""Ray inside the budget and leaving nothing behind: a dead address is refused at once with
the flag named (Ray itself retried for minutes: 400 s on a 5 s budget), and what a killed
owner's Ray instance left — its processes and its folder — is removed by the next start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def test_what_a_killed_owner_left_is_removed_by_the_next_start(tmp_path: Path) -> None:
    top = ray_home.root()
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
    try:
        mine = ray_home.owned_temp_dir("test-")
        assert not left.exists()
        deadline = time.monotonic() + 10
        while agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.poll() is not None, "the stale agent still runs"
        assert Path(mine).is_dir() and alive(os.getpid(), None)
        ray_home.remove(mine)
        assert not Path(mine).exists()
    finally:
        if agent.poll() is None:
            agent.kill()
