"""A scheduler session over the state store: the one setup path of ``run`` and ``serve``.

Holds the store's round lock for the whole session (one scheduler per store), starts the
executor, settles what an earlier run left (:mod:`apportion.runtime.reconcile`), warms
the online refit with what earlier runs measured, and runs the loop
(:func:`apportion.runtime.loop.run_loop`) over the store's
:class:`~apportion.runtime.store_adapter.SqliteRoundStore`; a companion (``serve``'s
HTTP server) runs beside the loop. The options are checked and the round's config built
before anything here opens (``apportion.cli.run_command.prepare_run``, the command
line's, with ``solve-round``'s config builder), so a bad flag writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from apportion.estimation.base import Sample
from apportion.estimation.registry import make_estimator
from apportion.runtime.executors.registry import make_executor
from apportion.runtime.loop import run_loop
from apportion.runtime.reconcile import reconcile
from apportion.runtime.refit import OnlineRefit
from apportion.runtime.round_log import log_round
from apportion.runtime.store_adapter import FaultPolicy, SqliteLaunchLog, SqliteRoundStore

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.plans import ExecutionPlan
from apportion.policies import RoundConfig, estimator_from
from apportion.store import RoundLock, StoreBusy, open_store

log = logging.getLogger(__name__)

EXIT_BUSY = 75

__all__ = ["EXIT_BUSY", "Companion", "LoopContext", "LoopHooks", "PreparedRun", "RunOptions",
           "chosen_estimator", "executor_options", "run_rounds", "store_samples"]


@dataclass(frozen=True)
class RunOptions:
    """Every setting of a scheduler loop: ``apportion run``'s flags, which ``apportion serve``
    shares so the two commands can never drift apart."""

    executor: str
    cluster: str
    state: Path
    interval_s: float
    workdir: Path
    kubeconfig: str | None = None
    time_budget_s: float = 10.0
    k8s_config: Path | None = None
    drain: bool = False
    policy: str | None = None
    estimator: str = "analytic"
    checkpoint_every: int | None = None
    checkpoint_interval_s: float | None = None
    max_retries: int = 3
    grace_period_s: float = 120.0
    orphans: str = "adopt"
    ray_address: str | None = None
    until_idle: bool = False
    timeout_s: float | None = None
    tables: Path | None = None  # measured iteration times for --estimator tables/auto
    tenants: Path | None = None  # tenants' GPU quotas (a policy whose formulation keeps them)
    objective_preset: str | None = None  # apportion's objective by name (ObjectiveOptions)


@dataclass
class PreparedRun:
    """Options checked, the cluster read and the round settings chosen; nothing opened yet,
    so a command can refuse its own flags (exit 2) before the store is locked."""

    options: RunOptions
    cluster: Cluster
    round_config: RoundConfig


@dataclass
class LoopContext:
    """What a companion running beside the loop (``serve``'s HTTP server) may read: the
    loop's own objects. It must not write through ``store`` (the loop's connection); it
    opens its own connections to ``options.state``."""

    options: PreparedRun
    store: Any
    executor: Any
    refit: Any


@dataclass
class LoopHooks:
    """What a companion hands the loop: an observer of every pass, and a stop condition."""

    on_round: Callable[[Any], None] | None = None
    should_stop: Callable[[], bool] | None = None


Companion = Callable[[LoopContext], AbstractContextManager[LoopHooks]]


def run_rounds(prep: PreparedRun, *, create_store: bool = False, lock_command: str = "run",
               companion: Companion | None = None) -> int:
    """Lock the store, start the executor, settle what an earlier run left, and loop.

    The one setup path of ``run`` and ``serve``: ``companion`` (serve's HTTP server) is
    entered once the lock is held and the executor reconciled, and left when the loop has
    stopped, before the executor closes and the lock is released. Returns 0, or 75 when
    another invocation holds the store.
    """
    opts, cluster, cfg = prep.options, prep.cluster, prep.round_config
    store = open_store(opts.state, create=create_store)
    try:  # the user's estimator, as an object the online refit corrects (never replaces)
        cfg.estimator = chosen_estimator(store, opts.estimator, opts.tables)
    except InputError:
        store.close()
        raise
    lock = RoundLock(opts.state, lock_command)
    try:
        lock.acquire()
    except StoreBusy as exc:
        store.close()
        log.error("%s", exc)
        return EXIT_BUSY
    ex = None
    try:
        opts.workdir.mkdir(parents=True, exist_ok=True)
        launch_log = SqliteLaunchLog(store)
        # every executor records its launches in the store, refused ones included: the fault
        # policy counts failures there (--max-retries), and a restarted run reconciles them
        ex = make_executor(opts.executor, opts.workdir, cluster, launch_log=launch_log,
                           options=executor_options(opts))
        reconcile(store, ex, opts.workdir, adopt=opts.orphans == "adopt",
                  owner=launch_log.owner)
        refit = OnlineRefit(cluster, estimator=cfg.estimator)
        refit.warm(store_samples(store))  # what earlier runs measured
        beside = (companion(LoopContext(prep, store, ex, refit)) if companion is not None
                  else contextlib.nullcontext(LoopHooks(on_round=log_round)))
        with beside as hooks:
            res = run_loop(cluster, SqliteRoundStore(store, cluster,
                                                     FaultPolicy(int(opts.max_retries))),
                           ex, interval_s=opts.interval_s, until_idle=opts.until_idle,
                           timeout_s=opts.timeout_s, round_config=cfg, refit=refit,
                           on_round=hooks.on_round, should_stop=hooks.should_stop)
        log.warning("%s stopped (%s) after %d rounds; %d estimator refits from %d samples",
                    lock_command, res.reason, res.rounds, refit.refits, len(refit.samples))
    finally:
        if ex is not None:
            ex.close()
        lock.release()
        store.close()
    return 0


def executor_options(opts: RunOptions) -> dict[str, Any]:
    """The run's options an executor may read (:data:`~apportion.runtime.executors.registry.
    RUN_OPTIONS`), by name; None where not given. Each executor is given those it reads."""
    return {"stop_timeout_s": opts.grace_period_s,
            "checkpoint_every": (None if opts.checkpoint_every is None
                                 else int(opts.checkpoint_every)),
            "checkpoint_interval_s": (None if opts.checkpoint_interval_s is None
                                      else float(opts.checkpoint_interval_s)),
            "ray_address": opts.ray_address or os.environ.get("RAY_ADDRESS") or None,
            "kubeconfig": opts.kubeconfig, "k8s_config": opts.k8s_config, "drain": opts.drain}


def chosen_estimator(store: Any, name: str, tables: Path | None) -> Any:
    """The ``--estimator`` choice as an estimator object: ``tables`` and ``auto`` hold the
    ``--tables`` file's rows and this store's samples from earlier runs."""
    if name not in ("tables", "auto"):
        return make_estimator(name)
    batches = {r.id: int(r.spec["global_batch_size"]) for r in store.jobs()}
    return estimator_from(name, tables, store.samples(), batches)


def store_samples(store: Any) -> list[Any]:
    """The store's measured iteration times as estimator samples (job, plan, placement)."""
    jobs = {}
    for r in store.jobs():
        try:
            jobs[r.id] = r.to_jobspec()
        except (KeyError, TypeError, ValueError):  # a damaged row: the store says so elsewhere
            continue
    out = []
    for s in store.samples():
        job = jobs.get(s["job"])
        if job is None or not s["iter_time_s"] or s["iter_time_s"] <= 0:
            continue
        try:
            plan = ExecutionPlan(**s["plan"])
        except TypeError:
            continue
        if s.get("batch"):  # timed at a batch its round chose, not the job's own
            job = replace(job, global_batch_size=int(s["batch"]))
        out.append(Sample(job, plan, dict(s["placement"]), s["gpu_type"], float(s["iter_time_s"])))
    return out
