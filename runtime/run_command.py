"""``apportion run``: rounds every interval against the state store, applied by an executor.

Holds the store's round lock for the whole run (one scheduler per store), reads
the queue from it, solves, applies through the executor, polls progress back
into the store, and stops on ``--until-idle`` (every job finished or failed),
``--timeout`` or SIGINT/SIGTERM (every running job checkpointed first).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from apportion.cluster import Cluster
from apportion.config import resolve_cluster
from apportion.errors import InputError
from apportion.round import RoundConfig

log = logging.getLogger(__name__)

EXECUTORS = ("dry-run", "local", "slurm", "ray", "kubernetes")
EXIT_BUSY = 75


def make_executor(name: str, workdir: Path, cluster: Cluster, kubeconfig: str | None) -> Any:
    if name == "dry-run":
        from apportion.runtime.launch import DryRunExecutor

        return DryRunExecutor(workdir)
    if name == "local":
        from apportion.runtime.local import LocalExecutor

        return LocalExecutor(workdir)
    if name == "slurm":
        from apportion.runtime.slurm import from_environment

        return from_environment(workdir, cluster)
    if name == "ray":
        from apportion.runtime.ray_executor import RayExecutor

        return RayExecutor(workdir, cluster=cluster)
    if name == "kubernetes":
        from apportion.runtime.kubernetes import KubernetesExecutor

        return KubernetesExecutor(workdir / "manifests", kubeconfig=kubeconfig)
    raise InputError("--executor", "executor", f"{name!r} is not one of {', '.join(EXECUTORS)}")


def run_command(executor: str, cluster_arg: str, state: Path, interval_s: float, until_idle: bool,
                timeout_s: float | None, workdir: Path, kubeconfig: str | None = None,
                time_budget_s: float = 10.0) -> int:
    """Exit code: 0 stopped cleanly, 2 bad input, 75 another invocation holds the store."""
    from apportion.runtime.loop import run_loop
    from apportion.runtime.refit import OnlineRefit
    from apportion.runtime.store_adapter import SqliteLoopStore
    from apportion.store import RoundLock, StoreBusy, open_store

    if executor not in EXECUTORS:
        raise InputError("--executor", "executor", f"{executor!r} is not one of "
                         f"{', '.join(EXECUTORS)}")
    if not interval_s > 0:
        raise InputError("--interval", "interval", f"must be positive, got {interval_s}")
    if cluster_arg == "local":
        from apportion.runtime.local import local_cluster, local_round_config

        cluster = local_cluster()
        cfg = local_round_config(time_budget_s)
    else:
        cluster = resolve_cluster(cluster_arg)
        cfg = RoundConfig(time_budget_s=time_budget_s)
        if executor in ("local", "ray", "slurm"):  # the torch worker refuses pipeline plans
            from apportion.runtime.local import local_round_config

            cfg = local_round_config(time_budget_s)
    store = open_store(state, create=False)
    lock = RoundLock(state, "run")
    try:
        lock.acquire()
    except StoreBusy as exc:
        store.close()
        log.error("%s", exc)
        return EXIT_BUSY
    workdir.mkdir(parents=True, exist_ok=True)
    ex = make_executor(executor, workdir, cluster, kubeconfig)
    try:
        refit = OnlineRefit(cluster)
        res = run_loop(cluster, SqliteLoopStore(store, cluster), ex, interval_s=interval_s,
                       until_idle=until_idle, timeout_s=timeout_s, round_config=cfg, refit=refit)
        log.warning("run stopped (%s) after %d rounds; %d estimator refits from %d samples",
                    res.reason, res.rounds, refit.refits, len(refit.samples))
    finally:
        shutdown = getattr(ex, "close", None)
        if callable(shutdown):
            shutdown()
        lock.release()
        store.close()
    return 0
