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

from apportion.admission import catalog_problem
from apportion.config import default_cluster, jobs_from_data, read_yaml
from apportion.decision import Decision
from apportion.errors import InputError
from apportion.lifecycle import IllegalTransition, JobState
from apportion.store import RoundLock, StateStore, StoreBusy, UnknownJob, open_store

log = logging.getLogger(__name__)

EXIT_OK, EXIT_BAD_INPUT, EXIT_BUSY = 0, 2, 75


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def _err() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _bad(exc: Exception) -> int:
    _err().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return EXIT_BAD_INPUT


def _busy(exc: Exception) -> int:
    _err().print(f"[bold yellow]busy:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return EXIT_BUSY


def _check_output(path: Path | None, option: str) -> None:
    if path is None:
        return
    if path.is_dir():
        raise InputError(str(path), option, "is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise InputError(str(path), option, f"directory {parent} does not exist")


# ---------------------------------------------------------------------------
# submit / cancel
# ---------------------------------------------------------------------------
def submit(file: Path, state: Path) -> int:
    """Add every job of a jobs YAML to the store, all or nothing."""
    try:
        data = read_yaml(file)
        jobs, _ = jobs_from_data(data, str(file))
        now = time.time()
        raw = data.get("jobs", []) if isinstance(data, dict) else []
        # a job without an explicit submit time was submitted now (the store's clock)
        jobs = [j if isinstance(r, dict) and "submit_time_s" in r
                else dataclasses.replace(j, submit_time_s=now) for j, r in zip(jobs, raw)]
        with open_store(state, create=True) as store:
            ids = store.submit(jobs, source=str(file), at=now)
    except InputError as exc:
        return _bad(exc)
    except StoreBusy as exc:
        return _busy(exc)
    _out().print(f"submitted {len(ids)} job{'s' if len(ids) != 1 else ''} to {state}: "
                 f"{', '.join(ids)}", highlight=False, markup=False)
    return EXIT_OK


def cancel(job: str, state: Path) -> int:
    """Drop a job; a running job's GPUs go back to the next round."""
    try:
        with open_store(state) as store:
            try:
                rec = store.cancel(job)
            except UnknownJob:
                raise InputError(str(state), "JOB", f"no job {job!r} in the state store") from None
            except IllegalTransition as exc:
                raise InputError(str(state), "JOB", str(exc)) from None
    except InputError as exc:
        return _bad(exc)
    except StoreBusy as exc:
        return _busy(exc)
    _out().print(f"job {rec.id}: {rec.state.value}", highlight=False, markup=False)
    return EXIT_OK


# ---------------------------------------------------------------------------
# status / history
# ---------------------------------------------------------------------------
def status_data(store: StateStore) -> dict[str, Any]:
    """What ``status --json`` prints: every job with ``id`` and ``state``, and cluster use."""
    from apportion.store_faults import node_states

    jobs = store.jobs()
    rounds = store.rounds(limit=1)
    last = rounds[-1] if rounds else None
    used: Counter[str] = Counter()
    for j in jobs:
        if j.state is JobState.RUNNING and j.running:
            used[j.running["gpu_type"]] += int(j.running["gpus"])
    cap = last["cluster"]["capacity"] if last else {}
    return {
        "state_db": str(store.path),
        "schema_version": store.schema_version(),
        "generation": store.generation(),
        "jobs": [j.as_dict() for j in jobs],
        "counts": dict(sorted(Counter(j.state.value for j in jobs).items())),
        "cluster_use": {t: {"used": used.get(t, 0), "capacity": cap.get(t)}
                        for t in sorted(set(cap) | set(used))},
        "nodes": node_states(store),
        "last_round": last,
    }


def status(state: Path, as_json: bool = False) -> int:
    try:
        with open_store(state) as store:
            data = status_data(store)
    except InputError as exc:
        return _bad(exc)
    except StoreBusy as exc:
        return _busy(exc)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return EXIT_OK
    t = Table(title=f"apportion state {state}")
    for col in ("job", "state", "model", "GPUs", "placement", "progress", "reason"):
        t.add_column(col, overflow="fold")
    for j in data["jobs"]:
        r = j["running"]
        gpus = (f"{r['gpus']} {r['gpu_type']}" if r else
                f"req {j['requested_gpus']}{' ' + j['requested_gpu_type'] if j['requested_gpu_type'] else ''}")
        place = ", ".join(f"{n}:{k}" for n, k in sorted(r["placement"].items())) if r else "-"
        t.add_row(Text(j["id"]), j["state"], str(j["model"]), gpus, place,  # Text: not markup
                  f"{j['iterations_done']}/{j['iterations']}", Text(j["reason"]))
    out = _out()
    out.print(t)
    counts = ", ".join(f"{k} {v}" for k, v in data["counts"].items()) or "no jobs"
    out.print(f"jobs: {counts}", highlight=False, markup=False)
    use = ", ".join(f"{k} {v['used']}/{v['capacity'] if v['capacity'] is not None else '?'}"
                    for k, v in data["cluster_use"].items())
    out.print(f"cluster use (GPUs): {use or 'no round yet'}", highlight=False, markup=False)
    for n in data["nodes"]:
        if n["state"] != "up":
            out.print(f"node {n['name']}: {n['state']} ({n['reason']})", highlight=False,
                      markup=False)
    return EXIT_OK


def history(state: Path, as_json: bool = False, limit: int | None = None) -> int:
    """Rounds with their solver reports, oldest first."""
    try:
        with open_store(state) as store:
            rounds = store.rounds(limit)
            for r in rounds:
                r["solver"] = store.decision(r["id"])["solver"]
                r["actions"] = store.actions(r["id"])
    except InputError as exc:
        return _bad(exc)
    except StoreBusy as exc:
        return _busy(exc)
    if as_json:
        sys.stdout.write(json.dumps({"rounds": rounds}, indent=2, default=str) + "\n")
        return EXIT_OK
    t = Table(title=f"apportion rounds in {state}")
    for col in ("round", "key", "committed", "backend", "status", "objective", "gap", "wall s",
                "placed", "pending", "changes"):
        t.add_column(col, overflow="fold")
    for r in rounds:
        changes = Counter(a["action"] for a in r["actions"]
                          if a["action"] not in ("keep", "pending"))
        t.add_row(str(r["id"]), Text(r["round_key"]),
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["committed_at"])),
                  r["backend"], r["status"] + (" (fallback)" if r["fallback"] else ""),
                  "n/a" if r["objective"] is None else f"{r['objective']:.4f}",
                  "n/a" if r["gap"] is None else f"{r['gap']:.2%}", f"{r['wall_s']:.3f}",
                  str(r["placed"]), str(r["pending"]),
                  ", ".join(f"{k} {v}" for k, v in sorted(changes.items())) or "-")
    _out().print(t)
    for r in rounds:
        if r["fallback_reason"]:
            _out().print(f"round {r['id']} fallback: {r['fallback_reason']}", highlight=False,
                         markup=False)
    return EXIT_OK


