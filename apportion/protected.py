"""The files a command reads or keeps as its store, so that no output of it replaces one.

An operator who types ``solve-round --state s.db --json s.db`` (or points ``--json`` at
the ``--jobs`` file it read) meant something else: written through, the round would be
committed and then the store, every job and round in it, replaced by a decision; or the
queue file by the answer to it. Every input file a command reads (through the bounded
readers of :mod:`apportion.inputs`) and every store it opens (with the ``-wal``, ``-shm``
and ``.lock`` files beside it) is remembered here for the command's duration, and
:mod:`apportion.outputs` refuses an output that is one of them, by the same file (after
links) or by the same inode (a hard link), with exit 2 and nothing written.

Commands also name their input options up front (:func:`protect_paths`), so the
refusal comes before any work; the check at write time is the net under every other
path (a trace, a table file, a profile read deep inside a command).

The registry is per command: :func:`command_scope` empties it when a command starts and
ends, so a test runner that invokes many commands in one process does not carry one
command's inputs into the next.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: the files SQLite and the round lock keep beside a store
STORE_SIDECARS = ("-wal", "-shm", "-journal", ".lock")


@dataclass(frozen=True)
class Claim:
    """What a protected file is to this command: its name as given and the option."""

    given: str
    what: str  # "the --state store", "a jobs input", ...


_BY_ID: dict[tuple[int, int], Claim] = {}
_BY_PATH: dict[str, Claim] = {}
_LOCK = threading.Lock()


def _real(path: str | Path) -> str | None:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return None


def protect(path: str | Path, what: str, *, st: os.stat_result | None = None,
            sidecars: tuple[str, ...] = ()) -> None:
    """Remember ``path`` (and ``path + suffix`` for each of ``sidecars``) as ``what``.

    ``st``: the file's status as the reader opened it (its descriptor's), so a file
    replaced between the check and the read is the one remembered.
    """
    given = str(path)
    real = _real(path)
    if st is None:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            st = None
    claim = Claim(given, what)
    with _LOCK:
        if st is not None and stat.S_ISREG(st.st_mode):
            _BY_ID.setdefault((st.st_dev, st.st_ino), claim)
        if real is not None:
            _BY_PATH.setdefault(real, claim)
            for suffix in sidecars:
                _BY_PATH.setdefault(real + suffix, Claim(given + suffix, what))


def protect_paths(*pairs: tuple[str | Path | None, str]) -> None:
    """Remember the existing files among ``(path, option)`` inputs, before any work. A
    value that names no file (a bundled cluster name, say) is not a file to protect."""
    for path, option in pairs:
        if path is None or str(path) in ("", "-"):
            continue
        try:
            if not os.path.isfile(path):
                continue
        except (OSError, ValueError):
            continue
        protect(path, f"the {option} input")


def claimed(real: str | Path | None, st: os.stat_result | None) -> Claim | None:
    """The claim on an output that is ``real`` (its resolved path) with status ``st``
    (None: it does not exist yet), if it is a protected file."""
    with _LOCK:
        if st is not None and stat.S_ISREG(st.st_mode):
            hit = _BY_ID.get((st.st_dev, st.st_ino))
            if hit is not None:
                return hit
        return _BY_PATH.get(str(real)) if real is not None else None


def clear() -> None:
    with _LOCK:
        _BY_ID.clear()
        _BY_PATH.clear()


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """One command's registry: empty when it starts and once it has ended."""
    clear()
    try:
        yield
    finally:
        clear()
