"""Kueue objects from apportion's own model: the cluster file and the tenants' quotas.

* one ``ResourceFlavor`` per GPU type (per distinct node label when node groups
  of one type carry different ones), selecting its nodes by the GPU product
  label (the node group's ``gpu_product_label``, else GPU Feature Discovery's
  name for the type) and naming the ``Topology``;
* a ``Topology`` with two levels, node group (``node_group_label``) then
  host, so Kueue's topology-aware scheduling can keep a job in one group;
* one ``ClusterQueue`` per tenant (``apportion-<tenant>``) in one cohort: the
  tenant's GPU quota split over the flavors in proportion to their capacity
  (largest remainders, so the shares add up to the quota), with CPUs and
  memory in the same proportion of what training pods may use of the flavor's
  nodes (:func:`~apportion.runtime.executors.kubernetes.manifests.node_usable`); an
  ``apportion-unreserved`` queue holds what no tenant is guaranteed, which
  tenants borrow (apportion's best-effort jobs);
* a ``LocalQueue`` per tenant in the jobs' namespace, **named after the
  tenant** (``team-a``): the name ``export k8s --queue team-a`` and
  ``--queue-per-tenant`` put on the jobs, so the two exports applied together
  admit the jobs (a settings ``queue`` that names no tenant is warned about);
* the two ``PriorityClass`` objects jobs refer to (guaranteed, best-effort).

Kueue's API is ``kueue.x-k8s.io/v1beta2`` by default (Kueue 0.15 and later
store it; ``spec.cohortName``), or ``v1beta1`` (``spec.cohort``) for an older
Kueue with ``kueue_api: v1beta1`` in the settings or ``export kueue
--kueue-api v1beta1``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.manifests import (
    MANAGED_BY,
    _node_label,
    cluster_queue,
    dns_label,
    node_usable,
    tenant_queue,
)

from apportion.cluster import Cluster
from apportion.errors import InputError

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE = f"{KUEUE_GROUP}/v1beta2"  # the default (cfg.kueue_api)
COHORT = "apportion"
UNRESERVED = "apportion-unreserved"
HOSTNAME = "kubernetes.io/hostname"


def _split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` split over ``weights`` proportionally, largest remainders first."""
    w = sum(weights.values())
    if w == 0 or total == 0:
        return {k: 0 for k in weights}
    exact = {k: total * v / w for k, v in weights.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:total - sum(out.values())]:
        out[k] += 1
    return out


def flavors(cluster: Cluster, cfg: K8sConfig) -> dict[str, dict[str, Any]]:
    """Flavor name -> {gpu_type, label (key, value), nodes, gpus, cpu_milli, memory_mib}."""
    out: dict[str, dict[str, Any]] = {}
    by_label: dict[tuple[str, str, str], str] = {}
    for node in cluster.nodes.values():
        label = _node_label(cluster, node, cfg)
        key = (node.gpu_type, *label)
        name = by_label.get(key)
        if name is None:
            base = dns_label(node.gpu_type.lower(), "gpu")
            name = base if base not in out else dns_label(f"{node.gpu_type}-{label[1]}".lower(),
                                                          "gpu")
            by_label[key] = name
            out[name] = {"gpu_type": node.gpu_type, "label": label, "nodes": [], "gpus": 0,
                         "cpu_milli": 0, "memory_mib": 0}
        f = out[name]
        f["nodes"].append(node.name)
        f["gpus"] += node.gpus
        cpu, mem = node_usable(cluster, node, cfg)  # what the training pods may request
        f["cpu_milli"] += int(cpu * 1000)
        f["memory_mib"] += int(mem * 1024)
    return out


