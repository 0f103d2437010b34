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
Quantities are parsed with the official client's parser. Grouping the records
into node groups is the caller's (``apportion cluster import``).

**Nodes as the scheduler sees them.** Left out, each with a note saying why
(:class:`~apportion.runtime.executors.imported.Imported`): nodes without GPUs;
cordoned nodes (``spec.unschedulable``); nodes whose ``Ready`` condition is not
``True`` (``False``: the kubelet says it is unhealthy; ``Unknown``: the node stopped
reporting); nodes with a ``NoSchedule`` or ``NoExecute`` taint the pods' tolerations
(``--k8s-config``'s ``tolerations``) do not tolerate (GKE and AKS taint GPU pools
``nvidia.com/gpu=present:NoSchedule``: tolerate it there and the nodes are kept, their
taints recorded as the ``k8s_taints`` label). **MIG**: GPU Feature Discovery's
``single`` strategy relabels a node's product ``<product>-MIG-<profile>``
(``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``) and counts slices as ``nvidia.com/gpu``; such a
record carries ``mig_profile`` and the importer keeps it only where ``--gpu-map`` maps
that name to a catalog GPU. The ``mixed`` strategy offers slices as
``nvidia.com/mig-<profile>`` resources: those are never whole GPUs, so only the node's
remaining ``nvidia.com/gpu`` count is offered (none: the node is left out, its slices
named). **Running pods**: with the pods of ``kubectl get pods -A -o json``, what pods
bound to a node request (not finished, not apportion's own: the state store accounts for
those) is taken off its allocatable, the way the scheduler sums requests (the larger of
the containers' sum and any init container, plus the pod's overhead); such records say
``"k8s_resources": "free"``, and a node whose GPUs are all requested is left out.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from apportion.runtime.executors.imported import Imported
from apportion.runtime.executors.kubernetes.config import Toleration, tolerated

from apportion.errors import InputError
from apportion.inputs import parse_json_text, read_text

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
PRODUCT_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator",
                  "amd.com/gpu.product-name", "beta.amd.com/gpu.product-name")
DEFAULT_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_RESOURCE = "nvidia.com/mig-"  # GFD's mixed strategy: nvidia.com/mig-1g.5gb, ...
MIG_PRODUCT = re.compile(r"^(?P<product>.+)-MIG-(?P<profile>\d+g\.\d+gb)$", re.IGNORECASE)
MANAGED_BY = "app.kubernetes.io/managed-by"  # apportion's own pods say "apportion"
DONE_PHASES = ("Succeeded", "Failed")
HOSTNAME = "kubernetes.io/hostname"  # what apportion's node affinity matches
MAX_BYTES = 512 * 2**20  # a node's JSON is ~10-20 kB; 10,000 nodes fit


def _read(path: str | Path, what: str = "nodes") -> Any:
    """``kubectl get nodes -o json`` (or ``get pods``) saved to a file, through the one
    input reader (:mod:`apportion.inputs`: a regular file, at most :data:`MAX_BYTES`, UTF-8,
    JSON without NaN, bounded nesting)."""
    src = str(path)
    try:
        return parse_json_text(read_text(path, f"Kubernetes {what} JSON", max_bytes=MAX_BYTES),
                               src)
    except InputError as exc:
        if exc.message.startswith("malformed JSON"):
            raise InputError(src, exc.field, f"{exc.message} (expected `kubectl get {what} -o "
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


def _items(src: str, data: Any, kind: str, what: str) -> tuple[list[Any], str]:
    if not isinstance(data, dict):
        raise InputError(src, "(top level)", f"expected a JSON object (kubectl get {what} -o "
                         "json)")
    if data.get("kind") == kind:
        return [data], ""
    if isinstance(data.get("items"), list):
        return data["items"], "items"
    raise InputError(src, "items", f"missing: expected a {kind}List (kubectl get {what} -o "
                     f"json) or a {kind}")


def _requests(src: str, at: str, container: dict[str, Any]) -> dict[str, float]:
    """A container's requests; an absent request defaults to its limit (as the API
    server defaults it)."""
    res = _mapping(src, f"{at}.resources", container)
    limits = _mapping(src, f"{at}.resources.limits", res)
    requests = {**limits, **_mapping(src, f"{at}.resources.requests", res)}
    return {k: _quantity(src, f"{at}.resources.requests.{k}", v) for k, v in requests.items()}


def pod_requests(src: str, at: str, pod: dict[str, Any]) -> dict[str, float]:
    """What a pod requests of its node, summed as the scheduler sums it: its containers
    (and sidecar init containers, ``restartPolicy: Always``), or its largest init container
    if that is more, plus the pod's overhead."""
    spec = _mapping(src, f"{at}.spec", pod)
    total: dict[str, float] = {}
    init_max: dict[str, float] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for k, v in _requests(src, f"{at}.spec.containers[{i}]", c).items():
            total[k] = total.get(k, 0.0) + v
    for i, c in enumerate(spec.get("initContainers") or []):
        req = _requests(src, f"{at}.spec.initContainers[{i}]", c)
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            for k, v in req.items():
                total[k] = total.get(k, 0.0) + v
        else:
            for k, v in req.items():
                init_max[k] = max(init_max.get(k, 0.0), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, 0.0), v)
    for k, v in _mapping(src, f"{at}.spec.overhead", spec).items():
        total[k] = total.get(k, 0.0) + _quantity(src, f"{at}.spec.overhead.{k}", v)
    return total


