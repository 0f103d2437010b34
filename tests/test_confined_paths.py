"""Paths confined and outputs safe around a commit, through the CLI door (issue 46).

Real files, real FIFOs, a real SQLite store:

* the round lock ``<db>.lock`` is never followed: a symlink or a hard link planted
  there is refused and its target keeps its bytes;
* outputs are written through what was checked: a file swapped for a symlink, or a
  folder swapped for a link to another, after the check is refused (or, once opened,
  written where it was opened), never redirected;
* ``solve-round --state`` opens its outputs before it commits: a FIFO nothing reads
  commits nothing and leaves no lock held; a reader gets the decision only after the
  lock is released; a write that fails after the commit never asks for a rerun;
* ``cluster import`` writes by the same output rules as every command;
* a new store appears whole (a full disk leaves no 0-byte store) and ``history``'s limit
  never reads as damage;
* the Task2Vec data of ``--gains auto`` goes through the one reader (a 40000 x 40000
  header, a fake zip, a pickle, a FIFO, a 60 MB file, non-UTF-8 and huge CSV fields).
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import apportion.policies
from apportion import outputs
from apportion.cli import app
from apportion.store import RoundLock, StoreBusy

runner = CliRunner()
ROUND = ["solve-round", "--backend", "greedy", "--no-isolate"]
JOBS = {"jobs": [{"id": "j1", "model": "bert-0.76b", "global_batch_size": 64,
                  "iterations": 100, "requested_gpus": 2}]}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with one queued job."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump(JOBS))
    path = tmp_path / "s.db"
    r = runner.invoke(app, ["submit", str(jobs), "--state", str(path)])
    assert r.exit_code == 0, r.output
    return path


def _rounds(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
    finally:
        conn.close()


def _one_line(r: Any) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


# -- the round lock ----------------------------------------------------------------------------
@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_a_planted_round_lock_is_refused_and_its_target_kept(db: Path, tmp_path: Path,
                                                             plant: str) -> None:
    """A symlinked lock once had its target truncated by a round (run as root, any file)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock = Path(str(db) + ".lock")
    lock.unlink(missing_ok=True)
    if plant == "symlink":
        lock.symlink_to(victim)
    else:
        os.link(victim, lock)
    r = runner.invoke(app, [*ROUND, "--state", str(db)])
    assert r.exit_code == 2, r.output
    line = _one_line(r)
    assert "round lock" in line and ("symbolic link" in line or "hard link" in line), line
    assert victim.read_text() == "precious\n"
    assert _rounds(db) == 0
    lock.unlink()
    assert runner.invoke(app, [*ROUND, "--state", str(db)]).exit_code == 0  # the lock it makes


# -- outputs around the commit -----------------------------------------------------------------
@pytest.mark.timeout(120)  # a blocking open of the FIFO would hang: fail instead
def test_a_fifo_nothing_reads_commits_nothing_and_holds_no_lock(db: Path,
                                                                tmp_path: Path) -> None:
    """It once committed the round, then blocked for ever holding the lock."""
    fifo = tmp_path / "decision.fifo"
    os.mkfifo(fifo)
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(fifo)])
    assert r.exit_code == 2, r.output
    assert "--json" in _one_line(r) and "nothing reads" in r.stderr
    assert _rounds(db) == 0
    r = runner.invoke(app, [*ROUND, "--state", str(db)])  # no lock left held: not 75
    assert r.exit_code == 0, r.output
    assert _rounds(db) == 1


@pytest.mark.timeout(120)
def test_a_fifo_reader_gets_the_decision_after_the_lock_is_released(db: Path,
                                                                    tmp_path: Path) -> None:
    """The first byte of the decision reaches the reader when the round lock is free again,
    so a reader that stops reading can never hold every later round up."""
    fifo = tmp_path / "decision.fifo"
    os.mkfifo(fifo)
    seen: dict[str, Any] = {}

    def reader() -> None:
        with open(fifo, "rb") as fh:
            first = fh.read(1)
            try:
                with RoundLock(db, "test reader"):
                    seen["lock"] = "free"
            except StoreBusy:
                seen["lock"] = "held"
            seen["data"] = first + fh.read()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(fifo)])
    t.join(60)
    assert r.exit_code == 0, r.output
    assert seen["lock"] == "free"
    assert json.loads(seen["data"])["allocations"] and _rounds(db) == 1


def test_a_write_that_fails_after_the_commit_asks_for_no_rerun(db: Path) -> None:
    """/dev/full after the commit once said "run it again" (exit 75): a rerun committed a
    second round. Now: exit 2, the round named, where its decision is."""
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here")
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(full)])
    assert r.exit_code == 2, r.output
    assert "round 1 is committed" in r.stderr and "history" in r.stderr
    assert "run it again" not in r.stderr and _rounds(db) == 1


