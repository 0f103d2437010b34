"""Kubernetes settings: namespace, image, volume, queues, priority classes, node reserve.

Everything an operator would change per cluster lives here, in one small YAML
file (``--k8s-config``), never in constants: the namespace the objects go to,
the worker image (CPU and CUDA variants), the PersistentVolumeClaim holding
checkpoints and progress files, the Kueue LocalQueue (one for every job, or one
per tenant), the PriorityClass per tenant or per guaranteed flag, and the
share of every node the kubelet and system daemons keep for themselves.

``allocatable = capacity - reserve`` where ``reserve = reserved_X +
reserved_X_fraction * capacity`` (CPUs and memory separately). A pod asks for
its GPUs and for the same share of its node's *allocatable* CPUs and memory as
the decision gives it of the node's capacity, so the pods of every allocation
on a node fit that node together, and no pod ever asks for a whole node.

Example (every field optional)::

    namespace: training
    image: registry.example.com/apportion-worker:0.1.0-cuda
    api: trainjob                  # trainjob | jobset | pytorchjob
    runtime_ref: torch-distributed # trainjob: refer to this ClusterTrainingRuntime
    checkpoint_claim: apportion-checkpoints
    checkpoint_mount: /checkpoints # inside the pods
    local_checkpoint_mount: /checkpoints   # where `apportion run` sees the same volume
    queue: team-a                  # Kueue LocalQueue for every job ...
    queue_per_tenant: false        # ... or the tenant's own (what `export kueue` writes)
    kueue_api: v1beta2             # v1beta1 for a Kueue older than 0.15
    priority_classes: {guaranteed: apportion-guaranteed, best_effort: apportion-best-effort,
                       tenants: {vision: vision-high}}
    reserve: {cpus: 1, cpu_fraction: 0.0, memory_gib: 2, memory_fraction: 0.05,
              pods_cpus: 0.5, pods_memory_gib: 1}
    gang: none                     # none | volcano | kai: a gang scheduler binds the pods
    scheduler_name: null           # the pods' schedulerName (default: the gang's own)
    gang_queue: default            # the Volcano / KAI queue
    tolerations:                   # the pods' tolerations (Kubernetes' own fields); an
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}   # import keeps a tainted
                                   # node only where these tolerate its taints

A node's pods share ``allocatable - (pods_cpus, pods_memory_gib)``: what the
kubelet offers less what DaemonSet pods (device plugin, DCGM exporter, CNI,
log agents) request on every node, so the pods apportion writes on one node
never take all of it. A cluster imported with ``apportion cluster import
--from k8s`` already holds the kubelet's allocatable (its node groups say
``allocatable: true``): only the DaemonSets' share is left off those.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from apportion.config import _Strict, _validate, read_yaml
from apportion.errors import InputError

APIS = ("trainjob", "jobset", "pytorchjob")
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# the OCI distribution reference grammar, loosely: registry/path:tag@digest, no spaces
IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"


class Reserve(_Strict):
    """What kubelet, the system and eviction thresholds keep on every node."""

    cpus: float = Field(default=1.0, ge=0, le=1e5)
    cpu_fraction: float = Field(default=0.0, ge=0, lt=1)
    memory_gib: float = Field(default=2.0, ge=0, le=1e7)
    memory_fraction: float = Field(default=0.05, ge=0, lt=1)
    # what DaemonSet pods (GPU device plugin, DCGM exporter, CNI, log agents) request on
    # every node, out of its allocatable: never requested by apportion's pods
    pods_cpus: float = Field(default=0.5, ge=0, le=1e5)
    pods_memory_gib: float = Field(default=1.0, ge=0, le=1e7)


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class Toleration(_Strict):
    """A pod toleration, with Kubernetes' fields and defaults (``operator: Equal``; an empty
    ``effect`` tolerates every effect; ``Exists`` with no key tolerates every taint)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True,
                              populate_by_name=True)
    key: str | None = Field(default=None, max_length=317, pattern=LABEL_KEY)
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    @field_validator("value")
    @classmethod
    def _label_value(cls, v: str | None) -> str | None:
        if v and not re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", v):
            raise ValueError(f"{v!r} is not a label value")
        return v

    def manifest(self) -> dict[str, object]:
        """The toleration as a pod spec carries it (Kubernetes' camel-case names)."""
        out: dict[str, object] = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value is not None and self.operator == "Equal":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def tolerates(self, key: str, value: str | None, effect: str) -> bool:
        """Kubernetes' rule: the effect matches (or is empty), the key matches (or is empty
        with ``Exists``), and with ``Equal`` the value too."""
        if self.effect and self.effect != effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != key:
            return False
        return self.operator == "Exists" or (self.value or "") == (value or "")


def tolerated(tolerations: list[Toleration], key: str, value: str | None, effect: str) -> bool:
    """Whether a pod with ``tolerations`` may run on a node with this taint (a
    ``PreferNoSchedule`` taint never keeps a pod away)."""
    return effect == "PreferNoSchedule" or any(t.tolerates(key, value, effect)
                                               for t in tolerations)


