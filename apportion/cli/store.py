"""The state-store commands: submit, cancel, status, history and ``solve-round --state``.

``apportion/cli.py`` only wires these to typer; each function here returns the
exit code. Codes: 0 done; 2 bad input (a message naming the file and the
field, and nothing written); 75 (``EX_TEMPFAIL``, "try again later") when
another invocation holds the round lock or the database is busy, so a timer
that fires while the previous round still runs sees a distinct, harmless code.

Order matters for "nothing written": every input (options, the cluster file,
the jobs file, the state file) is read and validated before the store is
opened for writing or the lock file is created.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from apportion import outputs
from apportion.cli.common import max_input_bytes as max_input_bytes_of
from apportion.config import default_cluster
from apportion.console import printable, stderr_console, stdout_console
from apportion.decision import Decision
from apportion.errors import HostError, InputError
from apportion.lifecycle import IllegalTransition
from apportion.memory_guard import check_round_fits
from apportion.round_store import catalog_failures
from apportion.store import (
    RoundLock,
    StateStore,
    StoreBusy,
    UnknownJob,
    open_store,
    store_error,
)
from apportion.store_status import status_data
from apportion.submission import queue_to_submit

log = logging.getLogger(__name__)

EXIT_OK, EXIT_BAD_INPUT, EXIT_BUSY = 0, 2, 75


def _out() -> Console:
    return stdout_console()


def _err() -> Console:
    return stderr_console()


def _bad(exc: Exception) -> int:
    _err().print(f"[bold red]error:[/] {escape(printable(exc))}", highlight=False,
                 soft_wrap=True)
    return EXIT_BAD_INPUT


def _busy(exc: Exception) -> int:
    _err().print(f"[bold yellow]busy:[/] {escape(printable(exc))}", highlight=False,
                 soft_wrap=True)
    return EXIT_BUSY


def _host(exc: HostError) -> int:
    _err().print(f"[bold red]error:[/] {escape(printable(exc))}", highlight=False,
                 soft_wrap=True)
    return exc.exit_code


def report(exc: BaseException, state: Path | str | None = None) -> int:
    """Print one line for an error a user can act on; the exit code (2, or 75)."""
    if isinstance(exc, sqlite3.Error):
        exc = store_error(exc, state if state is not None else "state database")
    if isinstance(exc, StoreBusy):
        return _busy(exc)
    if isinstance(exc, HostError):
        return _host(exc)
    if isinstance(exc, OSError):
        return _host(HostError.from_os_error(exc, str(exc.filename or state or "file")))
    return _bad(exc)


_HANDLED = (InputError, StoreBusy, HostError, sqlite3.Error, OSError)


# ---------------------------------------------------------------------------
# submit / cancel
# ---------------------------------------------------------------------------
def submit(file: Path, state: Path, max_input_bytes: str | None = None) -> int:
    """Add every job of a queue file (YAML or JSON lines) to the store, all or nothing."""
    try:
        now = time.time()
        jobs = queue_to_submit(file, now, max_input_bytes_of(max_input_bytes))
        with open_store(state, create=True) as store:
            ids = store.submit(jobs, source=str(file), at=now)
    except _HANDLED as exc:
        return report(exc, state)
    _out().print(f"submitted {len(ids)} job{'s' if len(ids) != 1 else ''} to {state}: "
                 f"{', '.join(printable(i, False) for i in ids)}", highlight=False, markup=False)
    return EXIT_OK


def cancel(job: str, state: Path) -> int:
    """Drop a job; a running job's GPUs go back to the next round."""
    try:
        with open_store(state) as store:
            try:
                rec = store.cancel(job)
            except UnknownJob:
                raise InputError(str(state), "JOB", f"no job {printable(job, False)!r} in the "
                                 "state store") from None
            except IllegalTransition as exc:
                raise InputError(str(state), "JOB", str(exc)) from None
    except _HANDLED as exc:
        return report(exc, state)
    _out().print(f"job {printable(rec.id, False)}: {rec.state.value}", highlight=False,
                 markup=False)
    return EXIT_OK