def _swap_during_the_round(monkeypatch: pytest.MonkeyPatch, swap: Any) -> None:
    """Run ``swap`` while the round solves: after every check, before any write."""
    real = apportion.policies.run_round
    real_step = apportion.policies.Scheduler.step

    def run_round(*a: Any, **k: Any) -> Any:  # a round from --jobs
        swap()
        return real(*a, **k)

    def step(*a: Any, **k: Any) -> Any:  # a round on --state, through the Scheduler
        swap()
        return real_step(*a, **k)

    monkeypatch.setattr(apportion.policies, "run_round", run_round)
    monkeypatch.setattr(apportion.policies.Scheduler, "step", step)


def test_an_output_swapped_for_a_symlink_after_the_check_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "decision.json"
    out.write_text("old\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")

    def swap() -> None:
        out.unlink()
        out.symlink_to(victim)

    _swap_during_the_round(monkeypatch, swap)
    r = runner.invoke(app, [*ROUND, "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert "changed after it was checked" in r.stderr and "--json" in r.stderr
    assert victim.read_text() == "precious\n"


def test_a_folder_swapped_for_a_link_after_the_check_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()

    def swap() -> None:
        folder.rename(tmp_path / "results.old")
        folder.symlink_to(elsewhere)

    _swap_during_the_round(monkeypatch, swap)
    r = runner.invoke(app, [*ROUND, "--json", str(folder / "decision.json")])
    assert r.exit_code == 2, r.output
    assert "changed after it was checked" in r.stderr
    assert list(elsewhere.iterdir()) == []


def test_with_state_an_output_is_written_where_it_was_opened(
        db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--state`` opens its outputs before the round (the folder pinned by a descriptor):
    a folder swapped for a link while the round solves cannot redirect the write."""
    folder, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()

    def swap() -> None:
        folder.rename(tmp_path / "results.old")
        folder.symlink_to(elsewhere)

    _swap_during_the_round(monkeypatch, swap)
    r = runner.invoke(app, [*ROUND, "--state", str(db), "--json", str(folder / "d.json")])
    assert r.exit_code == 0, r.output
    assert list(elsewhere.iterdir()) == []
    assert json.loads((tmp_path / "results.old" / "d.json").read_text())["allocations"]


def test_a_device_swapped_for_a_symlink_after_the_check_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO given as --json, replaced by a link to a file before the write: refused."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")

    def swap() -> None:
        fifo.unlink()
        fifo.symlink_to(victim)

    _swap_during_the_round(monkeypatch, swap)
    r = runner.invoke(app, [*ROUND, "--json", str(fifo)])
    assert r.exit_code == 2, r.output
    assert "changed after it was checked" in r.stderr
    assert victim.read_text() == "precious\n"


# -- cluster import writes by the output rules ---------------------------------------------------
SCONTROL = ("NodeName=gpu17 CPUTot=64 Gres=gpu:a100_80g:8(S:0-1) NodeAddr=10.1.0.17 "
            "RealMemory=1031000 State=IDLE Partitions=gpu\n")


@pytest.fixture
def nodes(tmp_path: Path) -> Path:
    path = tmp_path / "nodes.txt"
    path.write_text(SCONTROL)
    return path


def test_cluster_import_keeps_a_symlink_and_honours_the_umask(tmp_path: Path,
                                                              nodes: Path) -> None:
    """Its own writer replaced a symlink and wrote 0644 whatever the umask."""
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    link = tmp_path / "cluster.yaml"
    link.symlink_to(target)
    r = runner.invoke(app, ["cluster", "import", "--from", "slurm", str(nodes), "--out",
                            str(link)])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and "gpu17" in target.read_text()
    new = tmp_path / "new.yaml"
    old = os.umask(0o077)
    try:
        r = runner.invoke(app, ["cluster", "import", "--from", "slurm", str(nodes), "--out",
                                str(new)])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(new.stat().st_mode) == 0o600


def test_cluster_import_writes_to_dev_stdout(nodes: Path) -> None:
    """It refused /dev/stdout (not a regular file); every other command writes to it."""
    r = subprocess.run([sys.executable, "-m", "apportion.cli", "cluster", "import", "--from",
                        "slurm", str(nodes), "--out", "/dev/stdout"], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["node_groups"][0]["nodes"] == ["gpu17"]


# -- the store: created whole, its history limit never damage ------------------------------------
def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_submit_onto_a_full_disk_leaves_no_store(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: the store's schema does not fit. It once
    left a 0-byte (half-made) store that every later command refused."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump(JOBS))
    store = tmp_path / "s.db"
    r = subprocess.run([sys.executable, "-m", "apportion.cli", "submit", str(jobs), "--state",
                        str(store)], preexec_fn=_limit_file_size, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 75, r.stderr
    assert "nothing was committed" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.yaml"]
    r2 = runner.invoke(app, ["submit", str(jobs), "--state", str(store)])
    assert r2.exit_code == 0, r2.output


def test_history_with_a_huge_limit_is_all_rounds_not_damage(db: Path) -> None:
    """--limit 10^23 overflowed SQLite's integers and read as "restore from a backup"."""
    assert runner.invoke(app, [*ROUND, "--state", str(db)]).exit_code == 0
    r = runner.invoke(app, ["history", "--state", str(db), "--json", "--limit", str(10**23)])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["rounds"]) == 1 and "backup" not in r.output


def test_ids_in_nfc_and_nfd_are_one_job_in_the_store(tmp_path: Path) -> None:
    """NFC and NFD spellings of one id became two jobs; cancel takes either spelling."""
    import unicodedata

    nfc, nfd = (unicodedata.normalize(f, "café") for f in ("NFC", "NFD"))
    store = tmp_path / "s.db"
    for k, spelling in enumerate((nfc, nfd)):
        f = tmp_path / f"jobs{k}.yaml"
        f.write_text(yaml.safe_dump({"jobs": [{**JOBS["jobs"][0], "id": spelling}]},
                                    allow_unicode=True), encoding="utf-8")
        r = runner.invoke(app, ["submit", str(f), "--state", str(store)])
        assert r.exit_code == (0 if k == 0 else 2), r.output
    assert "already" in r.stderr or "duplicate" in r.stderr or "exists" in r.stderr, r.stderr
    r = runner.invoke(app, ["cancel", nfd, "--state", str(store)])
    assert r.exit_code == 0 and "dropped" in r.stdout, r.output


# -- --gains auto: the task data through the one reader ------------------------------------------
def _npy_header_zip(shape: tuple[int, ...]) -> bytes:
    from numpy.lib import format as npformat

    head = io.BytesIO()
    npformat.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False,
                                           "shape": shape})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", head.getvalue() + bytes(4096))
        z.writestr("y.npy", head.getvalue())
    return buf.getvalue()