def pods_by_node(path: str | Path) -> dict[str, list[tuple[str, dict[str, float]]]]:
    """Node name -> (namespace/name, requests) of every pod bound to it that holds its
    resources: not finished, not apportion's own."""
    src = str(path)
    items, prefix = _items(src, _read(path, "pods"), "Pod", "pods -A")
    out: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for i, pod in enumerate(items):
        at = f"{prefix}[{i}]" if prefix else "(pod)"
        if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
            raise InputError(src, at, "is not a Pod")
        meta = _mapping(src, f"{at}.metadata", pod)
        node = _mapping(src, f"{at}.spec", pod).get("nodeName")
        phase = _mapping(src, f"{at}.status", pod).get("phase")
        labels = _mapping(src, f"{at}.metadata.labels", meta)
        if not node or phase in DONE_PHASES or labels.get(MANAGED_BY) == "apportion":
            continue
        name = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
        out.setdefault(str(node), []).append((name, pod_requests(src, at, pod)))
    return out


def _not_ready(status: dict[str, Any]) -> str | None:
    """Why the node's Ready condition is not True (None: ready, or no conditions given)."""
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            if c.get("status") == "True":
                return None
            why = "; ".join(str(x) for x in (c.get("reason"), c.get("message")) if x)
            state = "unknown (the node stopped reporting)" if c.get("status") == "Unknown" \
                else "False"
            return f"not Ready: Ready={state}{' (' + why[:160] + ')' if why else ''}"
    return None


