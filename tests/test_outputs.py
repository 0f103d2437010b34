"""Every kind of output target, through the commands that write outputs (issue 17, item 3).

``-`` is stdout; an existing device, FIFO or socket (or a symlink to one) is written in
place and stays what it was; a regular file is replaced atomically with its permission
bits kept; a new file honours the umask; a symlink to a regular file is followed (the link
stays a link). Output paths are checked before any work, and with ``--state`` before the
round is committed. The same cases run as a non-root user (``setpriv`` to ``nobody``).

Devices are made with ``mknod`` inside the test's folder (the same major/minor as
/dev/null and /dev/full), so a regression can only ever replace a test file, never a
device of this host.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from nonroot import NOBODY, run_as_nobody, skip_reason
from typer.testing import CliRunner

from apportion import outputs
from apportion.cli import app
from apportion.errors import HostError, InputError

runner = CliRunner()
ROUND = ["solve-round", "--backend", "greedy", "--no-isolate", "--time-budget", "1"]


def _device(path: Path, minor: int) -> Path:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"mknod is not permitted here ({exc}); device targets cannot be tested")
    os.chmod(path, 0o666)
    return path


def _json_out(r: Any) -> Any:
    assert r.exit_code == 0, (r.exit_code, r.output)
    return json.loads(r.stdout)


# -- the module -------------------------------------------------------------------------------
def test_new_file_honours_the_umask(tmp_path: Path) -> None:
    for mask, want in ((0o022, 0o644), (0o027, 0o640), (0o002, 0o664), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            f = tmp_path / f"new-{mask:o}.json"
            outputs.write_json(f, {"a": 1})
        finally:
            os.umask(old)
        assert stat.S_IMODE(f.stat().st_mode) == want, oct(f.stat().st_mode)
        assert json.loads(f.read_text()) == {"a": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_regular_file_replaced_atomically_keeping_its_mode(tmp_path: Path) -> None:
    f = tmp_path / "out.json"
    f.write_text("old")
    os.chmod(f, 0o640)
    inode = f.stat().st_ino
    outputs.write_json(f, [1, 2])
    assert json.loads(f.read_text()) == [1, 2]
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert f.stat().st_ino != inode  # a new file renamed over the old one


def test_failed_writer_leaves_the_old_file(tmp_path: Path) -> None:
    f = tmp_path / "out.txt"
    f.write_text("old")
    with pytest.raises(RuntimeError), outputs.open_output(f) as fh:
        fh.write("half")
        raise RuntimeError("writer failed")
    assert f.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_symlink_to_regular_file_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    outputs.write_json(link, {"x": 2})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"x": 2}
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "created.json")
    outputs.write_json(dangling, 1)
    assert dangling.is_symlink() and (tmp_path / "created.json").read_text() == "1\n"


def test_device_written_in_place_never_replaced(tmp_path: Path) -> None:
    null = _device(tmp_path / "null", 3)
    link = tmp_path / "to-null"
    link.symlink_to(null)
    for target in (null, link):
        outputs.write_json(target, {"a": 1})
    assert stat.S_ISCHR(null.stat().st_mode) and link.is_symlink()
    full = _device(tmp_path / "full", 7)
    with pytest.raises(HostError) as exc:
        outputs.write_json(full, {"a": 1})
    assert exc.value.exit_code == 75 and "No space left" in str(exc.value)
    assert stat.S_ISCHR(full.stat().st_mode)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    yield path, got
    # a reader still waiting in open() is unblocked by a writer that opens and closes;
    # non-blocking, because a reader that has just read and is exiting has the pipe
    # closed already, and a blocking open would then wait for a partner forever
    for _ in range(100):
        if not t.is_alive():
            break
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader has the pipe open (it has finished)
            pass
        t.join(0.05)
    assert not t.is_alive()


def test_fifo_written_in_place(fifo: tuple[Path, list[bytes]]) -> None:
    path, got = fifo
    outputs.write_json(path, {"via": "fifo"})
    for _ in range(100):
        if got:
            break
        threading.Event().wait(0.05)
    assert json.loads(got[0]) == {"via": "fifo"}
    assert stat.S_ISFIFO(path.stat().st_mode)


def test_socket_written_in_place() -> None:
    folder = Path(tempfile.mkdtemp(prefix="apo-sock-"))  # AF_UNIX paths are short
    try:
        path = folder / "s"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen(1)
        got: list[bytes] = []

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                chunks = []
                while data := conn.recv(65536):
                    chunks.append(data)
                got.append(b"".join(chunks))

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        outputs.write_json(path, {"via": "socket"})
        t.join(5)
        srv.close()
        assert json.loads(got[0]) == {"via": "socket"}
        assert stat.S_ISSOCK(path.stat().st_mode)
        with pytest.raises(HostError, match="nothing accepts"):  # no listener any more
            outputs.write_json(path, {})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "is a folder"),
    (lambda d: d / "missing" / "x.json", "does not exist"),
    (lambda d: (d / "f").write_text("x") and d / "f" / "x.json", "Not a directory"),
])
def test_bad_targets_refused_before_work(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(InputError, match=message) as exc:
        outputs.check_outputs((make(tmp_path), "--json"))
    assert exc.value.field == "--json"


def test_two_options_on_one_target_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="at most one may be -"):
        outputs.check_outputs(("-", "--json"), ("-", "--dump-problem"))
    f = tmp_path / "a.json"
    link = tmp_path / "b.json"
    link.symlink_to(f)
    with pytest.raises(InputError, match="also given to --json"):
        outputs.check_outputs((f, "--json"), (link, "--dump-problem"))


# -- through the commands ---------------------------------------------------------------------
def test_dash_is_stdout_and_the_table_moves_to_stderr(tmp_path: Path) -> None:
    r = runner.invoke(app, [*ROUND, "--json", "-"])
    data = _json_out(r)
    assert data["formulation"] == "cells" and "allocations" in data
    assert "apportion round decision" in r.stderr
    assert not (Path.cwd() / "-").exists()
    r = runner.invoke(app, [*ROUND, "--dump-problem", "-"])
    assert "candidates" in json.dumps(_json_out(r))


def _units(tmp_path: Path) -> Path:
    f = tmp_path / "units.json"
    f.write_text(json.dumps({"devices": [{"name": "a", "speed": 1}],
                             "models": [{"name": "m", "units": [1, 2]}]}))
    return f


def _tasks(tmp_path: Path) -> Path:
    f = tmp_path / "tasks.yaml"
    f.write_text(yaml.safe_dump({"tasks": [{"id": "a", "epochs": 2, "epoch_time_1gpu": 3,
                                            "max_gpus": 2}]}))
    return f


# command -> argv with the output option last (cheap runs only; the expensive commands share
# the same helper and are covered for check-before-work below)
CHEAP = {
    "solve-round --json": lambda d: [*ROUND, "--json"],
    "solve-round --dump-problem": lambda d: [*ROUND, "--dump-problem"],
    "estimate --json": lambda d: ["estimate", "--job", "bert-1.3b:256", "--cell", "A40:8",
                                  "--estimator", "analytic", "--json"],
    "solve-shards --json": lambda d: ["solve-shards", "--units", str(_units(d)), "--method",
                                      "lrtf", "--json"],
    "solve-finetune --json": lambda d: ["solve-finetune", "--tasks", str(_tasks(d)),
                                        "--capacity", "2", "--time-budget", "2", "--json"],
    "simulate --json": lambda d: ["simulate", "--trace", "synthetic:4", "--cluster",
                                  "crius-testbed", "--policy", "fcfs", "--json"],
    "simulate --jobs-csv": lambda d: ["simulate", "--trace", "synthetic:4", "--cluster",
                                      "crius-testbed", "--policy", "fcfs", "--jobs-csv"],
}


@pytest.mark.parametrize("command", sorted(CHEAP))
def test_every_cheap_output_option_takes_each_target(command: str, tmp_path: Path) -> None:
    argv = CHEAP[command](tmp_path)
    r = runner.invoke(app, [*argv, "-"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip(), "nothing on stdout for -"
    if command.endswith("--jobs-csv"):
        assert r.stdout.splitlines()[0].startswith("job_id,")
    else:
        json.loads(r.stdout)
    null = _device(tmp_path / "null", 3)
    link = tmp_path / "null-link"
    link.symlink_to(null)
    assert runner.invoke(app, [*argv, str(link)]).exit_code == 0
    assert stat.S_ISCHR(null.stat().st_mode) and link.is_symlink()
    full = _device(tmp_path / "full", 7)
    r = runner.invoke(app, [*argv, str(full)])
    assert r.exit_code == 75 and "No space left on device" in r.stderr, r.output
    target = tmp_path / "real.out"
    target.write_text("old")
    os.chmod(target, 0o604)
    follow = tmp_path / "follow.out"
    follow.symlink_to(target)
    assert runner.invoke(app, [*argv, str(follow)]).exit_code == 0
    assert follow.is_symlink() and target.read_text() != "old"
    assert stat.S_IMODE(target.stat().st_mode) == 0o604


EXPENSIVE = {  # refused before any work: each would take seconds to minutes otherwise
    "bench sim --json": ["bench", "sim", "--json"],
    "bench solve --json": ["bench", "solve", "--quick", "--json"],
    "bench estimate --json": ["bench", "estimate", "--against", "crius", "--json"],
    "bench estimate --markdown": ["bench", "estimate", "--against", "crius", "--markdown"],
    "bench estimate --errors": ["bench", "estimate", "--against", "morphling", "--errors"],
    "profile --json": ["profile", "gpt-tiny", "--json"],
    "compare --out": ["compare", "--trace", "philly", "--cluster", "crius-testbed",
                      "--policies", "fcfs", "--out"],
    "run --workdir": ["run", "--state", "x.db", "--workdir"],
}


@pytest.mark.parametrize("command", sorted(EXPENSIVE))
def test_expensive_commands_check_outputs_first(command: str, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = tmp_path / "missing" / "x" if command.endswith(("--out", "--workdir")) \
        else tmp_path  # a folder where a file is wanted
    if command.endswith(("--out", "--workdir")):
        bad = blocker  # a file where a folder is wanted
    r = runner.invoke(app, [*EXPENSIVE[command], str(bad)])
    assert r.exit_code == 2, r.output
    assert str(bad) in r.stderr and command.split()[-1] in r.stderr, r.stderr


def _store(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [
        {"id": "j1", "model": "bert-0.76b", "global_batch_size": 64, "iterations": 100,
         "requested_gpus": 2}]}))
    db = tmp_path / "s.db"
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    return db


def _rounds(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
    finally:
        conn.close()


def test_state_round_refuses_a_bad_output_before_committing(tmp_path: Path) -> None:
    db = _store(tmp_path)
    for bad in (tmp_path, tmp_path / "no" / "such.json"):
        r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(bad)])
        assert r.exit_code == 2 and "--json" in r.stderr, r.output
        assert _rounds(db) == 0
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", "-"])
    assert json.loads(r.stdout)["allocations"] and _rounds(db) == 1
    full = _device(tmp_path / "full", 7)  # a write that fails after the commit says where
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(full), "--round-key", "k2"])
    # exit 2, not 75 ("try again later"): a rerun would commit a second round
    assert r.exit_code == 2 and "is committed" in r.stderr and "history" in r.stderr, r.output
    assert "run it again" not in r.stderr and "would commit another round" in r.stderr
    assert _rounds(db) == 2


# -- as a non-root user -------------------------------------------------------------------------
@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder owned by ``nobody`` (tmp_path's parents are root-only)."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="apportion-nonroot-"))
    os.chmod(folder, 0o755)
    os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_outputs_as_a_non_root_user(nobody_dir: Path) -> None:
    d = nobody_dir
    r = run_as_nobody([*ROUND, "--json", "new.json"], d, umask="002")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((d / "new.json").stat().st_mode) == 0o664
    assert (d / "new.json").stat().st_uid == NOBODY
    r = run_as_nobody([*ROUND, "--json", "-"], d)
    assert r.returncode == 0 and json.loads(r.stdout)["allocations"], r.stderr
    # /dev/stdout is a symlink to the pipe: written in place
    r = run_as_nobody([*ROUND, "--json", "/dev/stdout"], d, through_pipe=True)
    assert r.returncode == 0 and json.loads(r.stdout)["allocations"], r.stderr
    null = _device(d / "null", 3)
    r = run_as_nobody([*ROUND, "--json", "null"], d)
    assert r.returncode == 0 and stat.S_ISCHR(null.stat().st_mode), r.stderr
    (d / "real.json").write_text("old")
    os.chown(d / "real.json", NOBODY, NOBODY)
    (d / "link.json").symlink_to(d / "real.json")
    r = run_as_nobody([*ROUND, "--dump-problem", "link.json"], d)
    assert r.returncode == 0 and (d / "link.json").is_symlink(), r.stderr
    assert "candidates" in (d / "real.json").read_text()
    pipe = d / "pipe"  # a FIFO another program reads: written in place
    os.mkfifo(pipe)
    os.chown(pipe, NOBODY, NOBODY)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    r = run_as_nobody([*ROUND, "--json", "pipe"], d)
    reader.join(30)
    assert r.returncode == 0 and json.loads(got[0])["allocations"], r.stderr
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    locked = d / "locked"
    locked.mkdir()
    os.chmod(locked, 0o755)  # root's folder: nobody cannot write into it
    r = run_as_nobody([*ROUND, "--json", str(locked / "x.json")], d)
    assert r.returncode == 2 and "not writable" in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