# ---------------------------------------------------------------------------
# solve-round --state
# ---------------------------------------------------------------------------
def solve_round_state(state: Path, cluster: Path | None, jobs: Path | None, *,
                      backend: str = "auto", time_budget: float = 10.0, search_depth: int = 3,
                      max_changes: int | None = None, formulation: str = "cells",
                      json_out: Path | None = None, dump_problem: Path | None = None,
                      round_key: str | None = None, tenants: Path | None = None,
                      isolate: bool = False,
                      show: Callable[[Decision], None] | None = None,
                      write_json: Callable[[Path, Any], None] | None = None,
                      policy: str | None = None, estimator: str = "analytic",
                      tables: Path | None = None) -> int:
    """Read the queue and running jobs from the store, solve, commit the round, report.

    ``show`` prints the decision (the CLI passes its table and report printer);
    ``write_json`` writes an output file atomically (the CLI passes its writer).
    """
    from apportion.config import load_tenants, resolve_cluster
    from apportion.round import checked_config, run_round
    from apportion.store_faults import effective_cluster

    try:
        cfg = checked_config(backend, formulation, policy, estimator, time_budget_s=time_budget,
                             search_depth=search_depth, max_changes=max_changes, isolate=isolate)
        if jobs is not None:
            raise InputError(str(jobs), "--jobs", "--jobs and --state exclude each other: with "
                             "--state the queue comes from the store (add jobs with "
                             "`apportion submit FILE --state DB`)")
        if round_key is not None and not round_key.strip():
            raise InputError("--round-key", "round_key", "must not be empty")
        _check_output(json_out, "--json")
        _check_output(dump_problem, "--dump-problem")
        cfg.quotas = load_tenants(tenants) if tenants else None
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        store = open_store(state)
    except InputError as exc:
        return _bad(exc)
    except StoreBusy as exc:
        return _busy(exc)
    lock = RoundLock(state, "solve-round")
    try:
        lock.acquire()
    except StoreBusy as exc:
        store.close()
        return _busy(exc)
    try:
        if estimator in ("tables", "auto"):  # measured times: the file's and this store's
            from apportion.round import estimator_from

            batches = {r.id: int(r.spec["global_batch_size"]) for r in store.jobs()}
            try:
                cfg.estimator = estimator_from(estimator, tables, store.samples(), batches)
            except InputError as exc:
                return _bad(exc)
        return _locked_round(store, cl, cfg,
                             round_key, json_out, dump_problem, show, write_json, run_round,
                             effective_cluster)
    except StoreBusy as exc:
        return _busy(exc)
    finally:
        lock.release()
        store.close()