def kueue_objects(cluster: Cluster, tenants: dict[str, int], cfg: K8sConfig) -> list[dict[str, Any]]:
    """PriorityClasses, Topology, ResourceFlavors, ClusterQueues and LocalQueues, in apply order."""
    labels = {MANAGED_BY: "apportion"}
    kueue = f"{KUEUE_GROUP}/{cfg.kueue_api}"
    cohort_field = "cohortName" if cfg.kueue_api == "v1beta2" else "cohort"
    fl = flavors(cluster, cfg)
    topology = dns_label(cluster.name.lower(), "apportion")
    objs: list[dict[str, Any]] = []
    pc = cfg.priority_classes
    for name, value, what in ((pc.guaranteed, pc.guaranteed_value, "guaranteed"),
                              (pc.best_effort, pc.best_effort_value, "best-effort")):
        if name:
            objs.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                         "metadata": {"name": name, "labels": dict(labels)}, "value": value,
                         "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
                         "description": f"apportion {what} training jobs"})
    objs.append({"apiVersion": kueue, "kind": "Topology",
                 "metadata": {"name": topology, "labels": dict(labels)},
                 "spec": {"levels": [{"nodeLabel": cfg.node_group_label},
                                     {"nodeLabel": HOSTNAME}]}})
    for name, f in sorted(fl.items()):
        key, value = f["label"]
        objs.append({"apiVersion": kueue, "kind": "ResourceFlavor",
                     "metadata": {"name": name, "labels": dict(labels),
                                  "annotations": {"apportion/gpu-type": f["gpu_type"]}},
                     "spec": {"nodeLabels": {key: value}, "topologyName": topology}})
    queues = dict(tenants)
    queues.setdefault("default", 0)  # jobs without a tenant
    clash = [t for t in queues if cluster_queue(t) == UNRESERVED]
    if clash:
        raise InputError("--tenants", clash[0], f"tenant {clash[0]!r} would share the name "
                         f"{UNRESERVED} with the queue of unreserved GPUs; rename it")
    gpus_total = {n: f["gpus"] for n, f in fl.items()}
    shares = {t: _split(q, gpus_total) for t, q in queues.items()}
    reserved = {n: sum(s[n] for s in shares.values()) for n in fl}
    rest = {n: max(0, gpus_total[n] - reserved[n]) for n in fl}
    if any(rest.values()):
        shares[None] = rest  # type: ignore[index]
    for tenant, share in sorted(shares.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        cq = UNRESERVED if tenant is None else cluster_queue(tenant)
        groups = []
        for n, f in sorted(fl.items()):
            frac = share[n] / f["gpus"] if f["gpus"] else 0.0
            groups.append({"name": n, "resources": [
                {"name": cfg.gpu_resource, "nominalQuota": share[n]},
                {"name": "cpu", "nominalQuota": f"{int(f['cpu_milli'] * frac)}m"},
                {"name": "memory", "nominalQuota": f"{int(f['memory_mib'] * frac)}Mi"}]})
        meta: dict[str, Any] = {"name": cq, "labels": dict(labels)}
        if tenant is not None:
            meta["annotations"] = {"apportion/tenant": tenant}
        objs.append({"apiVersion": kueue, "kind": "ClusterQueue", "metadata": meta,
                     "spec": {cohort_field: COHORT, "namespaceSelector": {},
                              "queueingStrategy": "BestEffortFIFO",
                              "preemption": {"reclaimWithinCohort": "Any",
                                             "withinClusterQueue": "LowerPriority"},
                              "resourceGroups": [{"coveredResources": [cfg.gpu_resource, "cpu",
                                                                       "memory"],
                                                  "flavors": groups}]}})
    for tenant in sorted(queues):
        objs.append({"apiVersion": kueue, "kind": "LocalQueue",
                     "metadata": {"name": tenant_queue(tenant), "namespace": cfg.namespace,
                                  "labels": dict(labels),
                                  "annotations": {"apportion/tenant": tenant}},
                     "spec": {"clusterQueue": cluster_queue(tenant)}})
    return objs


def local_queues(tenants: dict[str, int]) -> dict[str, str]:
    """LocalQueue name -> tenant, as :func:`kueue_objects` writes them."""
    return {tenant_queue(t): t for t in {**tenants, "default": 0}}


def node_label_commands(cluster: Cluster, cfg: K8sConfig) -> str:
    """``kubectl label`` lines giving nodes the labels the flavors and topology select on."""
    lines = ["#!/bin/sh", "# Labels the Kueue objects select on (GPU Feature Discovery sets the",
             "# product label itself where it runs; the node-group label is apportion's).",
             "set -e"]
    by_group: dict[str, list[str]] = defaultdict(list)
    for node in cluster.nodes.values():
        by_group[node.group].append(node.name)
    for group, nodes in sorted(by_group.items()):
        key, value = _node_label(cluster, cluster.nodes[nodes[0]], cfg)
        lines.append(f"kubectl label node --overwrite {' '.join(nodes)} "
                     f"{cfg.node_group_label}={group} {key}={value}")
    return "\n".join(lines) + "\n"
