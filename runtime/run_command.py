"""``apportion run``: rounds every interval against the state store, applied by an executor.

Holds the store's round lock for the whole run (one scheduler per store), reads
the queue from it, solves (offering each job only the plans its workload kind
runs), records the round, applies it through the executor, polls progress
back into the store, and stops on ``--until-idle`` (every job finished or
failed), ``--timeout`` or SIGINT/SIGTERM (every running job checkpointed
first).

A run killed with SIGKILL leaves its workers running. Before its first round
a run reconciles what the store's launch records say an earlier run left:
the local executor adopts groups that still run (or stops them with
``--orphans stop``; SIGTERM, then SIGKILL after ``--grace-period``), every
other open launch is closed, and every job the store thinks is running but
nothing runs goes back to the queue from its last checkpoint on disk.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.estimation.base import Sample
from apportion.estimation.registry import make_estimator
from apportion.runtime.round_log import log_round

from apportion.cluster import Cluster
from apportion.config import load_tenants, resolve_cluster
from apportion.errors import InputError
from apportion.jobs import job_dirname
from apportion.plans import ExecutionPlan
from apportion.plugins import call_with, plugins
from apportion.policies import (
    RoundConfig,
    check_round_flags,
    estimator_from,
    with_objective_preset,
)

log = logging.getLogger(__name__)

EXECUTORS = ("dry-run", "local", "slurm", "ray", "kubernetes")
EXIT_BUSY = 75
ORPHAN_POLICIES = ("adopt", "stop")


def make_executor(name: str, workdir: Path, cluster: Cluster, kubeconfig: str | None,
                  k8s_config: Path | None = None, drain: bool = False,
                  launch_log: Any = None, options: dict[str, Any] | None = None) -> Any:
    opts = dict(options or {})
    if name == "dry-run":
        from apportion.runtime.executors.launch import DryRunExecutor

        return DryRunExecutor(workdir)
    if name == "local":
        from apportion.runtime.executors.local import LocalExecutor

        return LocalExecutor(workdir, launch_log=launch_log, **opts)
    if name == "slurm":
        from apportion.runtime.executors.slurm import from_environment

        return from_environment(workdir, cluster, launch_log=launch_log)
    if name == "ray":
        from apportion.runtime.executors.ray_executor import RayExecutor

        # how long a placement group may wait for its resources before that launch fails
        # (an autoscaling cluster adding nodes may need longer than the default minute)
        wait = _env_seconds("APPORTION_RAY_PLACEMENT_TIMEOUT_S", 60.0)
        return RayExecutor(workdir, cluster=cluster, address=opts.pop("ray_address", None),
                           launch_log=launch_log, placement_timeout_s=wait, **opts)
    if name == "kubernetes":
        from apportion.runtime.executors.k8s_client import K8sClient
        from apportion.runtime.executors.k8s_config import load_k8s_config
        from apportion.runtime.executors.kubernetes import KubernetesExecutor

        cfg = load_k8s_config(k8s_config)
        client = None
        if kubeconfig is not None:  # "in-cluster": the pod's service account
            client = K8sClient.from_kubeconfig(None if kubeconfig == "in-cluster" else kubeconfig,
                                               cfg.namespace, retry_timeout_s=cfg.retry_timeout_s,
                                               retry_wait_s=cfg.retry_wait_s)
        return KubernetesExecutor(workdir / "manifests", cluster, cfg, client,
                                  drain=drain or cfg.drain, launch_log=launch_log)
    extra = plugins("apportion.executors")
    if name in extra:  # an installed package's executor: a factory of the arguments it takes
        return call_with(extra[name], workdir=workdir, cluster=cluster, launch_log=launch_log,
                         options=opts)
    raise InputError("--executor", "executor", f"{name!r} is not one of "
                     f"{', '.join(executor_names())}")


def executor_names() -> list[str]:
    """Every executor ``--executor`` accepts: the built-in ones and the plug-ins'."""
    return [*EXECUTORS, *(n for n in plugins("apportion.executors") if n not in EXECUTORS)]


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name`` (exit 2 if not)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(name, name, f"must be a positive number of seconds, got {raw!r}")
    return value


