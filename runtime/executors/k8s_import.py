"""GPU nodes from ``kubectl get nodes -o json``: one record per node, for a cluster file.

:func:`import_k8s` reads the JSON an operator saves with ``kubectl get nodes
-o json`` (a ``List`` / ``NodeList``, or a single ``Node``) and returns one
dict per node that has GPUs::

    {"name": "gpu-node-3",                    # the kubernetes.io/hostname label (else metadata.name)
     "gpu_type": "NVIDIA-A100-SXM4-80GB",     # the raw product string: an alias in the catalog
     "gpus": 8,                               # allocatable GPUs (the device plugin's)
     "cpus": 95,                              # allocatable (whole CPUs)
     "memory_gib": 990.2,                     # allocatable
     "gpu_product_label": "NVIDIA-A100-SXM4-80GB",  # what the node group selects on
     "k8s_resources": "allocatable"}          # what the figures are (a node-group label)

The product comes from GPU Feature Discovery's ``nvidia.com/gpu.product``
label, or else GKE's ``cloud.google.com/gke-accelerator``, or AMD's node
labeller's ``amd.com/gpu.product-name`` on nodes whose GPUs are ``amd.com/gpu``
(then ``gpu_product_label`` is ``KEY=VALUE``, since the key is not the default
one; manifests for AMD nodes need ``gpu_resource: amd.com/gpu`` in
``--k8s-config``).
The figures are the node's **allocatable** (``status.allocatable``: capacity
less the kubelet's kube-reserved, system-reserved and eviction threshold), what
the scheduler binds pods against; a node that reports none (an old kubelet, a
hand-written file) falls back to its capacity, and its record says
``"k8s_resources": "capacity"``. The label tells the manifests not to take
the kubelet's reserve off again (``--k8s-config`` ``reserve``: only the
DaemonSets' share, ``pods_cpus`` and ``pods_memory_gib``, is left off).
Quantities are parsed with the official client's parser. Nodes without GPUs
and cordoned nodes are left out (a cordoned node takes no new pods); grouping
the records into node groups is the caller's (``apportion cluster import``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from apportion.errors import InputError
from apportion.inputs import parse_json_text, read_text

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
PRODUCT_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator",
                  "amd.com/gpu.product-name", "beta.amd.com/gpu.product-name")
DEFAULT_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME = "kubernetes.io/hostname"  # what apportion's node affinity matches
MAX_BYTES = 512 * 2**20  # a node's JSON is ~10-20 kB; 10,000 nodes fit


def _read(path: str | Path) -> Any:
    """``kubectl get nodes -o json`` saved to a file, through the one input reader
    (:mod:`apportion.inputs`: a regular file, at most :data:`MAX_BYTES`, UTF-8, JSON
    without NaN, bounded nesting)."""
    src = str(path)
    try:
        return parse_json_text(read_text(path, "Kubernetes nodes JSON", max_bytes=MAX_BYTES),
                               src)
    except InputError as exc:
        if exc.message.startswith("malformed JSON"):
            raise InputError(src, exc.field, f"{exc.message} (expected `kubectl get nodes -o "
                             "json`)") from None
        raise


def _quantity(src: str, field: str, value: Any) -> float:
    try:
        from kubernetes.utils import parse_quantity  # the [k8s] extra
    except ImportError:
        raise InputError(src, field, "reading Kubernetes quantities needs the kubernetes "
                         "package: pip install 'apportion[k8s]'") from None

    try:
        q = float(parse_quantity(value))
    except (ValueError, TypeError) as exc:
        raise InputError(src, field, f"{value!r} is not a Kubernetes quantity ({exc})") from None
    if not math.isfinite(q) or q < 0:
        raise InputError(src, field, f"{value!r} is not a non-negative quantity")
    return q


def _mapping(src: str, where: str, parent: dict[str, Any]) -> dict[str, Any]:
    """``parent``'s field named by ``where``'s last part: an object (or absent: empty), as
    the Kubernetes API gives it; anything else is refused by its path."""
    value = parent.get(where.rsplit(".", 1)[-1])
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(src, where, f"expected an object, got {type(value).__name__} "
                         f"{str(value)[:40]!r}")
    return value


def import_k8s(path: str | Path) -> list[dict[str, Any]]:
    """One record per schedulable GPU node (see the module docstring); errors name the field."""
    src = str(path)
    data = _read(path)
    if not isinstance(data, dict):
        raise InputError(src, "(top level)", "expected a JSON object (kubectl get nodes -o json)")
    if data.get("kind") == "Node":
        items, prefix = [data], ""
    elif isinstance(data.get("items"), list):
        items, prefix = data["items"], "items"
    else:
        raise InputError(src, "items", "missing: expected a NodeList (kubectl get nodes -o json) "
                         "or a Node")
    out: list[dict[str, Any]] = []
    for i, node in enumerate(items):
        at = f"{prefix}[{i}]" if prefix else "(node)"
        if not isinstance(node, dict) or node.get("kind", "Node") != "Node":
            raise InputError(src, at, "is not a Node")
        meta, spec = _mapping(src, f"{at}.metadata", node), _mapping(src, f"{at}.spec", node)
        status = _mapping(src, f"{at}.status", node)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise InputError(src, f"{at}.metadata.name", "missing")
        cap = status.get("allocatable")
        where = "allocatable"
        if not isinstance(cap, dict) or not cap:
            cap, where = status.get("capacity"), "capacity"
        if not isinstance(cap, dict):
            raise InputError(src, f"{at}.status.allocatable", "missing (and no capacity)")
        res = next((r for r in GPU_RESOURCES if r in cap), None)
        if res is None or spec.get("unschedulable"):
            continue
        gpus = _quantity(src, f"{at}.status.{where}.{res}", cap[res])
        if gpus < 1:
            continue
        labels = _mapping(src, f"{at}.metadata.labels", meta)
        key = next((k for k in PRODUCT_LABELS if labels.get(k)), None)
        if key is None:
            raise InputError(src, f"{at}.metadata.labels", f"node {name} has {int(gpus)} GPUs but "
                             f"no product label ({' or '.join(PRODUCT_LABELS)}); is GPU Feature "
                             "Discovery running?")
        for f in ("cpu", "memory"):
            if f not in cap:
                raise InputError(src, f"{at}.status.{where}.{f}", "missing")
        product = str(labels[key])
        # whole CPUs and GiB rounded down: never more than the kubelet offers
        mem_gib = _quantity(src, f"{at}.status.{where}.memory", cap["memory"]) / 2**30
        out.append({"name": str(labels.get(HOSTNAME) or name),
                    "gpu_type": product,
                    "gpus": int(gpus),
                    "cpus": int(_quantity(src, f"{at}.status.{where}.cpu", cap["cpu"])),
                    "memory_gib": math.floor(mem_gib * 10) / 10,
                    "gpu_product_label": product if key == DEFAULT_PRODUCT_LABEL
                    else f"{key}={product}",
                    "k8s_resources": where})
    return out