class PriorityClasses(_Strict):
    """PriorityClass names: a tenant's own class wins over the guaranteed/best-effort pair."""

    guaranteed: str | None = Field(default="apportion-guaranteed", max_length=253,
                                   pattern=DNS_SUBDOMAIN)
    best_effort: str | None = Field(default="apportion-best-effort", max_length=253,
                                    pattern=DNS_SUBDOMAIN)
    tenants: dict[str, str] = Field(default_factory=dict)
    guaranteed_value: int = Field(default=1000, ge=-2147483648, le=1000000000)
    best_effort_value: int = Field(default=100, ge=-2147483648, le=1000000000)

    @field_validator("tenants")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for tenant, name in v.items():
            if not re.match(DNS_SUBDOMAIN, name) or len(name) > 253:
                raise ValueError(f"tenant {tenant!r}: {name!r} is not a PriorityClass name "
                                 "(lower-case DNS subdomain)")
        return v


class K8sConfig(_Strict):
    """The ``--k8s-config`` file; the defaults suit a cluster set up from ``deploy/``."""

    namespace: str = Field(default="default", max_length=63, pattern=DNS_LABEL)
    image: str = Field(default="apportion-worker:0.1.0", min_length=1, max_length=1024,
                       pattern=IMAGE)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    api: Literal["trainjob", "jobset", "pytorchjob"] = "trainjob"
    # api trainjob: a ClusterTrainingRuntime of the platform every TrainJob refers to,
    # instead of a TrainingRuntime of apportion's own per job
    runtime_ref: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
    service_account: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
    checkpoint_claim: str = Field(default="apportion-checkpoints", max_length=253,
                                  pattern=DNS_SUBDOMAIN)
    checkpoint_mount: str = Field(default="/checkpoints", pattern=r"^/[^\x00]*$", max_length=1024)
    local_checkpoint_mount: str | None = Field(default=None, min_length=1, max_length=4096)
    queue: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    queue_per_tenant: bool = False
    kueue_api: Literal["v1beta2", "v1beta1"] = "v1beta2"
    # gang scheduling by a scheduler other than the default one: Volcano (a PodGroup per
    # job, pods annotated with it) or NVIDIA KAI (its pod grouper makes the PodGroup from
    # the job; apportion sets the queue label); the pods' schedulerName
    gang: Literal["none", "volcano", "kai"] = "none"
    scheduler_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
    gang_queue: str = Field(default="default", max_length=63, pattern=DNS_LABEL)
    # the pods' tolerations: a node tainted NoSchedule / NoExecute gets apportion's pods only
    # where these tolerate its taints (`cluster import --from k8s` leaves out the others)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    priority_classes: PriorityClasses = Field(default_factory=PriorityClasses)
    reserve: Reserve = Field(default_factory=Reserve)
    gpu_resource: str = Field(default="nvidia.com/gpu", pattern=LABEL_KEY, max_length=253)
    gpu_product_label: str = Field(default="nvidia.com/gpu.product", pattern=LABEL_KEY,
                                   max_length=253)
    node_group_label: str = Field(default="apportion.io/node-group", pattern=LABEL_KEY,
                                  max_length=253)
    master_port: int = Field(default=29500, ge=1, le=65535)
    termination_grace_s: int = Field(default=120, ge=0, le=86400)
    max_restarts: int = Field(default=3, ge=0, le=1000)
    shm_gib: float = Field(default=0.0, ge=0, le=1e5)  # 0: /dev/shm without a size limit
    # the executor's life cycle
    retry_timeout_s: float = Field(default=60.0, gt=0, le=86400)
    retry_wait_s: float = Field(default=0.5, gt=0, le=600)
    stop_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    drain: bool = False

    @model_validator(mode="after")
    def _runtime_ref_is_a_trainjob_s(self) -> K8sConfig:
        if self.runtime_ref is not None and self.api != "trainjob":
            raise ValueError(f"runtime_ref names a ClusterTrainingRuntime, which only api "
                             f"trainjob refers to (api is {self.api})")
        return self

    @field_validator("local_checkpoint_mount")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\0" in v:
            raise ValueError("contains a NUL character")
        return v


def load_k8s_config(path: str | Path | None = None, **overrides: object) -> K8sConfig:
    """The settings from ``path`` (or the defaults), with non-``None`` ``overrides`` applied.

    Overrides come from command-line flags (``--namespace``, ``--image``, ...);
    a bad value names the flag's field, like a bad file names its own.
    """
    data = read_yaml(path) if path is not None else {}
    if data is None:
        data = {}
    src = str(path) if path is not None else "--k8s-config"
    cfg: K8sConfig = _validate(K8sConfig, data, src)
    extra = {k: v for k, v in overrides.items() if v is not None}
    if extra:
        merged = cfg.model_dump()
        merged.update(extra)
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in extra)
        try:
            cfg = _validate(K8sConfig, merged, flags)
        except InputError as exc:
            flag = "--" + exc.field.split(".")[0].replace("_", "-")
            raise InputError(flag if flag[2:].replace("-", "_") in extra else src, exc.field,
                             exc.message) from None
    return cfg


def allocatable(capacity: float, reserved: float, fraction: float) -> float:
    """Capacity less the node's reserve (absolute plus a fraction of capacity)."""
    return capacity - reserved - fraction * capacity
