"""What ``apportion serve`` asks of the store: connections opened per request beside the
loop's, in one process, while other processes (``status``, ``submit``) come and go."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from apportion.store import open_store


def test_a_second_connection_in_one_process_survives_another_process(tmp_path: Path) -> None:
    """Regression: the header check of a second ``open_store`` in the process read the file
    through Python and closed it, which dropped the POSIX locks of the process's first
    connection; a ``status`` in another process then rebuilt the WAL index under it, and
    every later open in the first process failed with "disk I/O error"."""
    db = tmp_path / "s.db"
    loop = open_store(db, create=True)
    loop.submit([], source="test")
    try:
        for step in range(3):
            with open_store(db, readonly=True) as request:  # what a request handler does
                assert request.generation() == loop.generation()
            r = subprocess.run([sys.executable, "-m", "apportion.cli", "status", "--state",
                                str(db), "--json"], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            with loop.transaction():  # the loop commits a round meanwhile
                pass
            with open_store(db) as request:
                assert request.generation() == loop.generation(), step
                assert request.check_invariants() == []
    finally:
        loop.close()


def test_a_replaced_file_is_checked_again(tmp_path: Path) -> None:
    """The skip is for the very file this process has open (same inode), never a path."""
    import pytest

    from apportion.errors import InputError

    db = tmp_path / "s.db"
    held = open_store(db, create=True)
    try:
        other = tmp_path / "other"
        other.write_bytes(b"not a database at all, just text")
        other.replace(db)
        with pytest.raises(InputError, match="not a SQLite file"):
            open_store(db)
    finally:
        held.close()
