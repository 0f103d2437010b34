"""`apportion cluster import --from ray` against a real Ray head with token authentication, as
`ray start --head` (Ray 2.60) starts one on a machine that has a token (it says "Token
authentication is enabled for this Ray cluster"). The address comes from
RAY_ADDRESS as `run` and `serve` take it; the token from where Ray keeps it
(~/.ray/auth_token, RAY_AUTH_TOKEN); a missing or wrong token exits 2 saying so by name,
never "internal error"."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import stop_processes_mentioning

pytest.importorskip("ray")

RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {**env, "HOME": str(home), "RAY_TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0",
            **extra}


@pytest.fixture(scope="module")
def head():
    tmp = Path(tempfile.mkdtemp(prefix="ray-a-", dir="/tmp"))  # short: socket paths
    home = tmp / "home"
    home.mkdir()
    port = _free_port()
    # a machine with a token (`ray get-auth-token --generate`, or one a head made before):
    # `ray start --head` then turns token authentication on by itself
    r = subprocess.run([*RAY, "get-auth-token", "--generate"], env=_env(home, tmp),
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([*RAY, "start", "--head", "--port", str(port), "--temp-dir", str(tmp),
                        "--num-cpus", "1", "--num-gpus", "2", "--include-dashboard", "false",
                        "--disable-usage-stats", "--resources",
                        json.dumps({"accelerator_type:A40": 1}),
                        "--dashboard-agent-listen-port", str(_free_port()),
                        "--metrics-export-port", str(_free_port()),
                        "--ray-client-server-port", str(_free_port())],
                       env=_env(home, tmp), capture_output=True, text=True, timeout=300,
                       check=False)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Token authentication is enabled" in r.stdout + r.stderr  # Ray's default
        assert (home / ".ray" / "auth_token").exists()
        yield {"address": f"127.0.0.1:{port}", "tmp": tmp, "home": home}
    finally:
        stop_processes_mentioning(tmp)  # never `ray stop`: it would stop every Ray on this host
        shutil.rmtree(tmp, ignore_errors=True)


def _import(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", "cluster", "import", "--from",
                           "ray", "--out", "-"], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)


def test_token_from_the_machine_and_address_from_the_environment(head, tmp_path) -> None:
    r = _import(_env(head["home"], head["tmp"], RAY_ADDRESS=head["address"]), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = yaml.safe_load(r.stdout)
    assert [(g["gpu_type"], g["gpus_per_node"]) for g in doc["node_groups"]] == [("A40", 2)]


@pytest.mark.parametrize("how", ["no token", "wrong token"])
def test_a_refused_token_exits_2_naming_it(head, tmp_path, how: str) -> None:
    other = tmp_path / "home"
    other.mkdir()
    extra = {"RAY_ADDRESS": head["address"]}
    if how == "wrong token":
        extra["RAY_AUTH_TOKEN"] = "0" * 32
    r = _import(_env(other, head["tmp"], **extra), tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "refused the connection: token authentication failed" in r.stderr
    assert "ray get-auth-token" in r.stderr and "internal error" not in r.stderr
    assert "--ray-address" in r.stderr