def _taint(t: dict[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key', '')}{value}:{t.get('effect', '')}"


def import_k8s(path: str | Path, pods: str | Path | None = None,
               tolerations: list[Toleration] | None = None) -> Imported:
    """One record per schedulable GPU node, and a note for every node left out or cut down
    (see the module docstring); errors name the field."""
    src = str(path)
    items, prefix = _items(src, _read(path), "Node", "nodes")
    held = pods_by_node(pods) if pods is not None else None
    tol = list(tolerations or [])
    out = Imported()
    for i, node in enumerate(items):
        _import_node(src, f"{prefix}[{i}]" if prefix else "(node)", node, held, tol, out)
    return out


def _import_node(src: str, at: str, node: Any,
                 held: dict[str, list[tuple[str, dict[str, float]]]] | None,
                 tol: list[Toleration], out: Imported) -> None:
    """One Node into ``out``: its record (and what was cut from it), or why it is left
    out; a malformed one raises InputError naming the field."""
    if not isinstance(node, dict) or node.get("kind", "Node") != "Node":
        raise InputError(src, at, "is not a Node")
    meta, spec = _mapping(src, f"{at}.metadata", node), _mapping(src, f"{at}.spec", node)
    status = _mapping(src, f"{at}.status", node)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(src, f"{at}.metadata.name", "missing")
    labels = _mapping(src, f"{at}.metadata.labels", meta)
    shown = str(labels.get(HOSTNAME) or name)
    cap, where, res, gpus, mig = _gpu_capacity(src, at, status)
    if gpus < 1:
        out.leave_out(shown, "MIG slices only (" + ", ".join(
            f"{k} x{int(_quantity(src, at, cap[k]))}" for k in mig) + "): apportion "
            "places whole GPUs; turn MIG off on the node or give it whole GPUs"
            if mig else "no GPUs")
        return
    assert res is not None  # gpus >= 1 came from it
    if spec.get("unschedulable"):
        out.leave_out(shown, "cordoned (spec.unschedulable): it takes no new pods")
        return
    why = _not_ready(status)
    if why is not None:
        out.leave_out(shown, why)
        return
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    refused = [_taint(t) for t in taints
               if not tolerated(tol, str(t.get("key", "")), t.get("value"),
                                str(t.get("effect", "")))]
    if refused:
        out.leave_out(shown, f"tainted {', '.join(refused)}, which the pods do not "
                      "tolerate: add a toleration to the tolerations of --k8s-config "
                      "to keep it")
        return
    key = next((k for k in PRODUCT_LABELS if labels.get(k)), None)
    if key is None:
        raise InputError(src, f"{at}.metadata.labels", f"node {name} has {int(gpus)} GPUs but "
                         f"no product label ({' or '.join(PRODUCT_LABELS)}); is GPU Feature "
                         "Discovery running?")
    for f in ("cpu", "memory"):
        if f not in cap:
            raise InputError(src, f"{at}.status.{where}.{f}", "missing")
    product = str(labels[key])
    cpus = _quantity(src, f"{at}.status.{where}.cpu", cap["cpu"])
    mem = _quantity(src, f"{at}.status.{where}.memory", cap["memory"])
    cuts: list[str] = []
    if mig:
        cuts.append(f"MIG slices ({', '.join(mig)}) not offered: only whole GPUs are")
    resources = where
    if held is not None:
        resources = "free"
        left = _less_running_pods(held.get(name, []), res, gpus, cpus, mem, cuts)
        if isinstance(left, str):
            out.leave_out(shown, left)
            return
        gpus, cpus, mem = left
    out.nodes.append(_node_record(shown, product, key, gpus, cpus, mem, resources, taints))
    for c in cuts:
        out.reduce(shown, c)


def _gpu_capacity(src: str, at: str, status: dict[str, Any]
                  ) -> tuple[dict[str, Any], str, str | None, float, list[str]]:
    """What the node offers (``allocatable``, else ``capacity``), where it was read, its
    GPU resource's name and count, and its MIG resources of at least one slice."""
    cap = status.get("allocatable")
    where = "allocatable"
    if not isinstance(cap, dict) or not cap:
        cap, where = status.get("capacity"), "capacity"
    if not isinstance(cap, dict):
        raise InputError(src, f"{at}.status.allocatable", "missing (and no capacity)")
    res = next((r for r in GPU_RESOURCES if r in cap), None)
    gpus = _quantity(src, f"{at}.status.{where}.{res}", cap[res]) if res else 0.0
    mig = sorted(k for k in cap if k.startswith(MIG_RESOURCE)
                 and _quantity(src, f"{at}.status.{where}.{k}", cap[k]) >= 1)
    return cap, where, res, gpus, mig


def _less_running_pods(pods_here: list[tuple[str, dict[str, float]]], res: str, gpus: float,
                       cpus: float, mem: float,
                       cuts: list[str]) -> tuple[float, float, float] | str:
    """The GPUs, CPUs and memory the running pods (``--pods``) leave free, with the cut
    noted in ``cuts``; or why nothing usable is left."""
    used: dict[str, float] = {r: sum((req.get(r, 0.0) for _, req in pods_here), 0.0)
                              for r in (res, "cpu", "memory")}
    names = ", ".join(p for p, req in pods_here if req.get(res))[:200]
    if used[res] >= gpus:
        return f"all {int(gpus)} GPUs requested by running pods ({names})"
    if used[res]:
        cuts.append(f"{int(used[res])} of {int(gpus)} GPUs requested by running pods "
                    f"({names})")
    gpus -= used[res]
    cpus -= used["cpu"]
    mem -= used["memory"]
    if cpus < 1 or mem <= 0:
        return "running pods request all its CPUs or memory"
    return gpus, cpus, mem


def _node_record(shown: str, product: str, key: str, gpus: float, cpus: float, mem: float,
                 resources: str, taints: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's cluster-file record: whole CPUs and GiB rounded down (never more than
    the kubelet offers), the label the pods select it by, its MIG profile and taints."""
    # whole CPUs and GiB rounded down: never more than the kubelet offers
    rec: dict[str, Any] = {
        "name": shown, "gpu_type": product, "gpus": int(gpus), "cpus": int(cpus),
        "memory_gib": math.floor(mem / 2**30 * 10) / 10,
        "gpu_product_label": product if key == DEFAULT_PRODUCT_LABEL
        else f"{key}={product}",
        "k8s_resources": resources}
    m = MIG_PRODUCT.match(product)
    if m:  # GFD's single strategy: slices counted as nvidia.com/gpu
        rec["mig_profile"] = m.group("profile")
    kept = [_taint(t) for t in taints]
    if kept:
        rec["k8s_taints"] = ",".join(kept)
    return rec
