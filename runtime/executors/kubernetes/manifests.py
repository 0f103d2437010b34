"""Kubernetes objects for one allocation: TrainJob (+ TrainingRuntime), JobSet or PyTorchJob.

One allocation becomes a ConfigMap (the worker's ``config.json``, the plan,
the allocation) and one job object. The same code serves ``apportion export
k8s`` and the kubernetes executor, so what an operator reviews is what runs.

* **Pods request a share, never a node.** A pod holding ``k`` GPUs of a node
  asks for ``k`` GPUs and for the decision's CPUs and memory on that node
  (``cpus * k / gpus``; the GPU share of the node when the decision gives
  none) scaled from the node's capacity to its *allocatable* (capacity less
  :class:`~apportion.runtime.executors.kubernetes.config.Reserve`). Every allocation on a node
  is scaled alike, so together they fit the node's allocatable.
* **The solver's placement is honoured.** Nodes are grouped by the GPUs the
  job holds on them; each group is one replicated job (JobSet / TrainJob) or
  replica type (PyTorchJob) whose pods carry a required node affinity on
  ``kubernetes.io/hostname`` (the group's nodes) and a required anti-affinity
  to the job's other pods (one pod per node), plus the node group's GPU
  product label. Uneven placements (4 + 8 + 4) are several groups, never an
  error; PyTorchJob has only Master and Worker templates, so it expresses a
  placement whose nodes, all but at most one, hold the same count.
* **Ranks.** Every pod runs ``torchrun`` with its own ``--nproc-per-node``
  and a c10d rendezvous on the first pod, which assigns global ranks across
  pods of different sizes; torchrun sets ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` for each process, the
  container sets the rest of the workload contract
  (:mod:`apportion.runtime.workload`). ``APPORTION_PLAN`` comes from the
  ConfigMap, so a suspended job's plan can be patched without touching its
  (immutable) pod templates.
* **Gang admission.** With a queue, the object carries
  ``kueue.x-k8s.io/queue-name`` and is created suspended: Kueue admits the
  whole job at once and unsuspends it. The PriorityClass comes from the
  tenant or the guaranteed flag
  (:class:`~apportion.runtime.executors.kubernetes.config.PriorityClasses`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from apportion.runtime.executors.kubernetes.config import K8sConfig, allocatable
from apportion.runtime.executors.launch import TRAINER_MODULE, train_config
from apportion.runtime.workload import (
    ENV_CHECKPOINT_DIR,
    ENV_ITERATIONS,
    ENV_JOB_ID,
    ENV_PLAN,
    ENV_PROGRESS_FILE,
    job_env,
    plan_json,
    plan_supported,
)

from apportion.cluster import Cluster, Node
from apportion.decision import Allocation
from apportion.errors import InputError
from apportion.gpus import gpu_product
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan

HOSTNAME = "kubernetes.io/hostname"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_LABEL = "apportion/job"
JOB_ID_ANNOTATION = "apportion/job-id"
ALLOC_ANNOTATION = "apportion/allocation"
CONFIG_DIR = "/etc/apportion"
# Kubeflow Trainer v2's runtime conventions (v2.0 and later): the trainer's replicated job
# and container are "node", marked as the trainer's by the ancestor label, whose pod count
# TrainJob.spec.trainer.numNodes sets; the torch policy gives torchrun its PET_* variables
# (PET_MASTER_ADDR = <name>-node-0-0.<name>, PET_MASTER_PORT 29500)
TRAINER_NODE = "node"
TRAINER_CONTAINER = "node"
TRAINER_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_FRAMEWORK = "trainer.kubeflow.org/framework"
# gang schedulers: Volcano's PodGroup and the pod annotation naming it; KAI's queue label
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
KAI_QUEUE = "kai.scheduler/queue"
SCHEDULER = {"volcano": "volcano", "kai": "kai-scheduler"}

# group, version, plural per kind (the custom resources apportion writes)
RESOURCES = {
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "TrainingRuntime": ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "PodGroup": ("scheduling.volcano.sh", "v1beta1", "podgroups"),
}
JOB_KIND = {"trainjob": "TrainJob", "jobset": "JobSet", "pytorchjob": "PyTorchJob"}
# the label the controller puts on every pod of a job (the anti-affinity selects on it)
POD_JOB_LABEL = {"trainjob": "jobset.sigs.k8s.io/jobset-name",
                 "jobset": "jobset.sigs.k8s.io/jobset-name",
                 "pytorchjob": "training.kubeflow.org/job-name"}


class PlacementNotExpressible(InputError):
    """The chosen API cannot express this placement (PyTorchJob with three pod sizes)."""


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def _slug(text: str, n: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:n].strip("-")


def object_name(job_id: str) -> str:
    """A short DNS-1123 label for a job (``ap-<slug>-<sha256 prefix>``, at most 34 characters).

    Short, because JobSet names its pods ``<name>-<replicated job>-<i>-<j>``
    and a pod's hostname is at most 63 characters; hashed, because distinct ids
    (``A`` and ``a``) must never share an object.
    """
    slug = _slug(job_id, 20)
    return f"ap-{slug}-{_digest(job_id, 10)}" if slug else f"ap-{_digest(job_id, 10)}"


def dns_label(text: str, prefix: str = "apportion") -> str:
    """``prefix-text`` when that is already a DNS label, else a slug plus a hash (unique)."""
    plain = f"{prefix}-{text}"
    if re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", plain) and len(plain) <= 63:
        return plain
    slug = _slug(text, 40)
    return f"{prefix}-{slug}-{_digest(text, 8)}" if slug else f"{prefix}-{_digest(text, 8)}"


def tenant_queue(tenant: str) -> str:
    """The LocalQueue ``export kueue`` gives a tenant, and ``--queue-per-tenant`` puts on its
    jobs: the tenant's own name where it is a DNS label (``team-a``), so ``export k8s
    --queue team-a`` names the same queue; else a slug of it with a hash."""
    if re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", tenant) and len(tenant) <= 63:
        return tenant
    return dns_label(tenant)


def cluster_queue(tenant: str) -> str:
    """The ClusterQueue ``export kueue`` gives a tenant (cluster-wide: ``apportion-<tenant>``)."""
    return dns_label(tenant)


def workload_kind(job: JobSpec) -> str:
    return job.workload.kind if job.workload is not None else "builtin"


# -- pods --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodGroup:
    """Pods of one job that hold the same number of GPUs, one per node of ``nodes``."""

    name: str  # replicated job / replica type
    gpus: int  # per pod
    nodes: tuple[str, ...]
    cpu_milli: int  # per pod request
    memory_mib: int


def _node_label(cluster: Cluster, node: Node, cfg: K8sConfig) -> tuple[str, str]:
    group = next((g for g in cluster.groups if g.prefix == node.group), None)
    label = group.gpu_product_label if group is not None else None
    if label and "=" in label:
        key, value = label.split("=", 1)
        return key, value
    return cfg.gpu_product_label, label or gpu_product(node.gpu_type)


# a node group's label, imported from Kubernetes: "allocatable" (the kubelet's), or "free"
# (allocatable less what running pods request, `cluster import --pods`)
ALLOCATABLE_LABEL = "k8s_resources"


def node_usable(cluster: Cluster, node: Node, cfg: K8sConfig) -> tuple[float, float]:
    """CPUs and GiB of ``node`` that apportion's pods may request together: the node's
    allocatable (its figures less the kubelet's reserve, or its figures themselves when
    they came from the kubelet's allocatable) less what DaemonSet pods take on it."""
    r = cfg.reserve
    group = next((g for g in cluster.groups if g.prefix == node.group), None)
    imported = group.label(ALLOCATABLE_LABEL) if group is not None else None
    if imported in ("allocatable", "free"):
        cpu, mem = float(node.cpus), float(node.host_memory_gib)
    else:
        cpu = allocatable(node.cpus, r.cpus, r.cpu_fraction)
        mem = allocatable(node.host_memory_gib, r.memory_gib, r.memory_fraction)
    if imported != "free":  # "free": the DaemonSets' requests are off already (--pods)
        cpu, mem = cpu - r.pods_cpus, mem - r.pods_memory_gib
    if cpu <= 0:
        raise InputError("--k8s-config", "reserve.cpus", f"the reserve leaves node {node.name} "
                         f"({node.cpus} CPUs) no CPUs for training pods")
    if mem <= 0:
        raise InputError("--k8s-config", "reserve.memory_gib", f"the reserve leaves node "
                         f"{node.name} ({node.host_memory_gib:g} GiB) no memory for training "
                         "pods")
    return cpu, mem


def pod_request(cluster: Cluster, node: Node, gpus: int, alloc: Allocation,
                cfg: K8sConfig) -> tuple[int, int]:
    """Millicores and MiB for a pod holding ``gpus`` of ``node`` (see module docstring):
    the decision's share of the node's figures, scaled to what pods may use of it
    (:func:`node_usable`), so the pods of every allocation on a node fit it together."""
    cpu_use, mem_use = node_usable(cluster, node, cfg)
    share_cpu = alloc.cpus * gpus / alloc.gpus if alloc.cpus else node.cpus * gpus / node.gpus
    share_mem = (alloc.host_memory_gib * gpus / alloc.gpus if alloc.host_memory_gib
                 else node.host_memory_gib * gpus / node.gpus)
    share_cpu, share_mem = min(share_cpu, node.cpus), min(share_mem, node.host_memory_gib)
    cpu_m = int(share_cpu * cpu_use / node.cpus * 1000)
    mem_mib = int(share_mem * mem_use / node.host_memory_gib * 1024)
    return max(1, cpu_m), max(1, mem_mib)


def pod_groups(alloc: Allocation, cluster: Cluster, cfg: K8sConfig, api: str) -> list[PodGroup]:
    """The allocation's pods grouped by GPU count; the first group holds the rendezvous.

    Groups are ordered by GPUs per pod, largest first; for a TrainJob the first is
    the trainer's own replicated job (``node``, whose pod count is the TrainJob's
    ``numNodes``): the group on the most nodes, so that an uneven placement leaves
    as few pods as possible to the other replicated jobs (``node-<GPUs per pod>``).
    A group's request is the smallest of its nodes' shares, so it fits each.
    """
    by_count: dict[int, list[str]] = {}
    for node, k in sorted(alloc.placement.items()):
        if k > 0:
            by_count.setdefault(k, []).append(node)
    counts = sorted(by_count, reverse=True)
    if api == "trainjob":
        counts.sort(key=lambda k: (-len(by_count[k]), -k))
    if api == "pytorchjob":
        names = _pytorch_split(alloc, by_count)
    else:
        names = {((TRAINER_NODE if i == 0 else f"{TRAINER_NODE}-{k}") if api == "trainjob"
                  else f"node-{k}"): (k, by_count[k]) for i, k in enumerate(counts)}
    groups: list[PodGroup] = []
    for name, (k, nodes) in names.items():
        reqs = [pod_request(cluster, cluster.nodes[n], k, alloc, cfg) for n in nodes]
        groups.append(PodGroup(name, k, tuple(nodes), min(c for c, _ in reqs),
                               min(m for _, m in reqs)))
    return groups


def _pytorch_split(alloc: Allocation,
                   by_count: dict[int, list[str]]) -> dict[str, tuple[int, list[str]]]:
    """Master (one pod) and Worker (the rest, all of one size), or not expressible."""
    if len(by_count) == 1:
        (k, nodes), = by_count.items()
        out = {"Master": (k, nodes[:1])}
        if len(nodes) > 1:
            out["Worker"] = (k, nodes[1:])
        return out
    singles = sorted((k for k, n in by_count.items() if len(n) == 1), reverse=True)
    if len(by_count) == 2 and singles:
        master = singles[0]
        (other,) = [k for k in by_count if k != master]
        return {"Master": (master, by_count[master]), "Worker": (other, by_count[other])}
    raise PlacementNotExpressible(
        "--api", "pytorchjob", f"job {alloc.job}: placement {dict(sorted(alloc.placement.items()))} "
        f"has pods of {len(by_count)} sizes; a PyTorchJob has one Master and one Worker "
        "template, so use --api trainjob or jobset (one replicated job per size)")


# -- the objects -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Everything a manifest needs besides the job and the allocation."""

    cluster: Cluster
    cfg: K8sConfig
    api: str = "trainjob"
    launch_id: str = ""
    seed: int = 0


def priority_class(job: JobSpec, cfg: K8sConfig) -> str | None:
    pc = cfg.priority_classes
    if job.tenant in pc.tenants:
        return pc.tenants[job.tenant]
    return pc.guaranteed if job.guaranteed else pc.best_effort


def queue_name(job: JobSpec, cfg: K8sConfig) -> str | None:
    return tenant_queue(job.tenant) if cfg.queue_per_tenant else cfg.queue


def job_objects(job: JobSpec, alloc: Allocation, target: Target) -> list[dict[str, Any]]:
    """The ConfigMap, [TrainingRuntime,] and the job object for ``job`` on ``alloc``."""
    cfg, api = target.cfg, target.api
    _check_runnable(job, alloc)
    name = object_name(job.id)
    groups = pod_groups(alloc, target.cluster, cfg, api)
    nnodes = sum(len(g.nodes) for g in groups)
    first = groups[0]
    if api == "pytorchjob":
        master = f"{name}-master-0"
    else:
        master = f"{name}-{first.name}-0-0.{name}"
    jobdir = f"{cfg.checkpoint_mount.rstrip('/')}/{job_dirname(job.id)}"
    queue = queue_name(job, cfg)
    labels = {MANAGED_BY: "apportion", JOB_LABEL: name}
    if queue:
        labels[QUEUE_LABEL] = queue
    annotations = {JOB_ID_ANNOTATION: job.id, "apportion/plan": alloc.plan.label(),
                   "apportion/gpu-type": alloc.gpu_type,
                   ALLOC_ANNOTATION: json.dumps(alloc.as_dict(), sort_keys=True)}
    meta = {"name": name, "namespace": cfg.namespace, "labels": labels,
            "annotations": annotations}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-config", "namespace": cfg.namespace,
                               "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                               "annotations": {JOB_ID_ANNOTATION: job.id}},
                  "data": config_data(job, alloc, jobdir, target)}
    container_name = {"pytorchjob": "pytorch", "trainjob": TRAINER_CONTAINER}.get(api, "worker")

    def pod(group: PodGroup) -> dict[str, Any]:
        return pod_template(job, alloc, group, target, name, container_name, master, nnodes,
                            jobdir)

    suspend = queue is not None
    if cfg.gang == "kai":  # KAI's pod grouper reads the queue from the top owner
        labels[KAI_QUEUE] = cfg.gang_queue
    pc = priority_class(job, cfg)
    if api == "pytorchjob":
        return [config_map, _pytorchjob(groups, cfg, meta, pod, suspend, pc, nnodes)]
    gang = [volcano_pod_group(name, groups, job, cfg, pc)] if cfg.gang == "volcano" else []

    def replicated(g: PodGroup, trainer: bool) -> dict[str, Any]:
        tmpl: dict[str, Any] = {"spec": {
            "parallelism": len(g.nodes), "completions": len(g.nodes),
            "completionMode": "Indexed", "backoffLimit": 0, "template": pod(g)}}
        if trainer:  # the pods whose count the TrainJob's numNodes sets
            tmpl["metadata"] = {"labels": {TRAINER_ANCESTOR: "trainer"}}
        return {"name": g.name, "replicas": 1, "template": tmpl}

    jobset_spec = {
        "network": {"enableDNSHostnames": True},
        "failurePolicy": {"maxRestarts": cfg.max_restarts},
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [replicated(g, api == "trainjob" and i == 0)
                           for i, g in enumerate(groups)]}
    if api == "jobset":
        return [config_map, *gang, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                    "metadata": meta, "spec": {"suspend": suspend,
                                                               **jobset_spec}}]
    if cfg.runtime_ref:
        return [config_map, *gang, runtime_ref_trainjob(job, alloc, target, name, meta, groups,
                                                        master, nnodes, jobdir, suspend)]
    if len(groups) > 1:  # Trainer counts the trainer's pods; the other sizes are extra jobs
        annotations["apportion/nodes"] = str(nnodes)
        annotations["apportion/pods"] = ", ".join(
            f"{g.name}: {len(g.nodes)} x {g.gpus} GPUs" for g in groups)
    runtime, trainjob = _own_runtime_trainjob(job, name, cfg, meta, first, jobset_spec, suspend)
    return [config_map, runtime, *gang, trainjob]


