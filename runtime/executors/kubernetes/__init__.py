"""The Kubernetes executor's room: TrainJob / JobSet / PyTorchJob objects per allocation
(:mod:`.executor`, :mod:`.manifests`), the API client (:mod:`.client`), the executor's
settings file (:mod:`.config`), Kueue's objects (:mod:`.kueue`), ``apportion export k8s``
and ``export kueue`` (:mod:`.export`), and ``apportion cluster import --from k8s``
(:mod:`.importer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor, LaunchLog
from apportion.runtime.executors.registry import ExecutorType, register

from apportion.cluster import Cluster


def check(options: dict[str, Any]) -> None:
    """The ``--k8s-config`` file, before the run opens anything."""
    from apportion.runtime.executors.kubernetes.config import load_k8s_config

    load_k8s_config(options.get("k8s_config"))


def build(workdir: Path, cluster: Cluster, launch_log: LaunchLog | None,
          options: dict[str, Any]) -> Executor:
    """``--executor kubernetes``: objects written under ``WORKDIR/manifests``, and applied
    through ``--kubeconfig`` (a file, or ``in-cluster``: the pod's service account) where
    given."""
    from apportion.runtime.executors.kubernetes.client import K8sClient
    from apportion.runtime.executors.kubernetes.config import load_k8s_config
    from apportion.runtime.executors.kubernetes.executor import KubernetesExecutor

    cfg = load_k8s_config(options.get("k8s_config"))
    kubeconfig = options.get("kubeconfig")
    client = None
    if kubeconfig is not None:
        client = K8sClient.from_kubeconfig(None if kubeconfig == "in-cluster" else kubeconfig,
                                           cfg.namespace, retry_timeout_s=cfg.retry_timeout_s,
                                           retry_wait_s=cfg.retry_wait_s)
    return KubernetesExecutor(workdir / "manifests", cluster, cfg, client,
                              drain=bool(options.get("drain")) or cfg.drain,
                              launch_log=launch_log)


KUBERNETES = register(ExecutorType(
    "kubernetes", "a TrainJob, JobSet or PyTorchJob per allocation, pinned to the decision's "
    "nodes, gang-admitted by Kueue where configured (--k8s-config, --kubeconfig)", build,
    reads=("kubeconfig", "k8s_config", "drain"), check=check,
    needs="apportion[k8s] to apply (without --kubeconfig: manifests only)"))
