"""The state store's schema, its version and its migrations.

The database records its schema version in ``schema_version`` (one row per
migration applied, so the history of upgrades is visible). Opening a store
applies the migrations it lacks, each in its own transaction; a database
written by a newer apportion is refused rather than guessed at. Migration 1 is
the core (jobs, their event log, rounds, decisions, actions); migration 2 adds
measured progress, estimator samples and node health. Keeping them separate
is not cosmetic: it is how a version-1 database written by an earlier release
is upgraded in place, and the tests exercise exactly that path. Migration 3
adds the launch records of ``apportion run`` (every worker group it started,
with a per-store monotonic launch id; see :mod:`apportion.store_launches`). Migration 4
keeps the gradient statistics each job last reported (``gradient_stats``).

Two triggers make the invariants hold at the database level, whoever writes:
a job's state may only change along :data:`apportion.lifecycle.TRANSITIONS`,
and a job row can never be deleted.
"""

from __future__ import annotations

import sqlite3
import time

from apportion.lifecycle import JobState, transition_pairs

SCHEMA_VERSION = 4
APP_ID = 0x41505054  # "APPT": PRAGMA application_id marks the file as an apportion store

_STATES = ", ".join(f"'{s.value}'" for s in JobState)


def _migration_1() -> list[str]:
    pairs = ", ".join(f"('{s}', '{d}')" for s, d in transition_pairs())
    return [
        """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
        """INSERT INTO meta(key, value) VALUES ('generation', '0')""",
        f"""CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL UNIQUE,              -- submission order
            spec_json TEXT NOT NULL,                  -- the validated job entry
            state TEXT NOT NULL CHECK (state IN ({_STATES})),
            version INTEGER NOT NULL DEFAULT 0,       -- bumped at every write: rounds skip stale jobs
            iterations INTEGER NOT NULL CHECK (iterations > 0),
            iterations_done INTEGER NOT NULL DEFAULT 0 CHECK (iterations_done >= 0),
            checkpoint_iterations INTEGER NOT NULL DEFAULT 0 CHECK (checkpoint_iterations >= 0),
            running_json TEXT,                        -- placement while running, else NULL
            reason TEXT NOT NULL DEFAULT '',          -- why it is in this state
            submitted_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            last_round INTEGER,
            CHECK ((state = 'running') = (running_json IS NOT NULL))
        )""",
        """CREATE TABLE job_events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job TEXT NOT NULL REFERENCES jobs(id),
            src TEXT,                                 -- NULL for the submission itself
            dst TEXT NOT NULL,
            round_id INTEGER,
            at REAL NOT NULL,
            why TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE INDEX job_events_job ON job_events(job, seq)""",
        """CREATE TABLE lifecycle_transitions (src TEXT NOT NULL, dst TEXT NOT NULL,
                                              PRIMARY KEY (src, dst))""",
        f"""INSERT INTO lifecycle_transitions(src, dst) VALUES {pairs}""",
        """CREATE TRIGGER jobs_legal_transition BEFORE UPDATE OF state ON jobs
           WHEN OLD.state != NEW.state AND NOT EXISTS (
               SELECT 1 FROM lifecycle_transitions WHERE src = OLD.state AND dst = NEW.state)
           BEGIN SELECT RAISE(ABORT, 'illegal job state transition'); END""",
        """CREATE TRIGGER jobs_never_deleted BEFORE DELETE ON jobs
           BEGIN SELECT RAISE(ABORT, 'jobs are never deleted'); END""",
        """CREATE TABLE rounds (
            id INTEGER PRIMARY KEY,
            round_key TEXT NOT NULL UNIQUE,           -- a rerun with the same key is a no-op
            now_s REAL NOT NULL,
            committed_at REAL NOT NULL,
            base_generation INTEGER NOT NULL,
            cluster_json TEXT NOT NULL,               -- name and capacity the round saw
            backend TEXT NOT NULL,
            status TEXT NOT NULL,
            objective REAL,
            bound REAL,
            gap REAL,
            wall_s REAL NOT NULL,
            fallback INTEGER NOT NULL,
            fallback_reason TEXT NOT NULL DEFAULT '',
            placed INTEGER NOT NULL,
            pending INTEGER NOT NULL
        )""",
        """CREATE TABLE decisions (
            round_id INTEGER PRIMARY KEY REFERENCES rounds(id),
            decision_json TEXT NOT NULL               -- Decision.as_dict(): the JSON contract
        )""",
        """CREATE TABLE actions (
            round_id INTEGER NOT NULL REFERENCES rounds(id),
            job TEXT NOT NULL REFERENCES jobs(id),
            action TEXT NOT NULL,                     -- start keep resize migrate preempt drop pending
            gpu_type TEXT,
            gpus INTEGER,
            placement_json TEXT,
            reason TEXT NOT NULL DEFAULT '',
            applied INTEGER NOT NULL,                 -- 0: the job changed while the round solved
            PRIMARY KEY (round_id, job)
        )""",
    ]


def _migration_2() -> list[str]:
    return [
        """CREATE TABLE progress (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job TEXT NOT NULL REFERENCES jobs(id),
            at_s REAL NOT NULL,
            iterations_done INTEGER NOT NULL,
            checkpoint INTEGER NOT NULL,
            source TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE TABLE estimator_samples (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job TEXT NOT NULL REFERENCES jobs(id),
            model TEXT NOT NULL,
            gpu_type TEXT NOT NULL,
            gpus INTEGER NOT NULL CHECK (gpus > 0),
            plan_json TEXT NOT NULL,
            placement_json TEXT NOT NULL,
            iter_time_s REAL NOT NULL CHECK (iter_time_s > 0),
            mem_per_gpu_gib REAL,
            at_s REAL NOT NULL,
            source TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE TABLE nodes (
            name TEXT PRIMARY KEY,
            state TEXT NOT NULL CHECK (state IN ('up', 'down', 'quarantined')),
            since_s REAL NOT NULL,
            until_s REAL,                             -- end of a quarantine
            reason TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE TABLE node_faults (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            node TEXT NOT NULL,
            at_s REAL NOT NULL,
            kind TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE INDEX node_faults_node ON node_faults(node, at_s)""",
    ]


LAUNCH_STATES = ("intended", "running", "stopping", "ended")
LAUNCH_TRANSITIONS = (("intended", "running"), ("intended", "stopping"), ("intended", "ended"),
                      ("running", "stopping"), ("running", "ended"), ("stopping", "ended"))


def _migration_3() -> list[str]:
    states = ", ".join(f"'{s}'" for s in LAUNCH_STATES)
    pairs = ", ".join(f"('{s}', '{d}')" for s, d in LAUNCH_TRANSITIONS)
    return [
        f"""CREATE TABLE launches (
            id INTEGER PRIMARY KEY AUTOINCREMENT,     -- the launch id: monotonic, never reused
            job TEXT NOT NULL REFERENCES jobs(id),
            executor TEXT NOT NULL,
            action TEXT NOT NULL,                     -- start resize migrate restart ...
            state TEXT NOT NULL CHECK (state IN ({states})),
            plan_json TEXT NOT NULL DEFAULT '{{}}',
            placement_json TEXT NOT NULL DEFAULT '{{}}',
            jobdir TEXT NOT NULL,
            workers_json TEXT NOT NULL DEFAULT '[]',  -- [{{rank, pid, start_ticks, host, ...}}]
            owner TEXT NOT NULL DEFAULT '',           -- the `run` holding it (pid, host, start)
            checkpoint_start INTEGER NOT NULL DEFAULT 0 CHECK (checkpoint_start >= 0),
            checkpoint_end INTEGER,
            outcome TEXT,                             -- finished checkpointed failed stopped
            detail TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            CHECK ((state = 'ended') = (outcome IS NOT NULL))
        )""",
        """CREATE INDEX launches_job ON launches(job, id)""",
        """CREATE INDEX launches_open ON launches(state) WHERE state != 'ended'""",
        """CREATE TABLE launch_events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            launch INTEGER NOT NULL REFERENCES launches(id),
            src TEXT,
            dst TEXT NOT NULL,
            at REAL NOT NULL,
            why TEXT NOT NULL DEFAULT ''
        )""",
        """CREATE TABLE launch_transitions (src TEXT NOT NULL, dst TEXT NOT NULL,
                                           PRIMARY KEY (src, dst))""",
        f"""INSERT INTO launch_transitions(src, dst) VALUES {pairs}""",
        """CREATE TRIGGER launches_legal_transition BEFORE UPDATE OF state ON launches
           WHEN OLD.state != NEW.state AND NOT EXISTS (
               SELECT 1 FROM launch_transitions WHERE src = OLD.state AND dst = NEW.state)
           BEGIN SELECT RAISE(ABORT, 'illegal launch state transition'); END""",
        """CREATE TRIGGER launches_never_deleted BEFORE DELETE ON launches
           BEGIN SELECT RAISE(ABORT, 'launch records are never deleted'); END""",
    ]


def _migration_4() -> list[str]:
    """The gradient statistics each job last reported (Pollux's goodput: its statistical
    efficiency at any batch), one row a job, and the batch it ran when it reported them;
    and the global batch each estimator sample was measured at (NULL: the job's own), so a
    step timed at a batch the round chose is never taken for one at the job's own."""
    return [
        "ALTER TABLE estimator_samples ADD COLUMN batch INTEGER CHECK (batch IS NULL OR "
        "batch > 0)",
        """CREATE TABLE gradient_stats (
            job TEXT PRIMARY KEY REFERENCES jobs(id),
            at_s REAL NOT NULL,
            grad_sqr REAL NOT NULL CHECK (grad_sqr >= 0),
            grad_var REAL NOT NULL CHECK (grad_var >= 0),
            batch INTEGER,                            -- the global batch it ran, where known
            reports INTEGER NOT NULL DEFAULT 1        -- how many reports it has made
        )""",
    ]


MIGRATIONS: dict[int, list[str]] = {1: _migration_1(), 2: _migration_2(), 3: _migration_3(),
                                    4: _migration_4()}


class SchemaError(RuntimeError):
    """The file is not an apportion store, or one written by a newer release."""


def current_version(conn: sqlite3.Connection) -> int:
    has = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
                       ).fetchone()
    if not has:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        if tables:
            raise SchemaError(f"a SQLite database with tables {sorted(tables)[:5]} but no "
                              "apportion schema; not an apportion state store")
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply the missing migrations up to ``target``; returns the version reached."""
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise SchemaError(f"schema version {version} is newer than this apportion "
                          f"understands ({SCHEMA_VERSION}); upgrade apportion")
    while version < target:
        nxt = version + 1
        conn.execute("BEGIN IMMEDIATE")
        try:
            if current_version(conn) != version:  # another process migrated meanwhile
                conn.execute("ROLLBACK")
                version = current_version(conn)
                continue
            if nxt == 1:
                conn.execute(f"PRAGMA application_id = {APP_ID}")
                conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                             "applied_at REAL NOT NULL)")
            for stmt in MIGRATIONS[nxt]:
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_version(version, applied_at) VALUES (?, ?)",
                         (nxt, time.time()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        version = nxt
    return version
