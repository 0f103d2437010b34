"""Kubernetes objects for one allocation: TrainJob (+ TrainingRuntime), JobSet or PyTorchJob.

One allocation becomes a ConfigMap (the worker's ``config.json``, the plan,
the allocation) and one job object. The same code serves ``apportion export
k8s`` and the kubernetes executor, so what an operator reviews is what runs.

* **Pods request a share, never a node.** A pod holding ``k`` GPUs of a node
  asks for ``k`` GPUs and for the decision's CPUs and memory on that node
  (``cpus * k / gpus``; the GPU share of the node when the decision gives
  none) scaled from the node's capacity to its *allocatable* (capacity less
  :class:`~apportion.runtime.k8s_config.Reserve`). Every allocation on a node
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
  tenant or the guaranteed flag (:class:`~apportion.runtime.k8s_config.PriorityClasses`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from apportion.runtime.k8s_config import K8sConfig, allocatable
from apportion.runtime.launch import TRAINER_MODULE, train_config
from apportion.runtime.workload import (
    ENV_CHECKPOINT_DIR,
    ENV_ITERATIONS,
    ENV_JOB_ID,
    ENV_PLAN,
    ENV_PROGRESS_FILE,
    job_env,
    plan_json,
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
TRAINER_NODE = "trainer-node"  # the replicated job Kubeflow Trainer fills from the TrainJob
TRAINER_CONTAINER = "trainer"

# group, version, plural per kind (the custom resources apportion writes)
RESOURCES = {
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "TrainingRuntime": ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
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
    """The LocalQueue (and ClusterQueue) name ``export kueue`` gives a tenant."""
    return dns_label(tenant)


# -- which plans a workload runs --------------------------------------------------------------
def plan_supported(kind: str, plan: ExecutionPlan) -> str | None:
    """Why the workload ``kind`` cannot run ``plan``, or ``None`` when it can.

    Local stand-in with the signature of the shared predicate another branch
    adds to :mod:`apportion.runtime.workload`; replace this body with a call to
    it once merged. The built-in torch trainer refuses pipeline parallelism
    with tensor parallelism or ZeRO, and TP with ZeRO (``runtime.trainer``);
    a user's command is trusted to run the plan it is given.
    """
    if plan.zero_stage not in (0, 1, 2, 3):
        return f"ZeRO stage {plan.zero_stage} does not exist (0-3)"
    if kind != "builtin":
        return None
    if plan.pp > 1 and plan.tp > 1:
        return (f"plan {plan.label()}: the built-in trainer does not combine pipeline and "
                "tensor parallelism")
    if plan.pp > 1 and plan.zero_stage:
        return f"plan {plan.label()}: the built-in trainer does not combine pipeline and ZeRO"
    if plan.tp > 1 and plan.zero_stage:
        return f"plan {plan.label()}: the built-in trainer does not combine TP and ZeRO"
    return None


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


def pod_request(node: Node, gpus: int, alloc: Allocation, cfg: K8sConfig) -> tuple[int, int]:
    """Millicores and MiB for a pod holding ``gpus`` of ``node`` (see module docstring)."""
    r = cfg.reserve
    cpu_alloc = allocatable(node.cpus, r.cpus, r.cpu_fraction)
    mem_alloc = allocatable(node.host_memory_gib, r.memory_gib, r.memory_fraction)
    if cpu_alloc <= 0:
        raise InputError("--k8s-config", "reserve.cpus", f"the reserve leaves node {node.name} "
                         f"({node.cpus} CPUs) no allocatable CPUs")
    if mem_alloc <= 0:
        raise InputError("--k8s-config", "reserve.memory_gib", f"the reserve leaves node "
                         f"{node.name} ({node.host_memory_gib:g} GiB) no allocatable memory")
    share_cpu = alloc.cpus * gpus / alloc.gpus if alloc.cpus else node.cpus * gpus / node.gpus
    share_mem = (alloc.host_memory_gib * gpus / alloc.gpus if alloc.host_memory_gib
                 else node.host_memory_gib * gpus / node.gpus)
    share_cpu, share_mem = min(share_cpu, node.cpus), min(share_mem, node.host_memory_gib)
    cpu_m = int(share_cpu * cpu_alloc / node.cpus * 1000)
    mem_mib = int(share_mem * mem_alloc / node.host_memory_gib * 1024)
    return max(1, cpu_m), max(1, mem_mib)


def pod_groups(alloc: Allocation, cluster: Cluster, cfg: K8sConfig, api: str) -> list[PodGroup]:
    """The allocation's pods grouped by GPU count; the first group holds rank 0.

    Groups are ordered by GPUs per pod, largest first (rank 0 on a full node).
    A group's request is the smallest of its nodes' shares, so it fits each.
    """
    by_count: dict[int, list[str]] = {}
    for node, k in sorted(alloc.placement.items()):
        if k > 0:
            by_count.setdefault(k, []).append(node)
    counts = sorted(by_count, reverse=True)
    if api == "pytorchjob":
        names = _pytorch_split(alloc, by_count)
    else:
        names = {((TRAINER_NODE if i == 0 else f"{TRAINER_NODE}-{k}") if api == "trainjob"
                  else f"node-{k}"): (k, by_count[k]) for i, k in enumerate(counts)}
    groups: list[PodGroup] = []
    for name, (k, nodes) in names.items():
        reqs = [pod_request(cluster.nodes[n], k, alloc, cfg) for n in nodes]
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
    kind = workload_kind(job)
    reason = plan_supported(kind, alloc.plan)
    if reason is not None:
        raise InputError("decision", f"allocations[{alloc.job}].plan",
                         f"the {kind} workload cannot run it: {reason}")
    if alloc.plan.gpus != alloc.gpus or sum(alloc.placement.values()) != alloc.gpus:
        raise InputError("decision", f"allocations[{alloc.job}].placement",
                         f"placement holds {sum(alloc.placement.values())} GPUs, the cell "
                         f"{alloc.gpus} and the plan {alloc.plan.gpus}")
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
    if api == "pytorchjob":
        specs = {g.name: {"replicas": len(g.nodes), "restartPolicy": "OnFailure",
                          "template": pod(g)} for g in groups}
        obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
               "spec": {"nprocPerNode": str(first.gpus),
                        "runPolicy": {"cleanPodPolicy": "None", "suspend": suspend,
                                      "backoffLimit": cfg.max_restarts},
                        "pytorchReplicaSpecs": specs}}
        return [config_map, obj]
    jobset_spec = {
        "network": {"enableDNSHostnames": True},
        "failurePolicy": {"maxRestarts": cfg.max_restarts},
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [{"name": g.name, "replicas": 1, "template": {"spec": {
            "parallelism": len(g.nodes), "completions": len(g.nodes),
            "completionMode": "Indexed", "backoffLimit": 0,
            "template": pod(g)}}} for g in groups]}
    if api == "jobset":
        return [config_map, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                             "metadata": meta, "spec": {"suspend": suspend, **jobset_spec}}]
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
               "metadata": {"name": name, "namespace": cfg.namespace,
                            "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                            "annotations": {JOB_ID_ANNOTATION: job.id}},
               "spec": {"mlPolicy": {"numNodes": len(first.nodes)},
                        "template": {"spec": jobset_spec}}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": meta,
                "spec": {"runtimeRef": {"name": name, "kind": "TrainingRuntime",
                                        "apiGroup": "trainer.kubeflow.org"},
                         "trainer": {"numNodes": len(first.nodes)},
                         "labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                         "suspend": suspend}}
    return [config_map, runtime, trainjob]


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
    pc = priority_class(job, cfg)
    if pc:
        spec["priorityClassName"] = pc
    if cfg.service_account:
        spec["serviceAccountName"] = cfg.service_account
    return {"metadata": {"labels": {MANAGED_BY: "apportion", JOB_LABEL: name},
                         "annotations": {JOB_ID_ANNOTATION: job.id}},
            "spec": spec}


def job_object(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The job object (TrainJob, JobSet or PyTorchJob) among an allocation's objects."""
    return docs[-1]


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

