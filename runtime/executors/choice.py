"""The ``--executor`` choice of ``run`` and ``serve``: a built-in executor by name, or an
installed package's (the ``apportion.executors`` entry-point group).

Each built-in is imported only when chosen: Kubernetes' client, Ray and Slurm's tools
are optional, and a run pays only for the engine it drives.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor, as_executor

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.plugins import call_with, plugins

EXECUTORS = ("dry-run", "local", "slurm", "ray", "kubernetes")

__all__ = ["EXECUTORS", "env_seconds", "executor_names", "make_executor"]


def make_executor(name: str, workdir: Path, cluster: Cluster, kubeconfig: str | None,
                  k8s_config: Path | None = None, drain: bool = False,
                  launch_log: Any = None, options: dict[str, Any] | None = None) -> Executor:
    opts = dict(options or {})
    if name == "dry-run":
        from apportion.runtime.executors.launch import DryRunExecutor

        return DryRunExecutor(workdir)
    if name == "local":
        from apportion.runtime.executors.local.executor import LocalExecutor

        return LocalExecutor(workdir, launch_log=launch_log, **opts)
    if name == "slurm":
        from apportion.runtime.executors.slurm.executor import from_environment

        return from_environment(workdir, cluster, launch_log=launch_log)
    if name == "ray":
        from apportion.runtime.executors.ray.executor import RayExecutor

        # how long a placement group may wait for its resources before that launch fails
        # (an autoscaling cluster adding nodes may need longer than the default minute)
        wait = env_seconds("APPORTION_RAY_PLACEMENT_TIMEOUT_S", 60.0)
        return RayExecutor(workdir, cluster=cluster, address=opts.pop("ray_address", None),
                           launch_log=launch_log, placement_timeout_s=wait, **opts)
    if name == "kubernetes":
        from apportion.runtime.executors.kubernetes.client import K8sClient
        from apportion.runtime.executors.kubernetes.config import load_k8s_config
        from apportion.runtime.executors.kubernetes.executor import KubernetesExecutor

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
        return as_executor(call_with(extra[name], workdir=workdir, cluster=cluster,
                                     launch_log=launch_log, options=opts))
    raise InputError("--executor", "executor", f"{name!r} is not one of "
                     f"{', '.join(executor_names())}")


def executor_names() -> list[str]:
    """Every executor ``--executor`` accepts: the built-in ones and the plug-ins'."""
    return [*EXECUTORS, *(n for n in plugins("apportion.executors") if n not in EXECUTORS)]


def env_seconds(name: str, default: float) -> float:
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