def _locked_round(store: StateStore, cl: Any, cfg: Any, round_key: str | None,
                  json_out: Path | None, dump_problem: Path | None,
                  show: Callable[[Decision], None] | None,
                  write_json: Callable[[Path, Any], None] | None,
                  run_round: Callable[..., Any], effective_cluster: Callable[..., Any]) -> int:
    err = _err()
    snap = store.round_input()
    key = round_key or snap.default_key
    done = store.round_by_key(key)
    if done is not None:  # an idempotent rerun: write nothing to the store
        err.print(f"round key {key!r} was already committed as round {done['id']}; "
                  "nothing changed", highlight=False, markup=False)
        if json_out and write_json:
            write_json(json_out, store.decision(done["id"]))
        return EXIT_OK
    failed = False
    for rec in store.jobs(frozenset({JobState.SUBMITTED, JobState.QUEUED,
                                     JobState.CHECKPOINTED})):
        problem = catalog_problem(rec.to_jobspec())
        if problem:
            store.fail(rec.id, f"cannot be planned: {problem}")
            err.print(f"job {rec.id}: failed: {problem}", highlight=False, markup=False)
            failed = True
    if failed:
        snap = store.round_input()
    now = time.time()
    eff = effective_cluster(store, cl, now)
    committed: list[Any] = []
    result = run_round(eff, snap.jobs, now, cfg, commit=lambda d: committed.append(
        store.commit_round(d, snap, eff, now, key)))
    commit = committed[0]
    if show is not None:
        show(result.decision)
    msg = (f"round {commit.round_id} committed to {store.path} (key {key}): "
           f"{len(commit.applied)} jobs updated")
    if commit.skipped:
        msg += f"; {len(commit.skipped)} changed while solving, left as they are: " \
               f"{', '.join(commit.skipped)}"
    if not commit.created:
        msg = f"round key {key!r} was committed meanwhile as round {commit.round_id}; nothing changed"
    err.print(msg, highlight=False, markup=False)
    if write_json is not None:
        if json_out:
            write_json(json_out, result.decision.as_dict())
        if dump_problem:
            write_json(dump_problem, result.problem)
    return EXIT_OK
