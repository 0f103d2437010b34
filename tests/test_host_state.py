"""The host-state corpus: the host's state never breaks apportion (issue 17, item 5).

Beside the bad-input corpus: a running Ray, a stale /tmp/ray, a read-only working
folder, a full disk (a file-size limit: no mount is needed), a restrictive umask, a
missing HOME, an unwritable cache, clocks that jumped. Each command involved works, or
fails with exit 2 / 75 and a one-line message, and loses nothing (the state store keeps
its content, an old output file stays whole).

Ray is only ever started with a private ``RAY_TMPDIR`` (never the host's /tmp/ray, which
other engineers' Ray may use) and stopped at the end; the "stale /tmp/ray" is a private
copy of what a crashed Ray leaves behind.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import stop_processes_mentioning
import yaml
from apportion.estimation.cache import DiskCache
from nonroot import NOBODY, run_as_nobody, skip_reason
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()
APPORTION = str(Path(sys.executable).with_name("apportion"))
ROUND = ["solve-round", "--backend", "greedy", "--no-isolate", "--time-budget", "1"]
JOBS = {"jobs": [{"id": f"j{i}", "model": "bert-0.76b", "global_batch_size": 64,
                  "iterations": 100, "requested_gpus": 2} for i in range(3)]}


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None,
         fsize: int | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``apportion ARGS`` in a child process (its own limits and environment)."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    full = {**os.environ, **(env or {})}
    for k in [k for k, v in full.items() if v is None]:
        full.pop(k)
    return subprocess.run([APPORTION, *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, check=False)


def _store(folder: Path) -> Path:
    (folder / "jobs.yaml").write_text(yaml.safe_dump(JOBS))
    db = folder / "s.db"
    r = runner.invoke(app, ["submit", str(folder / "jobs.yaml"), "--state", str(db)])
    assert r.exit_code == 0, r.output
    return db


def _dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def _one_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


# -- Ray ----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    folder = Path(tempfile.mkdtemp(prefix="ray-host-", dir="/tmp"))  # short: socket paths
    try:
        yield folder
    finally:
        stop_processes_mentioning(folder)  # whatever Ray the test left, and only that
        shutil.rmtree(folder, ignore_errors=True)


def _empty_store(folder: Path) -> Path:
    db = _store(folder)
    for i in range(3):
        assert runner.invoke(app, ["cancel", f"j{i}", "--state", str(db)]).exit_code == 0
    return db


def _run_ray(folder: Path, db: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _cli(["run", "--executor", "ray", "--cluster", "local", "--state", str(db),
                 "--until-idle", "--timeout", "60", "--workdir", str(folder / "runs")], folder,
                env={"RAY_AUTH_MODE": "disabled", **env})


def test_a_running_ray_is_not_joined(ray_tmp: Path) -> None:
    """A Ray someone started (and RAY_ADDRESS pointing at it) must not capture the run."""
    env = {"RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled"}
    port = _free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    start = subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=1",
                            "--include-dashboard=false", "--disable-usage-stats"],
                           env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=180, check=False)
    try:
        if start.returncode != 0:
            pytest.skip(f"cannot start a Ray head here: {start.stderr[-300:]}")
        db = _empty_store(ray_tmp)
        before = _dump(db)
        r = _run_ray(ray_tmp, db, {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"})
        assert r.returncode == 0, r.stderr[-2000:]
        _one_line(r.stderr)
        assert _dump(db) == before  # an idle run changes nothing
    finally:  # never `ray stop`: it stops every Ray on the host, in-process ones included
        stop_processes_mentioning(ray_tmp)


def test_a_stale_ray_temp_folder_is_ignored(ray_tmp: Path) -> None:
    """What a killed Ray leaves: a current-cluster file naming a dead address, a dangling
    session link, a folder this user may not write."""
    stale = ray_tmp / "ray"
    stale.mkdir()
    (stale / "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}\n")
    (stale / "session_latest").symlink_to(stale / "session_2020-01-01_00-00-00_000000_1")
    os.chmod(stale, 0o555)
    try:
        db = _empty_store(ray_tmp)
        r = _run_ray(ray_tmp, db, {"RAY_TMPDIR": str(ray_tmp)})
        assert r.returncode == 0, r.stderr[-2000:]
        _one_line(r.stderr)
    finally:
        os.chmod(stale, 0o755)


# -- a read-only working folder ------------------------------------------------------------------
@pytest.fixture
def readonly_cwd() -> Iterator[Path]:
    why = skip_reason()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="apportion-rocwd-"))
    os.chmod(folder, 0o755)  # root's folder: nobody may read, not write
    (folder / "jobs.yaml").write_text(yaml.safe_dump(JOBS))
    try:
        yield folder
    finally:
        stop_processes_mentioning(folder)  # whatever Ray the test left, and only that
        shutil.rmtree(folder, ignore_errors=True)


def test_read_only_working_folder(readonly_cwd: Path) -> None:
    d = readonly_cwd
    r = run_as_nobody(ROUND, d)  # reads only: works
    assert r.returncode == 0, r.stderr
    for args, option in ((ROUND + ["--json", "decision.json"], "--json"),
                         (["submit", "jobs.yaml", "--state", "s.db"], "--state"),
                         (["compare", "--trace", "synthetic:3", "--cluster", "crius-testbed",
                           "--policies", "fcfs"], "--out"),
                         (["simulate", "--trace", "synthetic:3", "--cluster", "crius-testbed",
                           "--policy", "fcfs", "--jobs-csv", "jobs.csv"], "--jobs-csv")):
        r = run_as_nobody(args, d)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert option in r.stderr and "writable" in r.stderr, r.stderr
        _one_line(r.stderr)
    assert sorted(p.name for p in d.iterdir()) == ["jobs.yaml"]  # nothing written


# -- a full disk (RLIMIT_FSIZE) -------------------------------------------------------------------
def test_full_disk_keeps_old_outputs_and_the_store(tmp_path: Path) -> None:
    old = tmp_path / "decision.json"
    old.write_text('{"old": true}\n')
    r = _cli([*ROUND, "--json", str(old)], tmp_path, fsize=1024)
    assert r.returncode == 75, (r.returncode, r.stderr)
    assert "file-size limit" in r.stderr and str(old) in r.stderr, r.stderr
    _one_line(r.stderr)
    assert json.loads(old.read_text()) == {"old": True}  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decision.json"]  # no temporaries

    db = _store(tmp_path)
    before = _dump(db)
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump({"jobs": [
        {"id": f"m{i}", "model": "bert-0.76b", "global_batch_size": 64, "iterations": 100,
         "requested_gpus": 2, "tenant": "t" * 200} for i in range(200)]}))
    limit = db.stat().st_size + 4096  # the store may not grow by what this submit needs
    r = _cli(["submit", str(more), "--state", str(db)], tmp_path, fsize=limit)
    assert r.returncode == 75, (r.returncode, r.stderr)
    assert "full" in r.stderr and "free space" in r.stderr, r.stderr
    _one_line(r.stderr)
    assert _dump(db) == before  # all or nothing
    r = _cli([*ROUND, "--state", str(db)], tmp_path, fsize=limit)
    assert r.returncode in (0, 75), r.stderr
    _one_line(r.stderr)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    jobs = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    conn.close()
    assert jobs == 3


def test_a_new_store_on_a_full_disk_is_not_left_half_made(tmp_path: Path) -> None:
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(JOBS))
    r = _cli(["submit", "jobs.yaml", "--state", "new.db"], tmp_path, fsize=8192)
    assert r.returncode == 75, (r.returncode, r.stderr)
    _one_line(r.stderr)
    r = _cli(["submit", "jobs.yaml", "--state", "new.db"], tmp_path)  # space again: works
    assert r.returncode == 0, r.stderr
    r = runner.invoke(app, ["status", "--state", str(tmp_path / "new.db"), "--json"])
    assert len(json.loads(r.stdout)["jobs"]) == 3


# -- a restrictive umask --------------------------------------------------------------------------
def test_restrictive_umask(tmp_path: Path) -> None:
    why = skip_reason()
    if why:
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix="apportion-umask-"))
    try:
        os.chown(d, NOBODY, NOBODY)
        (d / "jobs.yaml").write_text(yaml.safe_dump(JOBS))
        r = run_as_nobody(["submit", "jobs.yaml", "--state", "s.db"], d, umask="077")
        assert r.returncode == 0, r.stderr
        r = run_as_nobody([*ROUND, "--state", "s.db", "--json", "d.json"], d, umask="077")
        assert r.returncode == 0, r.stderr
        for name in ("s.db", "d.json"):
            assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
        r = run_as_nobody(["status", "--state", "s.db", "--json"], d, umask="077")
        assert r.returncode == 0 and len(json.loads(r.stdout)["jobs"]) == 3, r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- a missing HOME and an unwritable cache ---------------------------------------------------------
def test_unwritable_cache_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = DiskCache(blocker / "cache")  # a path through a file: nothing can be made there
    with caplog.at_level("WARNING", logger="apportion.estimation.cache"):
        cache.put("kind", {"k": 1}, {"v": 2})
        cache.put("kind", {"k": 2}, {"v": 3})
    assert cache.get("kind", {"k": 1}) is None
    warnings = [r for r in caplog.records if "not writable" in r.getMessage()]
    assert len(warnings) == 1  # once per cache, not once per entry


def test_profile_without_home_and_with_an_unwritable_cache(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    env["APPORTION_CACHE"] = str(blocker / "cache")
    r = subprocess.run([APPORTION, "profile", "gpt-tiny", "--batch", "2", "--devices", "1",
                        "--json", "p.json"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not writable" in r.stderr and "APPORTION_CACHE" in r.stderr, r.stderr
    assert json.loads((tmp_path / "p.json").read_text())
    _one_line(r.stderr)


# -- clocks that jumped -----------------------------------------------------------------------------
@pytest.mark.parametrize("when", [4.0e12, -4.0e12, 0.0])  # far future, far past, the epoch
def test_store_times_from_a_clock_that_jumped(tmp_path: Path, when: float) -> None:
    db = _store(tmp_path)
    assert runner.invoke(app, [*ROUND, "--state", str(db)]).exit_code == 0
    conn = sqlite3.connect(db)
    conn.execute("UPDATE jobs SET submitted_at = ?, updated_at = ?", (when, when))
    conn.execute("UPDATE rounds SET committed_at = ?, now_s = ?", (when, when))
    conn.execute("UPDATE job_events SET at = ?", (when,))
    spec = json.loads(conn.execute("SELECT spec_json FROM jobs WHERE id='j1'").fetchone()[0])
    spec["submit_time_s"] = max(when, 0.0)
    conn.execute("UPDATE jobs SET spec_json = ? WHERE id = 'j1'", (json.dumps(spec),))
    conn.commit()
    conn.close()
    for args in (["status", "--state", str(db)], ["history", "--state", str(db)],
                 ["history", "--state", str(db), "--json"],
                 [*ROUND, "--state", str(db)],
                 ["run", "--executor", "dry-run", "--cluster", "crius-testbed", "--state",
                  str(db), "--interval", "1", "--timeout", "3", "--time-budget", "1",
                  "--workdir", str(tmp_path / "runs")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output, r.exception)
        assert "Traceback" not in r.output
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 3
    conn.close()


