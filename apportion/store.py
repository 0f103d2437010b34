"""The state store: jobs, rounds, decisions and what was measured, in one SQLite file.

Operators run ``solve-round`` from a timer for months; this is what makes that
safe. Design choices, and why:

* **SQLite, WAL mode, ``synchronous=FULL``**: a commit is durable once it
  returns, readers (``status``) never block the writer, and a process killed at
  any instant leaves either the old or the new transaction, never half (SQLite
  rolls an unfinished WAL transaction back on the next open).
* **A round is one transaction** (:meth:`StateStore.commit_round`): the round
  row, its decision JSON, one action row per job and every job's new state are
  written together. A round carries a key; committing a key that is already
  there changes nothing (an idempotent rerun).
* **Jobs are never lost**: a job row is never deleted (a trigger refuses it),
  its state moves only along :data:`apportion.lifecycle.TRANSITIONS` (a second
  trigger), and every move is logged in ``job_events`` in the same transaction.
* **Optimistic per-job versions**: ``submit`` and ``cancel`` do not wait for a
  round that is solving; each job row carries a version, the round remembers
  the versions it read, and a job that changed meanwhile (cancelled, say) is
  left as it is by the commit (its action is stored with ``applied = 0``).
* **Serialising rounds** uses an exclusive ``fcntl.flock`` on ``DB.lock``
  (:class:`RoundLock`), not a long SQLite write transaction: the critical
  section spans the whole read -> solve -> commit (seconds of solver time) and
  must not block ``submit``/``cancel`` for that long; a flock is released by
  the kernel when its holder dies, so a SIGKILLed round never leaves a stale
  lock; and the loser can be told at once who holds it (pid and command are
  written into the lock file).

Node and worker faults (the store side of them) live in
:mod:`apportion.store_faults`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import sqlite3
import stat
import threading
import time
import unicodedata
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Self

from apportion import protected
from apportion.cluster import Cluster
from apportion.console import printable
from apportion.decision import Action, Decision, Pending, Reason
from apportion.errors import InputError
from apportion.jobs import JobSpec, RunningState, Workload
from apportion.lifecycle import ACTIVE, IllegalTransition, JobState, check_transition
from apportion.store_schema import SCHEMA_VERSION, SchemaError, current_version, migrate

log = logging.getLogger(__name__)

SQLITE_HEADER = b"SQLite format 3\x00"
_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec) if f.name not in ("iterations_done", "running"))

#: jobs staged per transaction of a submission's temporary table (StateStore.submit): the
#: rows Python holds encoded at once; the store itself is written in one transaction
SUBMIT_BATCH = 5000
_STAGE_TABLE = ("CREATE TEMP TABLE IF NOT EXISTS submit_stage (n INTEGER PRIMARY KEY, "
                "id TEXT NOT NULL UNIQUE, spec_json TEXT NOT NULL, iterations INTEGER NOT "
                "NULL, done INTEGER NOT NULL)")


def _spec_json(j: JobSpec) -> str:
    """A job's stored specification: its fields but progress and placement."""
    spec = {k: getattr(j, k) for k in _SPEC_FIELDS}
    for k in ("batch_range", "grad_stats"):  # a job without them: its JSON as before
        if spec[k] is None:
            del spec[k]
    if j.workload is not None:
        spec["workload"] = j.workload.as_dict()
    return json.dumps(spec, sort_keys=True)


class StoreBusy(RuntimeError):
    """Another invocation holds the store (the round lock, or SQLite's write lock)."""


class _AlreadyCommitted(Exception):
    def __init__(self, round_id: int) -> None:
        self.round_id = round_id


class UnknownJob(KeyError):
    def __str__(self) -> str:
        return f"no job {self.args[0]!r} in the state store"


@dataclass
class JobRecord:
    """One job as the store holds it."""

    id: str
    state: JobState
    spec: dict[str, Any]
    iterations: int
    iterations_done: int
    checkpoint_iterations: int
    running: dict[str, Any] | None
    reason: str
    version: int
    submitted_at: float
    updated_at: float
    last_round: int | None
    # (grad_sqr, grad_var) the job last reported (``gradient_stats``), None before any
    grad_stats: tuple[float, float] | None = None

    def to_jobspec(self) -> JobSpec:
        """The :class:`JobSpec` a round consumes (with ``RunningState`` when running)."""
        running = None
        if self.state is JobState.RUNNING and self.running is not None:
            r = self.running
            running = RunningState(r["gpu_type"], int(r["gpus"]), int(r["stages"]),
                                   {k: int(v) for k, v in r["placement"].items()}, int(r.get("tp", 1)))
        spec = {k: v for k, v in self.spec.items() if k in _SPEC_FIELDS}
        if spec.get("workload") is not None:
            spec["workload"] = Workload.from_dict(spec["workload"])
        if spec.get("batch_range") is not None:  # JSON keeps it as a list
            spec["batch_range"] = tuple(int(x) for x in spec["batch_range"])
        if self.grad_stats is not None:  # what it reported outranks what it was submitted with
            spec["grad_stats"] = self.grad_stats
        elif spec.get("grad_stats") is not None:
            spec["grad_stats"] = tuple(float(x) for x in spec["grad_stats"])
        return JobSpec(**spec, iterations_done=self.iterations_done, running=running)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "model": self.spec.get("model"),
                "iterations": self.iterations, "iterations_done": self.iterations_done,
                "checkpoint_iterations": self.checkpoint_iterations,
                "requested_gpus": self.spec.get("requested_gpus"),
                "requested_gpu_type": self.spec.get("requested_gpu_type"),
                "tenant": self.spec.get("tenant"), "submit_time_s": self.spec.get("submit_time_s"),
                "running": self.running, "reason": self.reason, "last_round": self.last_round}


@dataclass
class RoundInput:
    """What a round read: the jobs as :class:`JobSpec` and the version of each."""

    jobs: list[JobSpec]
    versions: dict[str, int]
    states: dict[str, JobState]
    generation: int

    @property
    def default_key(self) -> str:
        """The round that follows this state: a retry from the same state reuses the key."""
        return f"gen-{self.generation}"


@dataclass
class CommitResult:
    round_id: int
    created: bool  # False: a round with this key was already committed (nothing changed)
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # changed while the round solved


