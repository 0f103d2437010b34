"""Kubernetes: PyTorchJob manifests from a decision, written out or applied.

One allocation becomes a ConfigMap (the worker's ``config.json``) and a
Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``): one pod per placement node,
each with ``nproc_per_node`` = the GPUs it holds on that node, a node selector
on the GPU-feature-discovery label ``nvidia.com/gpu.product`` (GPU types are
opaque names mapped per engine: :data:`GPU_PRODUCT_LABELS`), and resource
requests/limits from the decision (``nvidia.com/gpu``, CPUs, host memory).
The container runs ``torchrun`` on the same trainer the local executor runs;
checkpoints go to a shared volume so a resized job resumes.

Without a kubeconfig the manifests are written as YAML files (one per job and
round) and nothing is contacted; with one, and the ``kubernetes`` package
installed, they are applied through ``CustomObjectsApi`` (resize and migrate
delete the old job first: the trainer checkpoints on SIGTERM within the grace
period).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from apportion.runtime.executor import Event, Health, Progress, actions_for
from apportion.runtime.launch import TRAINER_MODULE, train_config

from apportion.decision import Allocation, Decision
from apportion.jobs import JobSpec, job_dirname

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# catalog name -> the value NVIDIA GPU feature discovery puts on nodes
GPU_PRODUCT_LABELS = {
    "A100-40GB": "NVIDIA-A100-SXM4-40GB", "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "A800-80GB": "NVIDIA-A800-SXM4-80GB", "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H200": "NVIDIA-H200", "A40": "NVIDIA-A40", "A10": "NVIDIA-A10", "L4": "NVIDIA-L4",
    "T4": "Tesla-T4", "V100-32GB": "Tesla-V100-SXM2-32GB", "V100-16GB": "Tesla-V100-SXM2-16GB",
    "P100": "Tesla-P100-PCIE-16GB", "K80": "Tesla-K80",
}
CONFIG_DIR = "/etc/apportion"
CHECKPOINT_DIR = "/checkpoints"


def k8s_name(job: str) -> str:
    """A DNS-1123 name for a job id (lower case, ``-``, at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"apportion-{job}".lower()).strip("-")
    return name[:63].rstrip("-")


def pods_of(alloc: Allocation) -> list[int]:
    """GPUs per pod: one pod per placement node, in node order."""
    return [k for _, k in sorted(alloc.placement.items()) if k > 0] or [alloc.gpus]