# ---------------------------------------------------------------------------
# status / history
# ---------------------------------------------------------------------------
def _when(at: Any) -> str:
    """A stored wall-clock time as local time; one from a clock that jumped is still shown."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(at)))
    except (OverflowError, OSError, ValueError, TypeError):
        return f"{at!r} (not a valid time)"


def status(state: Path, as_json: bool = False) -> int:
    try:
        with open_store(state, readonly=True) as store:
            data = status_data(store)
    except _HANDLED as exc:
        return report(exc, state)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return EXIT_OK
    t = Table(title=f"apportion state {printable(state)}")
    for col in ("job", "state", "model", "GPUs", "placement", "progress", "reason"):
        t.add_column(col, overflow="fold")
    for j in data["jobs"]:
        r = j["running"]
        gpus = (f"{r['gpus']} {r['gpu_type']}" if r else
                f"req {j['requested_gpus']}{' ' + j['requested_gpu_type'] if j['requested_gpu_type'] else ''}")
        place = ", ".join(f"{n}:{k}" for n, k in sorted(r["placement"].items())) if r else "-"
        reason = j["reason"]
        if "pending_reason" in j:
            reason = f"pending: {j['pending_reason']}"
            if j["pending_detail"]:
                reason += f" ({j['pending_detail']})"
        # Text and printable: ids and reasons are neither markup nor terminal controls
        t.add_row(Text(printable(j["id"], False)), j["state"], printable(j["model"]), gpus,
                  printable(place), f"{j['iterations_done']}/{j['iterations']}",
                  Text(printable(reason)))
    out = _out()
    out.print(t)
    counts = ", ".join(f"{k} {v}" for k, v in data["counts"].items()) or "no jobs"
    out.print(f"jobs: {counts}", highlight=False, markup=False)
    use = ", ".join(f"{k} {v['used']}/{v['capacity'] if v['capacity'] is not None else '?'}"
                    for k, v in data["cluster_use"].items())
    out.print(f"cluster use (GPUs): {use or 'no round yet'}", highlight=False, markup=False)
    for n in data["nodes"]:
        if n["state"] != "up":
            out.print(printable(f"node {n['name']}: {n['state']} ({n['reason']})"),
                      highlight=False, markup=False)
    return EXIT_OK


def history(state: Path, as_json: bool = False, limit: int | None = None) -> int:
    """Rounds with their solver reports, oldest first."""
    try:
        with open_store(state, readonly=True) as store:
            rounds = store.rounds(limit)
            for r in rounds:
                r["solver"] = store.decision(r["id"])["solver"]
                r["actions"] = store.actions(r["id"])
    except _HANDLED as exc:
        return report(exc, state)
    if as_json:
        sys.stdout.write(json.dumps({"rounds": rounds}, indent=2, default=str) + "\n")
        return EXIT_OK
    t = Table(title=f"apportion rounds in {printable(state)}")
    for col in ("round", "key", "committed", "backend", "status", "objective", "gap", "wall s",
                "placed", "pending", "changes"):
        t.add_column(col, overflow="fold")
    for r in rounds:
        changes = Counter(a["action"] for a in r["actions"]
                          if a["action"] not in ("keep", "pending"))
        t.add_row(str(r["id"]), Text(printable(r["round_key"], False)), _when(r["committed_at"]),
                  printable(r["backend"]), r["status"] + (" (fallback)" if r["fallback"] else ""),
                  "n/a" if r["objective"] is None else f"{r['objective']:.4f}",
                  "n/a" if r["gap"] is None else f"{r['gap']:.2%}", f"{r['wall_s']:.3f}",
                  str(r["placed"]), str(r["pending"]),
                  ", ".join(f"{k} {v}" for k, v in sorted(changes.items())) or "-")
    _out().print(t)
    for r in rounds:
        if r["fallback_reason"]:
            _out().print(printable(f"round {r['id']} fallback: {r['fallback_reason']}"),
                         highlight=False, markup=False)
    return EXIT_OK


# ---------------------------------------------------------------------------
# solve-round --state
# ---------------------------------------------------------------------------
def solve_round_state(state: Path, cluster: Path | None, jobs: Path | None, flags: Any,
                      started: float, *, json_out: Path | None = None,
                      dump_problem: Path | None = None, round_key: str | None = None,
                      show: Callable[[Decision], None] | None = None) -> int:
    """Read the queue and running jobs from the store, solve, commit the round, report.

    ``flags`` (:class:`apportion.cli.round_config.RoundFlags`) become the round's config
    exactly as without ``--state``; the budget counts from ``started`` (the command's
    start). ``show`` prints the decision (the CLI passes its table and report printer).
    Every output is checked before the store is opened and opened before the round lock is
    taken (:class:`apportion.outputs.PreparedOutputs`), so a bad one commits nothing; the
    decision is shown and written only after the lock is released, so a slow reader
    never holds other rounds up, and a write that fails after the commit says the round
    is committed rather than asking for a rerun that would commit another.
    """
    from apportion.cli.round_config import round_config
    from apportion.config import resolve_cluster
    from apportion.policies import estimator_from

    try:
        cfg = round_config(flags, started)
        if jobs is not None:
            raise InputError(str(jobs), "--jobs", "--jobs and --state exclude each other: with "
                             "--state the queue comes from the store (add jobs with "
                             "`apportion submit FILE --state DB`)")
        if round_key is not None and not round_key.strip():
            raise InputError("--round-key", "round_key", "must not be empty")
        outputs.check_outputs((json_out, "--json"), (dump_problem, "--dump-problem"),
                              inputs=((cluster, "--cluster"), (flags.tables, "--tables"),
                                      (flags.tenants, "--tenants")))
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        store = open_store(state)
    except _HANDLED as exc:
        return report(exc, state)
    try:
        prepared = outputs.PreparedOutputs((json_out, "--json"), (dump_problem, "--dump-problem"))
    except _HANDLED as exc:
        store.close()
        return report(exc, state)
    with prepared:
        lock = RoundLock(state, "solve-round")
        try:
            lock.acquire()
        except StoreBusy as exc:
            store.close()
            return _busy(exc)
        except (OSError, InputError) as exc:
            store.close()
            return report(exc, state)
        try:
            if flags.estimator in ("tables", "auto"):  # measured times: the file's and the store's
                batches = {r.id: int(r.spec["global_batch_size"]) for r in store.jobs()}
                try:
                    cfg.estimator = estimator_from(flags.estimator, flags.tables,
                                                   store.samples(), batches)
                except InputError as exc:
                    return _bad(exc)
            done = _locked_round(store, cl, cfg, round_key, json_out, dump_problem)
        except _HANDLED as exc:
            return report(exc, state)
        finally:
            lock.release()
            store.close()
        try:
            return _after_round(done, prepared, show)
        except _HANDLED as exc:
            return report(exc, state)


@dataclasses.dataclass
class _RoundDone:
    """What a locked round leaves to do once the lock is released."""

    decision: Decision | None  # a new round's decision, to show
    writes: list[tuple[str, Any]]  # (output option, JSON data)
    committed: int | None  # the round this invocation committed (None: nothing new)
    db: Path


def _locked_round(store: StateStore, cl: Any, cfg: Any, round_key: str | None,
                  json_out: Path | None, dump_problem: Path | None) -> _RoundDone:
    """One round on the store, through a one-shot :class:`~apportion.policies.Scheduler`
    over the store's :class:`~apportion.runtime.store_adapter.SqliteRoundStore`: the
    same reads, fault handling and commit as ``run``'s rounds."""
    from apportion.policies import Scheduler
    from apportion.runtime.store_adapter import SqliteRoundStore

    err = _err()
    rs = SqliteRoundStore(store, cl, round_key=round_key)
    jobs = rs.list_jobs(0.0)
    key = rs.round_key = round_key or rs.snapshot.default_key
    done = store.round_by_key(key)
    if done is not None:  # an idempotent rerun: write nothing to the store
        err.print(printable(f"round key {key!r} was already committed as round {done['id']}; "
                            "nothing changed"), highlight=False, markup=False)
        return _RoundDone(None, [("--json", store.decision(done["id"]))] if json_out else [],
                          None, store.path)
    now = rs.now(0.0)
    # a queue the machine cannot hold a round of is refused (exit 2) before it is solved
    check_round_fits(len(jobs), rs.cluster_now(cl, now).total_gpus, str(store.path), "jobs")
    with Scheduler(cfg, rs) as scheduler:
        result = scheduler.step(cl, now, jobs=jobs)
    commit = rs.last_commit
    assert commit is not None, "the round's commit hook ran"
    for p in catalog_failures(result.decision):  # failed by the commit: the user sees it
        err.print(printable(f"job {p.job}: failed: cannot be planned: {p.detail}"),
                  highlight=False, markup=False)
    msg = (f"round {commit.round_id} committed to {store.path} (key {key}): "
           f"{len(commit.applied)} jobs updated")
    if commit.skipped:
        msg += f"; {len(commit.skipped)} changed while solving, left as they are: " \
               f"{', '.join(commit.skipped)}"
    if not commit.created:
        msg = (f"round key {key!r} was committed meanwhile as round {commit.round_id}; "
               "nothing changed")
    err.print(printable(msg), highlight=False, markup=False)
    writes: list[tuple[str, Any]] = []
    if json_out:
        writes.append(("--json", result.decision.as_dict()))
    if dump_problem:
        writes.append(("--dump-problem", result.problem))
    return _RoundDone(result.decision, writes, commit.round_id if commit.created else None,
                      store.path)


def _after_round(done: _RoundDone, prepared: outputs.PreparedOutputs,
                 show: Callable[[Decision], None] | None) -> int:
    """Show and write a round's results (the lock released); a write that fails after a
    commit names the round and where its decision is, and exits 2, not 75: "try again"
    would commit a second round."""
    if done.decision is not None and show is not None:
        show(done.decision)
    try:
        for option, data in done.writes:
            prepared.write_json(option, data)
    except outputs.OutputFailed as exc:
        if done.committed is None:
            raise
        raise HostError(f"cannot write {exc.target}: {exc.reason}; round {done.committed} is "
                        f"committed to {done.db}, so running this again would commit another "
                        f"round: its decision is in `apportion history --state {done.db} "
                        "--json`", 2) from None
    return EXIT_OK