def _make_data(kind: str, path: Path) -> None:
    if kind == "40000x40000":
        path.write_bytes(_npy_header_zip((40000, 40000)))
    elif kind == "fake zip":
        path.write_bytes(b"PK\x03\x04" + b"not really a zip" * 10)
    elif kind == "pickle":
        np.savez(path, x=np.array([{"a": 1}] * 30, dtype=object), y=np.arange(30))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "60 MB":
        with path.open("wb") as fh:
            fh.truncate(60 * 2**20)
    elif kind == "non-UTF-8 csv":
        path.write_bytes(b"label,f0\nc\xff,1.0\n")
    elif kind == "200 KB field":
        path.write_text("label,f0\nc0," + "1" * 200_000 + "\n")
    elif kind == "text feature":
        path.write_text("label,f0\n" + "c0,abc\n" * 30)


DATA_CASES = [("40000x40000", ".npz", "arrays may hold 4194304 elements"),
              ("fake zip", ".npz", "not an .npz archive"),
              ("pickle", ".npz", "Python objects"),
              ("fifo", ".npz", "a named pipe (FIFO), not a regular file"),
              ("60 MB", ".npz", "limited to 4194304 bytes"),
              ("non-UTF-8 csv", ".csv", "not UTF-8 text"),
              ("200 KB field", ".csv", "a field of more than 4096 characters"),
              ("text feature", ".csv", "'abc' is not a number")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, suffix, message", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_gains_auto_data_is_read_by_the_one_reader(tmp_path: Path, kind: str, suffix: str,
                                                   message: str) -> None:
    data = tmp_path / f"A{suffix}"
    _make_data(kind, data)
    np.savez(tmp_path / "B.npz", x=np.zeros((30, 4)), y=np.arange(30) % 2)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [
        {"id": "A", "epochs": 10, "epoch_time_1gpu": 1, "max_gpus": 2, "data": data.name},
        {"id": "B", "epochs": 10, "epoch_time_1gpu": 1, "max_gpus": 2, "data": "B.npz"}]}))
    out = tmp_path / "out.json"
    r = runner.invoke(app, ["solve-finetune", "--tasks", str(tasks), "--capacity", "2",
                            "--gains", "auto", "--json", str(out)])
    assert r.exit_code == 2, (r.output, r.exception)
    line = _one_line(r)
    assert str(data) in line and "tasks[0].data" in line and message in line, line
    assert not out.exists()


@pytest.fixture(autouse=True)
def _no_leftover_outputs() -> Iterator[None]:
    """Every test starts with no remembered output checks (they are per command)."""
    outputs._CHECKED.clear()
    yield
    outputs._CHECKED.clear()