def state_path(given: str | Path) -> Path:
    """``--state`` as the filesystem path it names; a SQLite URI spelling is refused.

    SQLite reads a name that starts with ``file:`` (any case) as a URI when the library
    was built with URI names on (Python's usually is), and ``:memory:`` as no file at all.
    The round lock and every check here work on the literal path, so ``file:y.db`` would
    lock and check one file while SQLite wrote ``y.db``, and ``file:m.db?mode=memory``
    would acknowledge a submit and keep nothing. A store is a file: its path is what is
    locked, checked and opened (always as an absolute path, which SQLite never reads as
    a URI).
    """
    text = str(given)
    if not text or "\0" in text:
        raise InputError(repr(text), "--state", "not a usable path")
    if text.lower().startswith("file:") or text.startswith(":memory:"):
        raise InputError(text, "--state", "a SQLite URI or in-memory name, not a file path: "
                         "the store must be a file, locked and checked by its path (for a "
                         f"file really named so, give its absolute path {os.path.abspath(text)})")
    return Path(text)


class RoundLock:
    """An exclusive, non-blocking ``flock`` on ``<db>.lock``, released when its holder dies."""

    def __init__(self, db_path: str | Path, command: str = "solve-round") -> None:
        self.path = Path(str(state_path(db_path)) + ".lock")
        self.command = command
        self._fd: int | None = None

    def _open(self) -> int:
        """The lock file, never through a link: a symlink (or a hard link, or anything but
        a regular file) planted as ``<db>.lock`` by someone who can write the store's
        folder would otherwise have its target truncated by a round run as root."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(str(self.path), "--state", "the round lock is a symbolic "
                                 "link; refused (a round would truncate its target): remove "
                                 "it, apportion creates the lock itself") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else \
                f"a hard link ({st.st_nlink} names)"
            raise InputError(str(self.path), "--state", f"the round lock is {what}; refused "
                             "(a round would truncate it): remove it, apportion creates the "
                             "lock itself")
        return fd

    def acquire(self, wait_s: float = 0.0) -> None:
        fd = self._open()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
                    os.close(fd)
                    raise StoreBusy(
                        f"{self.path.with_suffix('')}: another apportion invocation holds the round "
                        f"lock ({holder}); this {self.command} did nothing. Run it again once "
                        "that one has finished.") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {self.command}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# The store files this process has open, by (device, inode), with how many connections each.
# Another connection in the same process skips the header read of _check_db_path: closing any
# descriptor of the database file drops every POSIX lock this process holds on it (POSIX
# ties those locks to the process, not to the descriptor), SQLite's own connections' locks
# included; another process would then believe nobody uses the store and rebuild its WAL
# index under them ("disk I/O error" on this process's next open). `apportion serve` opens
# a connection per request beside the loop's.
_OPEN_FILES: Counter[tuple[int, int]] = Counter()
_OPEN_FILES_LOCK = threading.Lock()


def _file_key(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _check_db_path(path: Path, create: bool) -> None:
    """The file is a state database we may open: checked before SQLite touches it."""
    src = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(src, "--state", f"cannot use: {exc.strerror or exc}") from None
    if st is None:
        if not create:
            raise InputError(src, "--state", "no such state database (`apportion submit` "
                                             "creates one)")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(src, "--state", f"directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(src, "--state", f"cannot create the state database: folder "
                             f"{parent} is not writable by this user (or is read-only); "
                             "choose a writable folder")
        return
    if stat.S_ISDIR(st.st_mode):
        raise InputError(src, "--state", "is a directory, not a state database file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would hang the read below
        raise InputError(src, "--state", "not a regular file")
    with _OPEN_FILES_LOCK:
        if (st.st_dev, st.st_ino) in _OPEN_FILES:  # checked when this process opened it
            return
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise InputError(src, "--state", f"cannot read the state database: "
                         f"{exc.strerror or exc}; run as its owner or fix its permissions") from None
    if head and head != SQLITE_HEADER:
        raise InputError(src, "--state", "not an apportion state database (not a SQLite file)")
    if not head and not create:
        raise InputError(src, "--state", "an empty file, not an apportion state database")


def _writable(path: Path) -> bool:
    """Whether this user can write the store (SQLite also writes -wal/-shm beside it)."""
    parent = path.parent if str(path.parent) else Path(".")
    return (os.access(parent, os.W_OK | os.X_OK)
            and (not path.exists() or os.access(path, os.W_OK)))


class StoreDamaged(InputError):
    """The database file is damaged (bad pages, a hand-edited row): the remedy is named."""


def recover_hint(path: str | Path) -> str:
    return (f"restore it from a backup, or recover what is readable with `sqlite3 {path} "
            f".recover | sqlite3 recovered.db` and use --state recovered.db")


def store_error(exc: sqlite3.Error, path: str | Path) -> Exception:
    """One SQLite failure as the error a user can act on (exit 2, or 75 for busy / full)."""
    from apportion.errors import HostError

    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    src = str(path)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text or "busy" in text:
        return StoreBusy(f"{src}: the database is locked by another writer ({text}); run it "
                         "again once that one has finished")
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return HostError(f"{src}: the disk is full ({text}); nothing was committed: free "
                         "space and run it again", 75)
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return InputError(src, "--state", f"the state database is read-only here ({text}); "
                          "run as its owner, or make the file and its folder writable")
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        return InputError(src, "--state", f"cannot open ({text}); check the file and its "
                          "folder exist and are readable by this user")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text \
            or "not a database" in text:
        return StoreDamaged(src, "--state", f"the state database is damaged ({text}): "
                            + recover_hint(src))
    if name.startswith("SQLITE_IOERR"):
        return HostError(f"{src}: I/O error ({text}): the disk may be full or a file-size "
                         "limit may apply; nothing was committed: free space (or check the "
                         "disk) and run it again", 75)
    if isinstance(exc, sqlite3.IntegrityError):
        return StoreDamaged(src, "--state", f"a stored row breaks the store's rules ({text}): "
                            + recover_hint(src))
    return InputError(src, "--state", f"cannot use as a state database: {text}")


def open_store(path: str | Path, create: bool = False, busy_timeout_s: float = 10.0,
               readonly: bool = False) -> StateStore:
    """Open (and upgrade) a store; every problem with the file is an :class:`InputError`.

    A file that is not an apportion store (another program's SQLite database) is
    refused before anything is written to it (no switch to WAL, no migration).
    ``readonly``: for commands that only read (``status``, ``history``); a user who
    may not write the file or its folder still gets a consistent read.
    """
    p = state_path(path)
    protected.protect(p, "the --state store", sidecars=protected.STORE_SIDECARS)
    _check_db_path(p, create)
    if not _writable(p):
        if readonly and p.exists():
            return _open_readonly(p, busy_timeout_s)
        raise InputError(str(p), "--state", "the state database (or its folder, where SQLite "
                         "keeps its -wal and -shm files) is not writable by this user or is on "
                         "a read-only file system; run as its owner or fix the permissions "
                         "(read-only users can run `apportion status` and `history`)")
    if create and not p.exists():
        _create(p, busy_timeout_s)
    conn = sqlite3.connect(os.path.abspath(p), isolation_level=None, timeout=busy_timeout_s)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        current_version(conn)  # a foreign database is refused here, before any write
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            log.warning("%s: journal mode %s (WAL unavailable on this filesystem)", p, mode)
        conn.execute("PRAGMA synchronous = FULL")
        migrate(conn)
    except SchemaError as exc:
        conn.close()
        raise InputError(str(p), "--state", str(exc)) from None
    except sqlite3.Error as exc:
        conn.close()
        raise store_error(exc, p) from None
    return StateStore(p, conn)


def _create(p: Path, busy_timeout_s: float) -> None:
    """A new store appears whole or not at all: its schema is written to a temporary file
    beside it, which is then linked into place. Created in place, a disk that fills up
    while the schema is written left a 0-byte "store" that every later command refused;
    a concurrent creator's store is never replaced (the link fails, theirs is used)."""
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{time.monotonic_ns()}.new")
    sidecars = [Path(str(tmp) + s) for s in ("-wal", "-shm", "-journal")]
    try:
        conn = sqlite3.connect(os.path.abspath(tmp), isolation_level=None,
                               timeout=busy_timeout_s)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            migrate(conn)
        finally:
            conn.close()  # the last connection checkpoints the WAL into the file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass  # another process created it meanwhile: open theirs
    except sqlite3.Error as exc:
        raise store_error(exc, p) from None
    finally:
        for f in (tmp, *sidecars):
            with contextlib.suppress(OSError):
                f.unlink()


def _open_readonly(p: Path, busy_timeout_s: float) -> StateStore:
    """A read-only connection for a user who may not write the store or its folder.

    SQLite reads a WAL database read-only when its -shm file exists (a writer has it
    open); otherwise, with no pending WAL content, the main file alone is the whole
    committed state and is opened ``immutable``.
    """
    base = "file:" + urllib.parse.quote(str(p.resolve()))
    wal = Path(str(p) + "-wal")
    attempts = [base + "?mode=ro"]
    if not wal.exists() or wal.stat().st_size == 0:
        attempts.append(base + "?mode=ro&immutable=1")
    last: sqlite3.Error | None = None
    for uri in attempts:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout_s)
        try:
            version = current_version(conn)
            if version != SCHEMA_VERSION:
                conn.close()
                raise InputError(str(p), "--state", f"schema version {version}, this apportion "
                                 f"reads {SCHEMA_VERSION}; it is upgraded when a user who may "
                                 "write it opens it (run `apportion status` as its owner once)")
            conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
            return StateStore(p, conn, readonly=True)
        except SchemaError as exc:
            conn.close()
            raise InputError(str(p), "--state", str(exc)) from None
        except sqlite3.Error as exc:
            conn.close()
            last = exc
    assert last is not None
    raise InputError(str(p), "--state", f"cannot read as this user while a writer has pending "
                     f"changes ({last}); run as the store's owner, or again once it has "
                     "finished") from None


