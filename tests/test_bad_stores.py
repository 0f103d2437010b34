"""Bad state databases: one line with the remedy and exit 2, never a traceback (issue 17).

The state-store half of the bad-input corpus (``tests/test_bad_inputs.py`` gives every
corpus file as ``--state`` too): a foreign SQLite file (refused before it is switched to
WAL or written at all), damaged pages, rows edited by hand into nonsense, a store that is
read-only for its user (``status`` and ``history`` still work, writers say what to do).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from nonroot import NOBODY, run_as_nobody, skip_reason
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()
JOBS = {"jobs": [{"id": f"j{i}", "model": "bert-0.76b", "global_batch_size": 64,
                  "iterations": 100, "requested_gpus": 2} for i in range(3)]}
ROUND = ["solve-round", "--backend", "greedy", "--no-isolate", "--time-budget", "1"]


def _commands(db: Path, work: Path) -> dict[str, list[str]]:
    (work / "more.yaml").write_text(yaml.safe_dump(
        {"jobs": [{"id": "new", "model": "bert-0.76b", "global_batch_size": 64,
                   "iterations": 10, "requested_gpus": 1}]}))
    return {"status": ["status", "--state", str(db)],
            "status --json": ["status", "--state", str(db), "--json"],
            "history": ["history", "--state", str(db)],
            "cancel": ["cancel", "j0", "--state", str(db)],
            "submit": ["submit", str(work / "more.yaml"), "--state", str(db)],
            "solve-round --state": [*ROUND, "--state", str(db)]}


def _store(folder: Path, rounds: int = 1) -> Path:
    jobs = folder / "jobs.yaml"
    jobs.write_text(yaml.safe_dump(JOBS))
    db = folder / "s.db"
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    for k in range(rounds):
        r = runner.invoke(app, [*ROUND, "--state", str(db), "--round-key", f"r{k}"])
        assert r.exit_code == 0, r.output
    return db


def _one_line_exit_2(r, *fragments: str) -> None:  # type: ignore[no-untyped-def]
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output, r.output
    msg = " ".join(r.stderr.split())
    for f in fragments:
        assert f in msg, msg
    assert r.stdout.strip() == ""


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_foreign_sqlite_file_is_refused_before_being_touched(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
    conn.execute("INSERT INTO invoices(amount) VALUES (12.5)")
    conn.commit()
    conn.close()
    digest = _sha(db)
    for name, argv in _commands(db, tmp_path).items():
        r = runner.invoke(app, argv)
        _one_line_exit_2(r, str(db), "--state", "not an apportion state store")
        assert _sha(db) == digest, f"{name} changed the foreign file"
        assert not Path(str(db) + "-wal").exists() and not Path(str(db) + "-shm").exists()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # never switched
    conn.close()


def test_damaged_pages_name_the_remedy(tmp_path: Path) -> None:
    db = _store(tmp_path, rounds=2)
    size = db.stat().st_size
    with db.open("r+b") as fh:  # scribble over every page but the header page
        fh.seek(4096)
        fh.write(os.urandom(size - 4096))
    for argv in _commands(db, tmp_path).values():
        r = runner.invoke(app, argv)
        _one_line_exit_2(r, str(db), "damaged", ".recover")


@pytest.mark.parametrize("sql, field", [
    ("UPDATE jobs SET spec_json = '{not json' WHERE id = 'j1'", "jobs[j1].spec_json"),
    ("UPDATE jobs SET spec_json = '\"a string\"' WHERE id = 'j1'", "jobs[j1].spec_json"),
    ("UPDATE rounds SET cluster_json = 'x' WHERE id = 1", "rounds[1].cluster_json"),
    ("UPDATE decisions SET decision_json = '[' WHERE round_id = 1", "decisions[1]"),
])
def test_hand_corrupted_rows_are_named(tmp_path: Path, sql: str, field: str) -> None:
    db = _store(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()
    reader = "history" if field.startswith("decisions") else "status"
    r = runner.invoke(app, [reader, "--state", str(db)])
    _one_line_exit_2(r, str(db), field, "recover")
    r = runner.invoke(app, [*ROUND, "--state", str(db)])
    # a damaged job stops the round; a damaged old round does not concern a new one
    assert r.exit_code == (2 if field.startswith("jobs") else 0), r.output
    assert "Traceback" not in r.output


def test_job_spec_missing_fields_stops_the_round_not_status(tmp_path: Path) -> None:
    db = _store(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE jobs SET spec_json = '{\"model\": \"bert-0.76b\"}' WHERE id = 'j2'")
    conn.commit()
    conn.close()
    assert runner.invoke(app, ["status", "--state", str(db)]).exit_code == 0
    r = runner.invoke(app, [*ROUND, "--state", str(db)])
    _one_line_exit_2(r, "jobs[j2].spec_json", "not a job specification")


# -- read-only for its user -------------------------------------------------------------------
@pytest.fixture
def shared_store() -> Iterator[Path]:
    """A store owned by root in a root-owned folder that ``nobody`` may only read."""
    why = skip_reason()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="apportion-ro-"))
    os.chmod(folder, 0o755)
    try:
        db = _store(folder, rounds=1)
        os.chmod(db, 0o644)
        yield db
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_read_only_user_reads_and_writers_are_told_what_to_do(shared_store: Path) -> None:
    db, work = shared_store, shared_store.parent
    digest = _sha(db)
    for argv in (["status", "--state", str(db)], ["history", "--state", str(db), "--json"]):
        r = run_as_nobody(argv, work)
        assert r.returncode == 0, r.stderr
        assert "j0" in r.stdout or '"rounds"' in r.stdout
    for argv in (["cancel", "j0", "--state", str(db)], [*ROUND, "--state", str(db)]):
        r = run_as_nobody(argv, work)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "not writable by this user" in r.stderr and "owner" in r.stderr, r.stderr
    assert _sha(db) == digest
    # a writer has it open with changes still in its WAL: the reader sees them
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("UPDATE jobs SET reason = 'held by a writer' WHERE id = 'j1'")
    try:
        assert Path(str(db) + "-wal").stat().st_size > 0
        r = run_as_nobody(["status", "--state", str(db), "--json"], work)
        assert r.returncode == 0 and "held by a writer" in r.stdout, r.stderr
    finally:
        conn.close()


def test_store_in_a_folder_the_user_cannot_write(shared_store: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="apportion-own-"))
    try:
        os.chown(folder, NOBODY, NOBODY)
        mine = folder / "s.db"
        shutil.copy(shared_store, mine)
        os.chown(mine, NOBODY, NOBODY)
        os.chmod(folder, 0o555)  # the file is the user's, its folder is read-only
        r = run_as_nobody(["status", "--state", str(mine)], folder)
        assert r.returncode == 0, r.stderr
        r = run_as_nobody(["cancel", "j0", "--state", str(mine)], folder)
        assert r.returncode == 2 and "-wal and -shm" in r.stderr, r.stderr
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder, ignore_errors=True)