def _check(option: str, value: float | None, low: float, integral: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < low or (integral and value != int(value)):
        kind = "a whole number" if integral else "a finite number"
        raise InputError(option, option.lstrip("-").replace("-", "_"),
                         f"must be {kind} >= {low:g}, got {value!r}")


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


def prepare_run(opts: RunOptions) -> PreparedRun:
    """Check every option (an :class:`InputError` naming the flag) and build the cluster
    and round settings; reads files, writes nothing."""
    from apportion.runtime.plan_filter import workload_plan_filter

    from apportion.policies import checked_config

    if opts.executor not in executor_names():
        raise InputError("--executor", "executor", f"{opts.executor!r} is not one of "
                         f"{', '.join(executor_names())}")
    if not opts.interval_s > 0 or not math.isfinite(opts.interval_s):
        raise InputError("--interval", "interval", f"must be positive, got {opts.interval_s}")
    _check("--timeout", opts.timeout_s, 0.0)
    _check("--time-budget", opts.time_budget_s, 0.01)
    _check("--checkpoint-every", opts.checkpoint_every, 0, integral=True)
    _check("--checkpoint-interval", opts.checkpoint_interval_s, 0.0)
    _check("--max-retries", opts.max_retries, 0, integral=True)
    _check("--grace-period", opts.grace_period_s, 0.0)
    if opts.orphans not in ORPHAN_POLICIES:
        raise InputError("--orphans", "orphans", f"{opts.orphans!r} is not one of adopt, stop")
    if opts.ray_address is not None and opts.executor != "ray":
        raise InputError("--ray-address", "ray_address", "only with --executor ray")
    if opts.tenants is not None:  # quotas a policy would ignore are refused by name
        check_round_flags(policy=opts.policy or "apportion", tenants=opts.tenants)
    if opts.tables is not None and opts.estimator not in ("tables", "auto"):
        raise InputError("--tables", "tables", f"measured times are read by --estimator tables "
                         f"or auto, not {opts.estimator}")
    if opts.cluster == "local":
        from apportion.runtime.executors.local import local_cluster

        cluster = local_cluster()
    else:
        cluster = resolve_cluster(opts.cluster)
    # this host's devices, or real GPUs
    device = None if opts.executor in ("local", "dry-run") else "cuda"
    cfg = RoundConfig(time_budget_s=opts.time_budget_s, plan_filter=workload_plan_filter(device))
    chosen = checked_config(policy=opts.policy, estimator=opts.estimator)  # bad names exit 2
    cfg.policy, cfg.estimator = chosen.policy, chosen.estimator
    cfg.quotas = load_tenants(opts.tenants) if opts.tenants is not None else None
    with_objective_preset(cfg, opts.objective_preset, opts.policy)  # solve-round's rule
    if opts.executor == "kubernetes":
        from apportion.runtime.executors.k8s_config import load_k8s_config

        load_k8s_config(opts.k8s_config)  # bad settings exit 2 before the store is locked
    if opts.executor == "ray":
        _env_seconds("APPORTION_RAY_PLACEMENT_TIMEOUT_S", 60.0)  # likewise
    return PreparedRun(opts, cluster, cfg)


def run_command(executor: str, cluster_arg: str, state: Path, interval_s: float, until_idle: bool,
                timeout_s: float | None, workdir: Path, kubeconfig: str | None = None,
                time_budget_s: float = 10.0, k8s_config: Path | None = None,
                drain: bool = False, policy: str | None = None,
                estimator: str = "analytic", *, checkpoint_every: int | None = None,
                checkpoint_interval_s: float | None = None, max_retries: int = 3,
                grace_period_s: float = 120.0, orphans: str = "adopt",
                ray_address: str | None = None, tables: Path | None = None,
                tenants: Path | None = None, objective_preset: str | None = None) -> int:
    """Exit code: 0 stopped cleanly, 2 bad input, 75 another invocation holds the store."""
    opts = RunOptions(executor, cluster_arg, state, interval_s, workdir, kubeconfig,
                      time_budget_s, k8s_config, drain, policy, estimator, checkpoint_every,
                      checkpoint_interval_s, max_retries, grace_period_s, orphans, ray_address,
                      until_idle, timeout_s, tables, tenants, objective_preset)
    return run_rounds(prepare_run(opts))


def run_rounds(prep: PreparedRun, *, create_store: bool = False, lock_command: str = "run",
               companion: Companion | None = None) -> int:
    """Lock the store, start the executor, settle what an earlier run left, and loop.

    The one setup path of ``run`` and ``serve``: ``companion`` (serve's HTTP server) is
    entered once the lock is held and the executor reconciled, and left when the loop has
    stopped, before the executor closes and the lock is released. Returns 0, or 75 when
    another invocation holds the store.
    """
    from apportion.runtime.loop import run_loop
    from apportion.runtime.refit import OnlineRefit
    from apportion.runtime.store_adapter import FaultPolicy, SqliteLaunchLog, SqliteLoopStore

    from apportion.store import RoundLock, StoreBusy, open_store

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
        xopts: dict[str, Any] = {"stop_timeout_s": opts.grace_period_s}
        if opts.checkpoint_every is not None:
            xopts["checkpoint_every"] = int(opts.checkpoint_every)
        if opts.checkpoint_interval_s is not None:
            xopts["checkpoint_interval_s"] = float(opts.checkpoint_interval_s)
        if opts.executor == "ray":
            xopts["ray_address"] = opts.ray_address or os.environ.get("RAY_ADDRESS") or None
        # every executor records its launches in the store, refused ones included: the fault
        # policy counts failures there (--max-retries), and a restarted run reconciles them
        ex = make_executor(opts.executor, opts.workdir, cluster, opts.kubeconfig,
                           opts.k8s_config, opts.drain, launch_log=launch_log,
                           options=xopts if opts.executor in ("local", "ray") else None)
        reconcile(store, ex, opts.workdir, adopt=opts.orphans == "adopt")
        refit = OnlineRefit(cluster, estimator=cfg.estimator)
        refit.warm(store_samples(store))  # what earlier runs measured
        beside = (companion(LoopContext(prep, store, ex, refit)) if companion is not None
                  else contextlib.nullcontext(LoopHooks(on_round=log_round)))
        with beside as hooks:
            res = run_loop(cluster, SqliteLoopStore(store, cluster,
                                                    FaultPolicy(int(opts.max_retries))),
                           ex, interval_s=opts.interval_s, until_idle=opts.until_idle,
                           timeout_s=opts.timeout_s, round_config=cfg, refit=refit,
                           on_round=hooks.on_round, should_stop=hooks.should_stop)
        log.warning("%s stopped (%s) after %d rounds; %d estimator refits from %d samples",
                    lock_command, res.reason, res.rounds, refit.refits, len(refit.samples))
    finally:
        shutdown = getattr(ex, "close", None)
        if callable(shutdown):
            shutdown()
        lock.release()
        store.close()
    return 0


def reconcile(store: Any, ex: Any, workdir: Path, adopt: bool = True) -> list[Any]:
    """Settle what an earlier (killed) run left, before the first round: adopt or stop its
    worker groups, close their launch records, and requeue from its last checkpoint every
    job the store thinks is running but nothing runs. Executors that find their own
    leftovers when they start (Slurm jobs, Kubernetes objects) say which jobs they adopted
    (``adopted_jobs``); with ``adopt`` off, one that can (``stop_adopted``) stops them
    first. Returns what was done per launch."""
    from apportion.runtime.workload import PROGRESS_FILE_NAME, read_progress_since

    from apportion import store_launches as sl
    from apportion.lifecycle import ACTIVE, JobState

    jobs = {r.id: r.to_jobspec() for r in store.jobs(ACTIVE)}
    records = sl.open_launches(store)
    done: list[Any] = []
    mine = [r for r in records if r.executor == getattr(ex, "name", "")]
    if mine and hasattr(ex, "reconcile"):
        done = ex.reconcile(mine, jobs, adopt=adopt)
    handled = {d.launch_id for d in done}
    # executors that find their own leftovers (Slurm jobs, Kubernetes objects) adopted them
    # when they started: those jobs keep running
    adopted: set[str] = set(getattr(ex, "adopted_jobs", set)())
    if adopted and not adopt and hasattr(ex, "stop_adopted"):
        ex.stop_adopted()  # --orphans stop: checkpointed, then requeued below
        adopted = set()
    for d in done:
        if d.action == "adopted":
            sl.adopt_launch(store, d.launch_id, getattr(getattr(ex, "launch_log", None), "owner",
                                                        "run"))
            adopted.add(d.job)
            log.warning("job %s: adopted launch %d left by an earlier run (%s)", d.job,
                        d.launch_id, d.detail)
            continue
        sl.launch_ended(store, d.launch_id, d.action, d.detail, d.checkpoint)
        sl.settle_checkpoint(store, d.job, d.checkpoint, f"launch {d.launch_id}: {d.detail}")
        log.warning("job %s: launch %d left by an earlier run %s at checkpoint %d (%s)", d.job,
                    d.launch_id, d.action, d.checkpoint, d.detail)
    for r in records:  # launches this executor cannot reconcile: their workers died with it
        if r.id in handled:
            continue
        if r.executor == "local":  # another executor's run now: stop what a local run left
            from apportion.runtime.executors.procs import stop_holders
            stop_holders(Path(r.jobdir), float(getattr(ex, "stop_timeout_s", 30.0)))
        ck = read_progress_since(Path(r.jobdir) / PROGRESS_FILE_NAME).checkpoint_iteration or 0
        ck = max(ck, r.checkpoint_start)
        sl.launch_ended(store, r.id, "stopped", "its run died; this executor cannot adopt it", ck)
        sl.settle_checkpoint(store, r.job, ck, f"launch {r.id}: its run died")
    for rec in store.jobs(frozenset({JobState.RUNNING})):
        if rec.id in adopted:
            continue
        view = read_progress_since(workdir / job_dirname(rec.id) / PROGRESS_FILE_NAME)
        ck = view.checkpoint_iteration or 0
        sl.settle_checkpoint(store, rec.id, ck, "running in the store, but no worker runs it: "
                             "back to the queue from its last checkpoint")
        # the store keeps the later of its own checkpoint and the progress file's
        log.warning("job %s: no worker runs it; requeued from checkpoint %d", rec.id,
                    store.job(rec.id).checkpoint_iterations)
    return done


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
        out.append(Sample(job, plan, dict(s["placement"]), s["gpu_type"], float(s["iter_time_s"])))
    return out