class StateStore:
    """All reads and writes of the state database. Use :func:`open_store` to get one."""

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool = False) -> None:
        self.path = path
        self.conn = conn
        self.readonly = readonly
        self._file = _file_key(path)
        if self._file is not None:
            with _OPEN_FILES_LOCK:
                _OPEN_FILES[self._file] += 1

    def close(self) -> None:
        self.conn.close()
        key, self._file = self._file, None
        if key is not None:
            with _OPEN_FILES_LOCK:
                _OPEN_FILES[key] -= 1
                if _OPEN_FILES[key] <= 0:
                    del _OPEN_FILES[key]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` .. ``COMMIT``: one atomic write, generation bumped inside it."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreBusy(f"{self.path}: the database is locked by another writer ({exc})") from None
        try:
            yield self.conn
            self.conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 "
                              "WHERE key = 'generation'")
            self.conn.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk fails the COMMIT itself): a
            # second ROLLBACK would hide the real error behind "no transaction is active"
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
            raise

    def generation(self) -> int:
        return int(self.conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])

    def schema_version(self) -> int:
        return int(self.conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    # -- jobs -----------------------------------------------------------------------
    _JOB_COLS = ("id, state, spec_json, iterations, iterations_done, checkpoint_iterations, "
                 "running_json, reason, version, submitted_at, updated_at, last_round, "
                 "(SELECT grad_sqr FROM gradient_stats WHERE gradient_stats.job = jobs.id), "
                 "(SELECT grad_var FROM gradient_stats WHERE gradient_stats.job = jobs.id)")

    def _record(self, row: tuple[Any, ...]) -> JobRecord:
        """A jobs row as a record; a row edited by hand into nonsense is :class:`StoreDamaged`
        naming the job and the column, never a traceback."""
        col = "state"
        try:
            state = JobState(row[1])
            col = "spec_json"
            spec = json.loads(row[2])
            if not isinstance(spec, dict):
                raise TypeError("not a JSON object")
            col = "running_json"
            running = json.loads(row[6]) if row[6] else None
            if running is not None and not isinstance(running, dict):
                raise TypeError("not a JSON object")
            col = "iterations"
            counts = [int(row[3]), int(row[4]), int(row[5])]
        except (ValueError, TypeError) as exc:
            raise StoreDamaged(str(self.path), f"jobs[{printable(row[0], False)}].{col}",
                               f"unreadable value ({exc}): " + recover_hint(self.path)) from None
        stats = None if row[12] is None else (float(row[12]), float(row[13]))
        return JobRecord(row[0], state, spec, counts[0], counts[1], counts[2], running, row[7],
                         row[8], row[9], row[10], row[11], stats)

    def jobs(self, states: frozenset[JobState] | None = None) -> list[JobRecord]:
        """Jobs in submission order; with ``states``, only those (chosen in SQL: the
        running jobs of a 20,000-job store are read without parsing the others)."""
        return self.jobs_page(0, None, states)[0]

    def jobs_page(self, after_seq: int = 0, limit: int | None = None,
                  states: frozenset[JobState] | None = None, tenant: str | None = None
                  ) -> tuple[list[JobRecord], int | None]:
        """Jobs in submission order after the one numbered ``after_seq`` (0: from the
        first), at most ``limit``; and the number of the last one returned when more follow
        (a cursor for the next page), else None. ``states`` and ``tenant`` keep only the
        jobs in those states, of that tenant (a spec without one: ``default``), in SQL,
        so a page of a filtered list costs a page."""
        q = f"SELECT seq, {self._JOB_COLS} FROM jobs WHERE seq > ?"
        args: list[Any] = [after_seq]
        if states is not None:
            q += f" AND state IN ({', '.join('?' * len(states)) or 'NULL'})"
            args += sorted(s.value for s in states)
        if tenant is not None:
            q += " AND COALESCE(json_extract(spec_json, '$.tenant'), 'default') = ?"
            args.append(tenant)
        q += " ORDER BY seq"
        if limit is not None:
            q += " LIMIT ?"
            args.append(min(int(limit), 2**62) + 1)
        rows = self.conn.execute(q, args).fetchall()
        more = limit is not None and len(rows) > limit
        rows = rows[:limit] if limit is not None else rows
        return [self._record(r[1:]) for r in rows], (int(rows[-1][0]) if more else None)

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (states with none are left out)."""
        return {str(k): int(n) for k, n in self.conn.execute(
            "SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")}

    def job(self, job_id: str) -> JobRecord:
        row = self.conn.execute(f"SELECT {self._JOB_COLS} FROM jobs WHERE id = ?",
                                (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id)
        return self._record(row)

    def events(self, job_id: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT seq, job, src, dst, round_id, at, why FROM job_events"
        rows = (self.conn.execute(q + " WHERE job = ? ORDER BY seq", (job_id,)) if job_id
                else self.conn.execute(q + " ORDER BY seq")).fetchall()
        keys = ("seq", "job", "src", "dst", "round_id", "at", "why")
        return [dict(zip(keys, r)) for r in rows]

    def first_starts(self) -> dict[str, float]:
        """Job id -> when it first started running (jobs that never ran are absent): the end
        of its admission wait, which ``/metrics`` reports as a histogram."""
        rows = self.conn.execute("SELECT job, MIN(at) FROM job_events WHERE dst = ? "
                                 "GROUP BY job", (JobState.RUNNING.value,)).fetchall()
        return {str(j): float(at) for j, at in rows}

    def _move(self, rec: JobRecord, dst: JobState, why: str, at: float,
              round_id: int | None = None, **cols: Any) -> None:
        """Change a job's state (and columns) and log the move; inside a transaction."""
        check_transition(rec.id, rec.state, dst)
        sets = ["state = ?", "version = version + 1", "updated_at = ?", "reason = ?"]
        args: list[Any] = [dst.value, at, why]
        for k, v in cols.items():
            sets.append(f"{k} = ?")
            args.append(json.dumps(v, sort_keys=True) if k == "running_json" and v is not None
                        else v)
        if dst is not JobState.RUNNING and "running_json" not in cols:
            sets.append("running_json = NULL")
        if round_id is not None:
            sets.append("last_round = ?")
            args.append(round_id)
        self.conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*args, rec.id))
        self.conn.execute("INSERT INTO job_events(job, src, dst, round_id, at, why) "
                          "VALUES (?, ?, ?, ?, ?, ?)", (rec.id, rec.state.value, dst.value,
                                                        round_id, at, why))
        rec.state = dst

    def submit(self, jobs: list[JobSpec], source: str = "submit", at: float | None = None) -> list[str]:
        """Add jobs, all or nothing; an id already in the store (or twice in ``jobs``) is an
        :class:`InputError` naming the first such ``jobs[i].id``, and nothing is written.

        The rows are made and staged :data:`SUBMIT_BATCH` at a time in a temporary table
        of this connection (SQLite's temporary database: no lock on the store, gone with
        the connection if the process dies), and one transaction then moves them all into
        the store with two ``INSERT ... SELECT`` statements. So other writers (a round's
        commit, ``cancel``, ``serve``) wait for SQLite's own loop over the rows (0.8 s for
        100,000 jobs, measured: experiments/results/bench/speed.md), not for Python
        encoding them (9 s when each job was written in the transaction), and a
        submission of any size is still all or nothing.
        """
        at = time.time() if at is None else at
        seen: set[str] = set()
        for i, j in enumerate(jobs):
            if j.running is not None:
                raise InputError(source, f"jobs[{i}].running", "a submitted job cannot be "
                                 "running; the store records placements from its rounds")
            if j.id in seen:
                raise InputError(source, f"jobs[{i}].id", f"duplicate job id {j.id!r}")
            seen.add(j.id)
        c = self.conn
        c.execute(_STAGE_TABLE)
        try:
            c.execute("DELETE FROM temp.submit_stage")
            for first in range(0, len(jobs), SUBMIT_BATCH):
                c.execute("BEGIN")
                c.executemany("INSERT INTO temp.submit_stage(n, id, spec_json, iterations, "
                              "done) VALUES (?, ?, ?, ?, ?)",
                              [(first + k, j.id, _spec_json(j), j.iterations, j.iterations_done)
                               for k, j in enumerate(jobs[first:first + SUBMIT_BATCH])])
                c.execute("COMMIT")
            with self.transaction():
                old = c.execute("SELECT s.n, s.id, j.state FROM temp.submit_stage s "
                                "JOIN jobs j ON j.id = s.id ORDER BY s.n LIMIT 1").fetchone()
                if old is not None:
                    raise InputError(source, f"jobs[{old[0]}].id", f"job id {old[1]!r} is "
                                     f"already in the state store (state {old[2]}); ids are "
                                     "never reused")
                base = int(c.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0])
                c.execute("INSERT INTO jobs(id, seq, spec_json, state, iterations, "
                          "iterations_done, checkpoint_iterations, submitted_at, updated_at) "
                          "SELECT id, ? + n + 1, spec_json, 'submitted', iterations, done, "
                          "done, ?, ? FROM temp.submit_stage ORDER BY n", (base, at, at))
                c.execute("INSERT INTO job_events(job, src, dst, at, why) SELECT id, NULL, "
                          "'submitted', ?, ? FROM temp.submit_stage ORDER BY n",
                          (at, f"submitted from {source}"))
        finally:
            if c.in_transaction:  # a staging batch failed (a full temporary folder)
                with contextlib.suppress(sqlite3.Error):
                    c.execute("ROLLBACK")
            with contextlib.suppress(sqlite3.Error):
                c.execute("DELETE FROM temp.submit_stage")
        return [j.id for j in jobs]

    def cancel(self, job_id: str, at: float | None = None, why: str = "cancelled") -> JobRecord:
        """Drop a job (any non-terminal state); its GPUs are free for the next round. The id
        is taken in NFC, the spelling ids are stored in (a terminal may type NFD)."""
        at = time.time() if at is None else at
        job_id = unicodedata.normalize("NFC", job_id)
        rec = self.job(job_id)
        if rec.state is JobState.DROPPED:  # cancelling twice is not an error, and writes nothing
            return rec
        with self.transaction():
            rec = self.job(job_id)
            self._move(rec, JobState.DROPPED, why, at)
        return self.job(job_id)

    def fail(self, job_id: str, why: str, at: float | None = None) -> JobRecord:
        at = time.time() if at is None else at
        with self.transaction():
            self._move(self.job(job_id), JobState.FAILED, why, at)
        return self.job(job_id)

    def change_token(self) -> tuple[int, int, float]:
        """What moves when something a round should see happens outside rounds: a job's
        move not made by a round (a submission, a cancellation, a job's end or failure, a
        requeue after a failed launch: ``job_events`` without a round) and a node's fault
        or return (``node_faults``, ``nodes``). A round's own moves and measured progress leave it be,
        so a run loop comparing it with the last round's can start the next round at once
        on an event (:meth:`apportion.runtime.store_adapter.SqliteRoundStore.arrived`)."""
        row = self.conn.execute(
            "SELECT (SELECT COALESCE(MAX(seq), 0) FROM job_events WHERE round_id IS NULL), "
            "(SELECT COALESCE(MAX(id), 0) FROM node_faults), "
            "(SELECT COALESCE(MAX(since_s), 0) FROM nodes)").fetchone()
        return int(row[0]), int(row[1]), float(row[2])

    # -- rounds ---------------------------------------------------------------------
    def round_input(self) -> RoundInput:
        """The queue and the running jobs, as a round consumes them (one consistent read)."""
        self.conn.execute("BEGIN")
        try:
            recs = self.jobs(ACTIVE)
            gen = self.generation()
        finally:
            self.conn.execute("COMMIT")
        specs = []
        for r in recs:
            try:
                specs.append(r.to_jobspec())
            except (KeyError, TypeError, ValueError) as exc:
                raise StoreDamaged(str(self.path), f"jobs[{printable(r.id, False)}].spec_json",
                                   f"not a job specification ({exc!r}): "
                                   + recover_hint(self.path)) from None
        return RoundInput(specs, {r.id: r.version for r in recs},
                          {r.id: r.state for r in recs}, gen)

    def round_by_key(self, key: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT id FROM rounds WHERE round_key = ?", (key,)).fetchone()
        return None if row is None else self.round(row[0])

    def commit_round(self, decision: Decision, snapshot: RoundInput, cluster: Cluster,
                     now_s: float, round_key: str | None = None,
                     at: float | None = None) -> CommitResult:
        """Write the round, its decision and every job's new state as ONE transaction.

        start/keep/resize/migrate -> running with the new placement; preempt ->
        checkpointed (a planned preemption checkpoints first); drop -> dropped;
        pending jobs stay queued (a submitted job is admitted: -> queued).
        """
        key = round_key or snapshot.default_key
        at = time.time() if at is None else at
        by_job: dict[str, Any] = {a.job: a for a in decision.allocations}
        by_job.update({p.job: p for p in decision.pending})
        try:
            return self._commit_round(decision, snapshot, cluster, now_s, key, at, by_job)
        except _AlreadyCommitted as done:  # rolled back: an idempotent rerun writes nothing
            return CommitResult(done.round_id, created=False)

    def _commit_round(self, decision: Decision, snapshot: RoundInput, cluster: Cluster,
                      now_s: float, key: str, at: float, by_job: dict[str, Any]) -> CommitResult:
        r = decision.report
        # made before the lock is taken (a 100,000-job decision is tens of MB of JSON, and
        # its writes a few seconds of Python): the rows to write from the jobs as they are
        # now, kept if no transaction changed the store meanwhile (its generation)
        decision_json = json.dumps(decision.as_dict(), sort_keys=True, default=str)
        cl = {"name": cluster.name, "capacity": cluster.capacity_by_type(),
              "nodes": len(cluster.nodes)}
        self.conn.execute("BEGIN")
        try:
            seen = self.generation()
            early = self._round_writes(snapshot, key, at, by_job, 0)
        finally:
            self.conn.execute("COMMIT")
        with self.transaction() as c:
            old = c.execute("SELECT id FROM rounds WHERE round_key = ?", (key,)).fetchone()
            if old is not None:
                raise _AlreadyCommitted(int(old[0]))
            cur = c.execute(
                "INSERT INTO rounds(round_key, now_s, committed_at, base_generation, cluster_json,"
                " backend, status, objective, bound, gap, wall_s, fallback, fallback_reason, "
                "placed, pending) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, now_s, at, snapshot.generation, json.dumps(cl, sort_keys=True), r.backend,
                 r.status, _finite_or_none(r.objective), _finite_or_none(r.bound),
                 _finite_or_none(r.gap), r.wall_s, int(r.fallback), r.fallback_reason,
                 len(decision.allocations), len(decision.pending)))
            rid = int(cur.lastrowid or 0)
            c.execute("INSERT INTO decisions(round_id, decision_json) VALUES (?, ?)",
                      (rid, decision_json))
            # the round's id is the one new fact: the rows made before are kept when the
            # store is as they read it (nothing else can write while this transaction holds it)
            unchanged = self.generation() == seen
            writes, res = early if unchanged else self._round_writes(snapshot, key, at, by_job,
                                                                     rid)
            writes.flush(c, rid)
            res.round_id = rid
        return res

    def _round_writes(self, snapshot: RoundInput, key: str, at: float, by_job: dict[str, Any],
                      rid: int) -> tuple[_RoundWrites, CommitResult]:
        """The rows a round's commit writes (:class:`_RoundWrites`, its round id filled in
        when flushed) and which jobs it applies to: those the round read at the version the
        store holds (the others changed while it solved: a cancellation, say), from the
        jobs as the store holds them now."""
        res = CommitResult(rid, created=True)
        found = self._job_states(sorted(by_job))
        writes = _RoundWrites(at)
        for job_id, item in sorted(by_job.items()):
            row = found.get(job_id)
            if row is None:
                log.error("round %s: decision names unknown job %s; ignored", key, job_id)
                continue
            state, version, done = row
            fresh = snapshot.versions.get(job_id) == version and state in ACTIVE
            action, gtype, gpus, place, why = _describe(item)
            if fresh:
                writes.apply(job_id, state, done, item, action, why)
                res.applied.append(job_id)
            else:
                res.skipped.append(job_id)
            writes.actions.append([None, job_id, action, gtype, gpus,
                                   None if place is None else json.dumps(place, sort_keys=True),
                                   why, int(fresh)])
        return writes, res

    def _job_states(self, ids: list[str]) -> dict[str, tuple[JobState, int, int]]:
        """Job id -> (state, version, iterations done) of the jobs ``ids`` names that the
        store holds: what a round's commit reads of each (a query per 500 ids, not per job);
        a state edited by hand into nonsense is :class:`StoreDamaged` naming the job."""
        out: dict[str, tuple[JobState, int, int]] = {}
        for first in range(0, len(ids), 500):
            chunk = ids[first:first + 500]
            q = (f"SELECT id, state, version, iterations_done FROM jobs WHERE id IN "
                 f"({', '.join('?' * len(chunk))})")
            for job_id, state, version, done in self.conn.execute(q, chunk):
                try:
                    out[job_id] = (JobState(state), int(version), int(done))
                except (ValueError, TypeError) as exc:
                    raise StoreDamaged(str(self.path), f"jobs[{printable(job_id, False)}].state",
                                       f"unreadable value ({exc}): "
                                       + recover_hint(self.path)) from None
        return out

    def rounds(self, limit: int | None = None, before: int | None = None
               ) -> list[dict[str, Any]]:
        """The last ``limit`` rounds (all without one), oldest first; with ``before``, the
        last of those numbered below it. A limit past SQLite's 64-bit integers means all of
        them: it once overflowed into a datatype mismatch that read as a damaged store."""
        if limit is not None and limit < 1:
            raise InputError("--limit", "limit", f"must be at least 1, got {limit}")
        q = "SELECT id FROM rounds" + (" WHERE id < ?" if before is not None else "") + \
            " ORDER BY id DESC" + (f" LIMIT {min(int(limit), 2**62)}" if limit else "")
        args = (min(int(before), 2**62),) if before is not None else ()
        return [self.round(r[0]) for r in reversed(self.conn.execute(q, args).fetchall())]

    def round(self, round_id: int) -> dict[str, Any]:
        cols = ("id", "round_key", "now_s", "committed_at", "base_generation", "cluster_json",
                "backend", "status", "objective", "bound", "gap", "wall_s", "fallback",
                "fallback_reason", "placed", "pending")
        row = self.conn.execute(f"SELECT {', '.join(cols)} FROM rounds WHERE id = ?",
                                (round_id,)).fetchone()
        if row is None:
            raise KeyError(f"no round {round_id}")
        out = dict(zip(cols, row))
        out["cluster"] = self._json(out.pop("cluster_json"), f"rounds[{round_id}].cluster_json")
        out["fallback"] = bool(out["fallback"])
        return out

    def _json(self, text: Any, where: str) -> Any:
        try:
            return json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StoreDamaged(str(self.path), where, f"unreadable value ({exc}): "
                               + recover_hint(self.path)) from None

    def decision(self, round_id: int) -> dict[str, Any]:
        row = self.conn.execute("SELECT decision_json FROM decisions WHERE round_id = ?",
                                (round_id,)).fetchone()
        if row is None:
            raise KeyError(f"no decision for round {round_id}")
        return self._json(row[0], f"decisions[{round_id}].decision_json")

    def actions(self, round_id: int) -> list[dict[str, Any]]:
        keys = ("job", "action", "gpu_type", "gpus", "placement", "reason", "applied")
        rows = self.conn.execute("SELECT job, action, gpu_type, gpus, placement_json, reason, "
                                 "applied FROM actions WHERE round_id = ? ORDER BY job",
                                 (round_id,)).fetchall()
        return [dict(zip(keys, (*r[:4], self._json(r[4], f"actions[{round_id}].placement_json")
                                if r[4] else None, r[5], bool(r[6]))))
                for r in rows]

    # -- measurements -----------------------------------------------------------------
    def record_progress(self, job_id: str, iterations_done: int, at_s: float,
                        checkpoint: bool = False, source: str = "",
                        checkpoint_iterations: int | None = None) -> JobRecord:
        """Measured progress of a running job; reaching its iterations finishes it.

        ``checkpoint``: a checkpoint holds ``iterations_done``; or
        ``checkpoint_iterations``: the last checkpoint's iteration (at most
        ``iterations_done``), which a fault rolls the job back to."""
        with self.transaction() as c:
            rec = self.job(job_id)
            if rec.state is not JobState.RUNNING:
                raise IllegalTransition(job_id, rec.state.value, "progress (only running jobs "
                                        "report progress)")
            if iterations_done < rec.iterations_done:
                raise ValueError(f"job {job_id!r}: progress went backwards "
                                 f"({iterations_done} < {rec.iterations_done})")
            c.execute("INSERT INTO progress(job, at_s, iterations_done, checkpoint, source) "
                      "VALUES (?, ?, ?, ?, ?)", (job_id, at_s, iterations_done, int(checkpoint),
                                                source))
            ckpt = iterations_done if checkpoint else rec.checkpoint_iterations
            if checkpoint_iterations is not None:
                ckpt = max(rec.checkpoint_iterations, min(checkpoint_iterations, iterations_done))
            if iterations_done >= rec.iterations:
                self._move(rec, JobState.FINISHED, "reached its iterations", at_s,
                           iterations_done=iterations_done, checkpoint_iterations=iterations_done)
            else:
                c.execute("UPDATE jobs SET iterations_done = ?, checkpoint_iterations = ?, "
                          "version = version + 1, updated_at = ? WHERE id = ?",
                          (iterations_done, ckpt, at_s, job_id))
        return self.job(job_id)

    def record_gradient_stats(self, job_id: str, grad_sqr: float, grad_var: float,
                              at_s: float, batch: int | None = None) -> None:
        """The gradient statistics a running job reported (the squared norm of its gradient
        and the variance of one sample's): they replace the last ones (the worker smooths
        them). A value that is not finite and non-negative is refused."""
        for name, v in (("grad_sqr", grad_sqr), ("grad_var", grad_var)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(job_id, name, f"must be finite and non-negative, got {v!r}")
        with self.transaction() as c:
            self.job(job_id)  # an unknown job is refused by name
            c.execute("INSERT INTO gradient_stats(job, at_s, grad_sqr, grad_var, batch) "
                      "VALUES (?, ?, ?, ?, ?) ON CONFLICT(job) DO UPDATE SET at_s = "
                      "excluded.at_s, grad_sqr = excluded.grad_sqr, grad_var = "
                      "excluded.grad_var, batch = excluded.batch, reports = reports + 1",
                      (job_id, at_s, float(grad_sqr), float(grad_var), batch))

    def record_sample(self, job_id: str, gpu_type: str, gpus: int, plan: dict[str, Any],
                      placement: dict[str, int], iter_time_s: float, at_s: float,
                      mem_per_gpu_gib: float | None = None, source: str = "",
                      batch: int | None = None) -> int:
        """One measured configuration for the estimators; a NaN or non-positive time is
        refused. ``batch``: the global batch the step ran at where the round chose one other
        than the job's own (None: the job's own)."""
        if not (isinstance(iter_time_s, (int, float)) and math.isfinite(iter_time_s)
                and iter_time_s > 0):
            raise InputError(source or "sample", "iter_time_s",
                             f"must be a finite positive number, got {iter_time_s!r}")
        if mem_per_gpu_gib is not None and not (math.isfinite(mem_per_gpu_gib)
                                                and mem_per_gpu_gib >= 0):
            raise InputError(source or "sample", "mem_per_gpu_gib",
                             f"must be a finite non-negative number, got {mem_per_gpu_gib!r}")
        if gpus <= 0:
            raise InputError(source or "sample", "gpus", f"must be positive, got {gpus}")
        with self.transaction() as c:
            rec = self.job(job_id)
            cur = c.execute(
                "INSERT INTO estimator_samples(job, model, gpu_type, gpus, plan_json, "
                "placement_json, iter_time_s, mem_per_gpu_gib, at_s, source, batch) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, rec.spec["model"], gpu_type, gpus, json.dumps(plan, sort_keys=True),
                 json.dumps(placement, sort_keys=True), float(iter_time_s), mem_per_gpu_gib,
                 at_s, source, None if batch is None else int(batch)))
            return int(cur.lastrowid or 0)

    def samples(self, job_id: str | None = None) -> list[dict[str, Any]]:
        keys = ("job", "model", "gpu_type", "gpus", "plan", "placement", "iter_time_s",
                "mem_per_gpu_gib", "at_s", "source", "batch")
        q = ("SELECT job, model, gpu_type, gpus, plan_json, placement_json, iter_time_s, "
             "mem_per_gpu_gib, at_s, source, batch FROM estimator_samples")
        rows = (self.conn.execute(q + " WHERE job = ? ORDER BY id", (job_id,)) if job_id
                else self.conn.execute(q + " ORDER BY id")).fetchall()
        return [dict(zip(keys, (*r[:4], json.loads(r[4]), json.loads(r[5]), *r[6:])))
                for r in rows]

    # -- checks ---------------------------------------------------------------------
    def check_invariants(self) -> list[str]:
        """Everything that must hold after any crash; [] when the store is consistent."""
        v: list[str] = []
        ok = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            v.append(f"integrity_check: {ok}")
        events: dict[str, list[dict[str, Any]]] = {}
        for e in self.events():
            events.setdefault(e["job"], []).append(e)
        for rec in self.jobs():
            evs = events.get(rec.id, [])
            if not evs or evs[0]["src"] is not None or evs[0]["dst"] != "submitted":
                v.append(f"job {rec.id}: event log does not start with its submission")
                continue
            state = "submitted"
            for e in evs[1:]:
                if e["src"] != state:
                    v.append(f"job {rec.id}: event {e['seq']} moves from {e['src']}, was {state}")
                state = e["dst"]
            if state != rec.state.value:
                v.append(f"job {rec.id}: events end in {state}, row says {rec.state.value}")
        for rnd in self.conn.execute("SELECT id, placed + pending FROM rounds").fetchall():
            rid, n = rnd
            dec = self.conn.execute("SELECT decision_json FROM decisions WHERE round_id = ?",
                                    (rid,)).fetchone()
            if dec is None:
                v.append(f"round {rid}: no decision stored")
                continue
            d = json.loads(dec[0])
            want = {a["job"] for a in d["allocations"]} | {p["job"] for p in d["pending"]}
            have = {r[0] for r in self.conn.execute("SELECT job FROM actions WHERE round_id = ?",
                                                    (rid,))}
            if len(want) != n or have != want:
                v.append(f"round {rid}: {len(have)} actions for {len(want)} decided jobs")
        return v


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


class _RoundWrites:
    """A round's writes to its jobs, gathered job by job and written together
    (:meth:`flush`): each kind of row by one ``executemany``, not a statement a job (a
    100,000-job round's commit held the store 42 s on a loaded machine that way).

    The moves are :meth:`StateStore._move`'s, in two phases: admissions first (a
    submitted job the round saw becomes queued), then each job's one move of the round
    (start / keep / resize / migrate -> running, preempt -> checkpointed, drop, a catalog
    refusal -> failed) or its pending reason; so every row's transition is legal when the
    schema's trigger checks it, and each job's events keep their order."""

    def __init__(self, at: float) -> None:
        self.at = at
        # each row's round id (the placeholder None, and the "round" of a running job's
        # placement JSON) is filled in by flush: the rows are made before the round's row is
        self.admitted: list[list[Any]] = []
        self.running: list[list[Any]] = []
        self.checkpointed: list[list[Any]] = []
        self.ended: list[list[Any]] = []  # dropped or failed
        self.pending: list[list[Any]] = []
        self.events: list[list[list[Any]]] = [[], []]  # per phase
        self.actions: list[list[Any]] = []

    def _event(self, phase: int, job: str, src: JobState, dst: JobState, why: str) -> None:
        check_transition(job, src, dst)
        self.events[phase].append([job, src.value, dst.value, None, self.at, why])

    def apply(self, job: str, state: JobState, done: int, item: Any, action: str,
              why: str) -> None:
        """What the round does to one fresh job (see the class docstring)."""
        at = self.at
        if state is JobState.SUBMITTED:
            self._event(0, job, state, JobState.QUEUED, "admitted")
            self.admitted.append([at, None, job])
            state = JobState.QUEUED
        if action in (Action.START.value, Action.KEEP.value, Action.RESIZE.value,
                      Action.MIGRATE.value):
            running = {"gpu_type": item.gpu_type, "gpus": item.gpus, "stages": item.stages,
                       "placement": dict(sorted(item.placement.items())), "tp": item.plan.tp,
                       "plan": item.plan.as_dict(), "round": _ROUND_ID}
            self._event(1, job, state, JobState.RUNNING, action)
            self.running.append([at, action, json.dumps(running, sort_keys=True), None, job])
        elif action == Action.PREEMPT.value and state is JobState.RUNNING:
            self._event(1, job, state, JobState.CHECKPOINTED, f"preempted: {why}")
            self.checkpointed.append([at, f"preempted: {why}", done, None, job])
        elif action == Action.DROP.value:
            self._event(1, job, state, JobState.DROPPED, f"dropped by round: {why}")
            self.ended.append([JobState.DROPPED.value, at, f"dropped by round: {why}", None, job])
        elif isinstance(item, Pending) and item.stage == "admit" and item.reason is Reason.CATALOG:
            # admission found a model or GPU type no catalog or rate knows: no round can
            # ever plan it, whichever door committed the round (solve-round --state, run)
            why = f"cannot be planned: {item.detail}"
            self._event(1, job, state, JobState.FAILED, why)
            self.ended.append([JobState.FAILED.value, at, why, None, job])
        else:  # pending: stays queued / checkpointed
            self.pending.append([f"pending: {why}", None, job])

    def flush(self, c: sqlite3.Connection, rid: int) -> None:
        """Write every row, round ``rid``'s (inside the round's transaction)."""
        for rows, col in ((self.admitted, 1), (self.running, 3), (self.checkpointed, 3),
                          (self.ended, 3), (self.pending, 1), (self.events[0], 3),
                          (self.events[1], 3), (self.actions, 0)):
            for row in rows:
                row[col] = rid
        placed = _ROUND_PLACEHOLDER
        for row in self.running:
            row[2] = row[2].replace(placed, f'"round": {rid}')
        head = "UPDATE jobs SET state = ?, version = version + 1, updated_at = ?, reason = ?"
        c.executemany("UPDATE jobs SET state = 'queued', version = version + 1, updated_at = ?, "
                      "reason = 'admitted', running_json = NULL, last_round = ? WHERE id = ?",
                      self.admitted)
        events = "INSERT INTO job_events(job, src, dst, round_id, at, why) VALUES (?, ?, ?, ?, ?, ?)"
        c.executemany(events, self.events[0])
        c.executemany("UPDATE jobs SET state = 'running', version = version + 1, updated_at = ?, "
                      "reason = ?, running_json = ?, last_round = ? WHERE id = ?", self.running)
        c.executemany("UPDATE jobs SET state = 'checkpointed', version = version + 1, "
                      "updated_at = ?, reason = ?, checkpoint_iterations = ?, running_json = "
                      "NULL, last_round = ? WHERE id = ?", self.checkpointed)
        c.executemany(head + ", running_json = NULL, last_round = ? WHERE id = ?", self.ended)
        c.executemany("UPDATE jobs SET reason = ?, last_round = ?, version = version + 1 "
                      "WHERE id = ?", self.pending)
        c.executemany(events, self.events[1])
        c.executemany("INSERT INTO actions(round_id, job, action, gpu_type, gpus, "
                      "placement_json, reason, applied) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      self.actions)


#: a running job's placement JSON names its round; the round's id is known only inside the
#: commit's transaction, so the JSON is made with this marker and the id put in at flush
_ROUND_ID = -7_777_777_777
_ROUND_PLACEHOLDER = f'"round": {_ROUND_ID}'


def _describe(item: Any) -> tuple[str, str | None, int | None, dict[str, int] | None, str]:
    """(action, gpu_type, gpus, placement, reason) of an Allocation or a Pending."""
    if hasattr(item, "placement"):
        return item.action.value, item.gpu_type, item.gpus, dict(item.placement), ""
    action = item.action.value if item.action is not None else "pending"
    return action, None, None, None, item.reason.value


__all__ = [
    "SCHEMA_VERSION",
    "CommitResult",
    "JobRecord",
    "RoundInput",
    "RoundLock",
    "StateStore",
    "StoreBusy",
    "StoreDamaged",
    "UnknownJob",
    "open_store",
    "store_error",
]