def manifests(job: JobSpec, alloc: Allocation, image: str, namespace: str = "default",
              checkpoint_claim: str = "apportion-checkpoints",
              labels: dict[str, str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The ConfigMap and PyTorchJob for ``job`` on ``alloc`` (plain dicts, API field names)."""
    name = k8s_name(job.id)
    pods = pods_of(alloc)
    if len(set(pods)) != 1:
        raise ValueError(f"job {job.id}: placement {alloc.placement} puts different GPU counts on "
                         "its nodes; a PyTorchJob runs the same nproc_per_node in every pod")
    per_pod = pods[0]
    cfg = train_config(job, alloc, f"{CHECKPOINT_DIR}/{job_dirname(job.id)}", seed)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-config", "namespace": namespace},
                  "data": {"config.json": json.dumps(asdict(cfg), sort_keys=True)}}
    product = GPU_PRODUCT_LABELS.get(alloc.gpu_type, alloc.gpu_type)
    cpus = max(1, alloc.cpus // len(pods)) if alloc.cpus else None
    mem = alloc.host_memory_gib / len(pods) if alloc.host_memory_gib else None
    res: dict[str, Any] = {GPU_RESOURCE: per_pod}
    if cpus:
        res["cpu"] = str(cpus)
    if mem:
        res["memory"] = f"{max(1, int(mem))}Gi"
    meta_labels = {"app.kubernetes.io/managed-by": "apportion", "apportion/job": job.id,
                   **(labels or {})}

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {
            "metadata": {"labels": dict(meta_labels)},
            "spec": {
                "nodeSelector": {PRODUCT_LABEL: product},
                "terminationGracePeriodSeconds": 120,  # time to checkpoint on SIGTERM
                "containers": [{
                    "name": "pytorch",  # the container name the training operator requires
                    "image": image,
                    "command": ["torchrun", f"--nproc-per-node={per_pod}", "-m",
                                TRAINER_MODULE, f"{CONFIG_DIR}/config.json"],
                    "env": [{"name": "APPORTION_GPU_TYPE", "value": alloc.gpu_type}],
                    "resources": {"requests": dict(res), "limits": dict(res)},
                    "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR},
                                     {"name": "checkpoints", "mountPath": CHECKPOINT_DIR}]}],
                "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}},
                            {"name": "checkpoints",
                             "persistentVolumeClaim": {"claimName": checkpoint_claim}}]}}}

    specs: dict[str, Any] = {"Master": replica(1)}
    if len(pods) > 1:
        specs["Worker"] = replica(len(pods) - 1)
    job_manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PyTorchJob",
                    "metadata": {"name": name, "namespace": namespace, "labels": meta_labels,
                                 "annotations": {"apportion/plan": alloc.plan.label(),
                                                 "apportion/action": alloc.action.value}},
                    "spec": {"nprocPerNode": str(per_pod),
                             "runPolicy": {"cleanPodPolicy": "None"},
                             "pytorchReplicaSpecs": specs}}
    return [config_map, job_manifest]


class KubernetesExecutor:
    """Writes manifests per round (always) and applies them when a kubeconfig is given."""

    name = "kubernetes"

    def __init__(self, out_dir: str | Path, image: str = "apportion-worker:latest",
                 namespace: str = "default", kubeconfig: str | None = None,
                 checkpoint_claim: str = "apportion-checkpoints") -> None:
        self.out_dir = Path(out_dir)
        self.image, self.namespace = image, namespace
        self.claim = checkpoint_claim
        self.kubeconfig = kubeconfig
        self.running: dict[str, Allocation] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.round = 0
        self._api: Any = None
        if kubeconfig is not None:
            try:
                from kubernetes import client, config  # type: ignore[import-not-found]
            except ImportError as exc:
                raise RuntimeError("a kubeconfig was given but the 'kubernetes' package is not "
                                   "installed (pip install kubernetes)") from exc
            config.load_kube_config(config_file=kubeconfig)
            self._api = (client.CustomObjectsApi(), client.CoreV1Api())

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        self.round += 1
        by_id = {j.id: j for j in state}
        self.jobs.update(by_id)
        events: list[Event] = []
        for step in actions_for(decision, self.running, self.running):
            if step.allocation is None:
                self._delete(step.job)
                self.running.pop(step.job, None)
                events.append(Event(step.job, "preempt", detail="PyTorchJob deleted"))
                continue
            if step.action.value == "keep":
                events.append(Event(step.job, "keep", step.allocation.gpus, detail="no change"))
                continue
            if step.job in self.running:
                self._delete(step.job)
            docs = manifests(by_id[step.job], step.allocation, self.image, self.namespace,
                             self.claim)
            path = self.out_dir / f"round{self.round:04d}-{k8s_name(step.job)}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
            self._create(docs)
            self.running[step.job] = step.allocation
            events.append(Event(step.job, step.action.value, step.allocation.gpus,
                                step.allocation.gpu_type, str(path),
                                spec={"manifests": docs}))
        return events

    def _create(self, docs: list[dict[str, Any]]) -> None:
        if self._api is None:
            return
        custom, core = self._api
        core.create_namespaced_config_map(self.namespace, docs[0])
        custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, docs[1])

    def _delete(self, job: str) -> None:
        if self._api is None:
            return
        custom, core = self._api
        name = k8s_name(job)
        custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        core.delete_namespaced_config_map(f"{name}-config", self.namespace)

    def poll(self) -> list[Progress]:
        """Without a cluster there is nothing to observe: jobs are reported as starting."""
        return [Progress(j, self.jobs[j].iterations_done, self.jobs[j].iterations, Health.STARTING,
                         workers=a.gpus, plan=a.plan.label()) for j, a in sorted(self.running.items())]

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = []
        for j in sorted(self.running):
            self._delete(j)
            events.append(Event(j, "preempt", detail="deleted; workers checkpoint on SIGTERM"))
        self.running.clear()
        return events