def _check_runnable(job: JobSpec, alloc: Allocation) -> None:
    """Refuse, naming the decision's field, an allocation the job's workload cannot run
    or whose placement does not hold the cell's and the plan's GPUs."""
    kind = workload_kind(job)
    reason = plan_supported(kind, alloc.plan, "cuda")  # Kubernetes nodes hold the GPUs
    if reason is not None:
        raise InputError("decision", f"allocations[{alloc.job}].plan",
                         f"the {kind} workload cannot run it: {reason}")
    if alloc.plan.gpus != alloc.gpus or sum(alloc.placement.values()) != alloc.gpus:
        raise InputError("decision", f"allocations[{alloc.job}].placement",
                         f"placement holds {sum(alloc.placement.values())} GPUs, the cell "
                         f"{alloc.gpus} and the plan {alloc.plan.gpus}")


def _pytorchjob(groups: list[PodGroup], cfg: K8sConfig, meta: dict[str, Any],
                pod: Callable[[PodGroup], dict[str, Any]], suspend: bool, pc: str | None,
                nnodes: int) -> dict[str, Any]:
    """The Training Operator's PyTorchJob: a replica spec per pod group, suspended while
    Kueue holds it, with Volcano's scheduling policy when gang-scheduled."""
    first = groups[0]
    specs = {g.name: {"replicas": len(g.nodes), "restartPolicy": "OnFailure",
                      "template": pod(g)} for g in groups}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "suspend": suspend,
                                  "backoffLimit": cfg.max_restarts}
    if cfg.gang == "volcano":  # the Training Operator makes the PodGroup from this
        sp: dict[str, Any] = {"minAvailable": nnodes, "queue": cfg.gang_queue,
                              "minResources": gang_resources(groups, cfg)}
        if pc:
            sp["priorityClass"] = pc
        run_policy["schedulingPolicy"] = sp
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
            "spec": {"nprocPerNode": str(first.gpus), "runPolicy": run_policy,
                     "pytorchReplicaSpecs": specs}}


