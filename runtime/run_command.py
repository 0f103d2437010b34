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


def make_executor(name: str, workdir: Path, cluster: Cluster, kubeconfig: str | None,
                  k8s_config: Path | None = None, drain: bool = False) -> Any:
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
        from apportion.runtime.k8s_client import K8sClient
        from apportion.runtime.k8s_config import load_k8s_config
        from apportion.runtime.kubernetes import KubernetesExecutor

        cfg = load_k8s_config(k8s_config)
        client = None
        if kubeconfig is not None:  # "in-cluster": the pod's service account
            client = K8sClient.from_kubeconfig(None if kubeconfig == "in-cluster" else kubeconfig,
                                               cfg.namespace, retry_timeout_s=cfg.retry_timeout_s,
                                               retry_wait_s=cfg.retry_wait_s)
        return KubernetesExecutor(workdir / "manifests", cluster, cfg, client,
                                  drain=drain or cfg.drain)
    raise InputError("--executor", "executor", f"{name!r} is not one of {', '.join(EXECUTORS)}")


def run_command(executor: str, cluster_arg: str, state: Path, interval_s: float, until_idle: bool,
                timeout_s: float | None, workdir: Path, kubeconfig: str | None = None,
                time_budget_s: float = 10.0, k8s_config: Path | None = None,
                drain: bool = False, policy: str | None = None,
                estimator: str = "analytic") -> int:
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
        if executor in ("local", "ray", "slurm", "kubernetes"):  # the torch worker refuses PP with TP
            from apportion.runtime.local import local_round_config

            cfg = local_round_config(time_budget_s)
    from apportion.round import checked_config

    chosen = checked_config(policy=policy, estimator=estimator)  # bad names exit 2
    cfg.policy, cfg.estimator = chosen.policy, chosen.estimator
    if executor == "kubernetes":
        from apportion.runtime.k8s_config import load_k8s_config

        load_k8s_config(k8s_config)  # bad settings exit 2 before the store is locked
    store = open_store(state, create=False)
    if estimator in ("tables", "auto"):  # measured times: this store's samples from earlier runs
        from apportion.round import estimator_from

        batches = {r.id: int(r.spec["global_batch_size"]) for r in store.jobs()}
        try:
            cfg.estimator = estimator_from(estimator, None, store.samples(), batches)
        except InputError:
            store.close()
            raise
    lock = RoundLock(state, "run")
    try:
        lock.acquire()
    except StoreBusy as exc:
        store.close()
        log.error("%s", exc)
        return EXIT_BUSY
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        ex = make_executor(executor, workdir, cluster, kubeconfig, k8s_config, drain)
    except BaseException:
        lock.release()
        store.close()
        raise
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