def _own_runtime_trainjob(job: JobSpec, name: str, cfg: K8sConfig, meta: dict[str, Any],
                          first: PodGroup, jobset_spec: dict[str, Any],
                          suspend: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A TrainingRuntime of the job's own (its JobSet spec, pinned pods and all) and the
    TrainJob that refers to it, for a cluster without a shared runtime (--runtime-ref)."""
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
               "metadata": {"name": name, "namespace": cfg.namespace,
                            "labels": {MANAGED_BY: "apportion", JOB_LABEL: name,
                                       TRAINER_FRAMEWORK: "torch"},
                            "annotations": {JOB_ID_ANNOTATION: job.id}},
               "spec": {"mlPolicy": {"numNodes": len(first.nodes),
                                     "torch": {"numProcPerNode": first.gpus}},
                        "template": {"spec": jobset_spec}}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": meta,
                "spec": {"runtimeRef": {"name": name, "kind": "TrainingRuntime",
                                        "apiGroup": "trainer.kubeflow.org"},
                         "trainer": {"numNodes": len(first.nodes),
                                     "numProcPerNode": first.gpus},
                         "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                         "suspend": suspend}}
    return runtime, trainjob


def runtime_ref_trainjob(job: JobSpec, alloc: Allocation, target: Target, name: str,
                         meta: dict[str, Any], groups: list[PodGroup], master: str,
                         nnodes: int, jobdir: str, suspend: bool) -> dict[str, Any]:
    """A TrainJob on the platform's ClusterTrainingRuntime (``runtime_ref``), its pods made
    apportion's through ``trainer`` and ``podSpecOverrides``: the command, the workload
    contract's environment, the resources per node, the config, checkpoint and shm volumes,
    the node group's product label and the tolerations. A shared runtime gives every node
    the same pod, so an uneven placement cannot be expressed; and overrides have no node
    affinity, so a job on one node is pinned to it (``kubernetes.io/hostname``) while a job
    on several is held to its node group (``node_group_label``, which ``export kueue``'s
    ``label-nodes.sh`` sets), the Kubernetes scheduler choosing the nodes there
    (``apportion/pinned`` says which)."""
    cfg = target.cfg
    if len(groups) > 1:
        shapes = ", ".join(f"{g.gpus} GPUs on {len(g.nodes)}" for g in groups)
        raise PlacementNotExpressible(
            "decision", f"allocations[{alloc.job}].placement",
            f"a ClusterTrainingRuntime ({cfg.runtime_ref}) gives every node the same pod, "
            f"and this placement holds {shapes}; export without runtime_ref (a "
            "TrainingRuntime per job) to run it")
    g = groups[0]
    tmpl = pod_template(job, alloc, g, target, name, TRAINER_CONTAINER, master, nnodes, jobdir)
    pod, container = tmpl["spec"], tmpl["spec"]["containers"][0]
    selector = dict(pod["nodeSelector"])
    node0 = target.cluster.nodes[g.nodes[0]]
    if len(g.nodes) == 1:
        selector[HOSTNAME] = g.nodes[0]
        pinned = "hosts"
    else:
        selector[cfg.node_group_label] = node0.group
        pinned = f"node group {node0.group}"
    override: dict[str, Any] = {
        "targetJobs": [{"name": TRAINER_NODE}], "nodeSelector": selector,
        "volumes": pod["volumes"],
        "containers": [{"name": TRAINER_CONTAINER, "volumeMounts": container["volumeMounts"]}]}
    if pod.get("tolerations"):
        override["tolerations"] = pod["tolerations"]
    if pod.get("serviceAccountName"):
        override["serviceAccountName"] = pod["serviceAccountName"]
    meta["annotations"]["apportion/pinned"] = pinned
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": meta,
            "spec": {"runtimeRef": {"name": cfg.runtime_ref, "kind": "ClusterTrainingRuntime",
                                    "apiGroup": "trainer.kubeflow.org"},
                     "trainer": {"numNodes": len(g.nodes), "numProcPerNode": g.gpus,
                                 "image": container["image"], "command": container["command"],
                                 "env": container["env"],
                                 "resourcesPerNode": container["resources"]},
                     "podSpecOverrides": [override],
                     "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                     "suspend": suspend}}


def gang_resources(groups: list[PodGroup], cfg: K8sConfig) -> dict[str, str]:
    """What the whole gang requests: GPUs, CPUs and memory of every pod."""
    pods = [(g, len(g.nodes)) for g in groups]
    return {cfg.gpu_resource: str(sum(g.gpus * n for g, n in pods)),
            "cpu": f"{sum(g.cpu_milli * n for g, n in pods)}m",
            "memory": f"{sum(g.memory_mib * n for g, n in pods)}Mi"}


def volcano_pod_group(name: str, groups: list[PodGroup], job: JobSpec, cfg: K8sConfig,
                      pc: str | None) -> dict[str, Any]:
    """Volcano's PodGroup for a job: every pod, or none (``minMember`` = all of them)."""
    spec: dict[str, Any] = {"minMember": sum(len(g.nodes) for g in groups),
                            "minResources": gang_resources(groups, cfg),
                            "queue": cfg.gang_queue}
    if pc:
        spec["priorityClassName"] = pc
    group, version, _ = RESOURCES["PodGroup"]
    return {"apiVersion": f"{group}/{version}", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": cfg.namespace,
                         "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                         "annotations": {JOB_ID_ANNOTATION: job.id}},
            "spec": spec}


def config_data(job: JobSpec, alloc: Allocation, jobdir: str, target: Target) -> dict[str, str]:
    """The ConfigMap's files: the trainer config, the plan, the allocation (patchable)."""
    cfg = train_config(job, alloc, jobdir, target.seed, launch_id=target.launch_id)
    return {"config.json": json.dumps(asdict(cfg), sort_keys=True),
            "plan.json": plan_json(alloc.plan),
            "allocation.json": json.dumps(alloc.as_dict(), sort_keys=True)}


def pod_template(job: JobSpec, alloc: Allocation, group: PodGroup, target: Target, name: str,
                 container_name: str, master: str, nnodes: int, jobdir: str) -> dict[str, Any]:
    cfg = target.cfg
    wl = job.workload
    node0 = target.cluster.nodes[group.nodes[0]]
    label_key, label_value = _node_label(target.cluster, node0, cfg)
    launcher = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={group.gpus}"]
    if nnodes == 1:
        launcher.append("--standalone")
    else:
        launcher += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master}:{cfg.master_port}",
                     f"--rdzv-id={name}"]
    if wl is None or wl.kind == "builtin":
        command = [*launcher, "-m", TRAINER_MODULE, f"{CONFIG_DIR}/config.json"]
    else:
        command = [*launcher, "--no-python", *wl.command]
    contract = job_env(job.id, alloc.plan, job.iterations, jobdir, alloc.gpus, master,
                       cfg.master_port)
    env: list[dict[str, Any]] = [{"name": k, "value": contract[k]}
                                 for k in (ENV_JOB_ID, ENV_ITERATIONS, ENV_CHECKPOINT_DIR,
                                           ENV_PROGRESS_FILE)]
    env.append({"name": ENV_PLAN, "valueFrom": {"configMapKeyRef": {
        "name": f"{name}-config", "key": "plan.json"}}})
    env += [{"name": "APPORTION_GPU_TYPE", "value": alloc.gpu_type},
            {"name": "OMP_NUM_THREADS",
             "value": str(max(1, group.cpu_milli // 1000 // max(1, group.gpus)))}]
    env += [{"name": k, "value": v} for k, v in sorted((wl.env if wl else {}).items())]
    gpu = {cfg.gpu_resource: str(group.gpus)}
    container: dict[str, Any] = {
        "name": container_name,
        "image": (wl.image if wl is not None and wl.image else cfg.image),
        "imagePullPolicy": cfg.image_pull_policy,
        "command": command, "env": env,
        "ports": [{"name": "rdzv", "containerPort": cfg.master_port, "protocol": "TCP"}],
        "resources": {"requests": {**gpu, "cpu": f"{group.cpu_milli}m",
                                   "memory": f"{group.memory_mib}Mi"},
                      "limits": dict(gpu)},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "checkpoints", "mountPath": cfg.checkpoint_mount},
                         {"name": "dshm", "mountPath": "/dev/shm"}]}
    if wl is not None and wl.workdir:
        container["workingDir"] = wl.workdir
    shm: dict[str, Any] = {"medium": "Memory"}
    if cfg.shm_gib:
        shm["sizeLimit"] = f"{int(cfg.shm_gib * 1024)}Mi"
    spec: dict[str, Any] = {
        "restartPolicy": "Never" if target.api != "pytorchjob" else "OnFailure",
        "terminationGracePeriodSeconds": cfg.termination_grace_s,  # checkpoint on SIGTERM
        "nodeSelector": {label_key: label_value},
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": HOSTNAME, "operator": "In", "values": list(group.nodes)}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {POD_JOB_LABEL[target.api]: name}},
                "topologyKey": HOSTNAME}]}},
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}},
                    {"name": "checkpoints",
                     "persistentVolumeClaim": {"claimName": cfg.checkpoint_claim}},
                    {"name": "dshm", "emptyDir": shm}]}
    if cfg.tolerations:  # nodes tainted for GPU work (nvidia.com/gpu:NoSchedule, ...)
        spec["tolerations"] = [t.manifest() for t in cfg.tolerations]
    pc = priority_class(job, cfg)
    if pc:
        spec["priorityClassName"] = pc
    if cfg.service_account:
        spec["serviceAccountName"] = cfg.service_account
    scheduler = cfg.scheduler_name or SCHEDULER.get(cfg.gang)
    if scheduler:
        spec["schedulerName"] = scheduler
    pod_labels = {MANAGED_BY: "apportion", JOB_LABEL: name}
    pod_annotations = {JOB_ID_ANNOTATION: job.id}
    if cfg.gang == "volcano" and target.api != "pytorchjob":
        pod_annotations[VOLCANO_GROUP] = name  # the PodGroup of job_objects
    if cfg.gang == "kai":
        pod_labels[KAI_QUEUE] = cfg.gang_queue
    return {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": spec}


def allocation_of(obj: dict[str, Any]) -> Allocation | None:
    """The allocation an object was made for (its annotation), or None."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ALLOC_ANNOTATION)
    if not raw:
        return None
    from apportion.decision import Action

    d = json.loads(raw)
    return Allocation(d["job"], d["gpu_type"], int(d["gpus"]), int(d["stages"]),
                      ExecutionPlan(**d["plan"]), dict(d["placement"]),
                      float(d.get("est_throughput") or 0.0), Action(d.get("action", "start")),
                      d.get("iter_time_s"), d.get("normalized_throughput"),
                      d.get("mem_per_gpu_gib"), int(d.get("cpus") or 0),
                      float(d.get("host_memory_gib") or 0.0))

