"""A Ray cluster's nodes as apportion sees them: names, GPU types, GPUs, CPUs, memory.

:func:`import_ray` is what ``apportion cluster import --from ray`` reads (one
dict per alive node); :func:`describe_nodes` is the same from ``ray.nodes()``
records, and the Ray executor maps the names back to Ray node ids with
:func:`node_ids`, so a decision's placement names Ray nodes.

Names: a node's ``apportion.io/node-name`` label when set, else its host name,
with the first 8 hex digits of its node id appended when several alive nodes
share the host name (several raylets on one machine). GPU type, as Ray
reports it: the ``accelerator_type:<T>`` resource Ray sets on GPU nodes (or
``ray start --resources '{"accelerator_type:A40": 1}'``), else the
``ray.io/accelerator-type`` label, else a custom resource named after a GPU
of apportion's catalog (how the embedded mode and hand-made clusters declare
types), else None (a node without GPUs).
"""

from __future__ import annotations

import re
from typing import Any

from apportion.runtime.executors.imported import Imported

from apportion.errors import CatalogError, InputError
from apportion.gpus import canonical_gpu_name
from apportion.ray_home import check_auth, probe, use_token_auth

ACCEL_PREFIX = "accelerator_type:"
ACCEL_LABEL = "ray.io/accelerator-type"
NAME_LABEL = "apportion.io/node-name"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _catalog_gpu(name: str) -> bool:
    try:
        canonical_gpu_name(name)
    except (CatalogError, ValueError, KeyError):
        return False
    return True


def node_gpu_type(node: dict[str, Any]) -> str | None:
    """The raw GPU type string Ray reports for one ``ray.nodes()`` record (None: no GPUs)."""
    res = node.get("Resources") or {}
    for k in sorted(res):
        if k.startswith(ACCEL_PREFIX) and res[k] > 0:
            return k[len(ACCEL_PREFIX):]
    label = (node.get("Labels") or {}).get(ACCEL_LABEL)
    if label:
        return str(label)
    for k in sorted(res):
        if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith(
                "node:") and res[k] > 0 and _catalog_gpu(k):
            return k
    return None


def node_gpus(node: dict[str, Any]) -> int:
    res = node.get("Resources") or {}
    if res.get("GPU"):
        return int(res["GPU"])
    t = node_gpu_type(node)
    if t is not None and not (node.get("Labels") or {}).get(ACCEL_LABEL) and t in res and \
            not any(k.startswith(ACCEL_PREFIX) for k in res):
        return int(res[t])  # a custom resource counts the GPUs of its type
    return 0


def _names(nodes: list[dict[str, Any]]) -> list[str]:
    base = []
    for n in nodes:
        label = (n.get("Labels") or {}).get(NAME_LABEL)
        raw = str(label or n.get("NodeManagerHostname") or n.get("NodeName") or "ray-node")
        base.append(_SAFE.sub("-", raw).strip("-.") or "ray-node")
    counts: dict[str, int] = {}
    for b in base:
        counts[b] = counts.get(b, 0) + 1
    return [b if counts[b] == 1 else f"{b}-{str(n.get('NodeID', ''))[:8]}"
            for b, n in zip(base, nodes, strict=True)]


def describe_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per alive node: name, gpu_type (raw), gpus, cpus, memory_gib, address, node_id."""
    alive = sorted((n for n in nodes if n.get("Alive", True)), key=lambda n: str(n.get("NodeID")))
    out = []
    for name, n in zip(_names(alive), alive, strict=True):
        res = n.get("Resources") or {}
        out.append({"name": name, "gpu_type": node_gpu_type(n), "gpus": node_gpus(n),
                    "cpus": int(res.get("CPU", 0)),
                    "memory_gib": round(float(res.get("memory", 0)) / 2**30, 2),
                    "address": n.get("NodeManagerAddress"), "node_id": n.get("NodeID")})
    return out


def node_ids(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> the node's description (with ``node_id`` and ``address``)."""
    return {d["name"]: d for d in describe_nodes(nodes)}


def import_ray(address: str) -> Imported:
    """The nodes of the Ray cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://...``),
    and a note for each node Ray lists but has lost.

    Connects (and disconnects) unless this process is already connected, with Ray's token
    authentication where this machine has the cluster's token
    (:func:`~apportion.ray_home.use_token_auth`). A missing ``ray`` package, nothing
    answering, a refused token and a failed connection are each an
    :class:`~apportion.errors.InputError` naming ``--ray-address`` and what is wrong.
    """
    try:
        import ray
    except ImportError:
        raise InputError("--from ray", "ray", "importing a Ray cluster needs the 'ray' "
                         "package: pip install 'apportion[ray]'") from None
    connected_here = False
    if not ray.is_initialized():
        use_token_auth()
        probe(address)
        check_auth(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ...
            ray.shutdown()
            raise InputError("--ray-address", "ray_address", f"cannot reach a Ray cluster at "
                             f"{address!r}: {type(exc).__name__}: {exc}") from None
        connected_here = True
    try:
        records = ray.nodes()
    finally:
        if connected_here:
            ray.shutdown()
    out = Imported([{k: v for k, v in d.items() if k != "node_id"}
                    for d in describe_nodes(records)])
    for n in records:
        if not n.get("Alive", True):
            out.leave_out(str(n.get("NodeManagerHostname") or n.get("NodeID") or "?"),
                          "not alive (Ray lost this node)")
    for d in out.nodes:
        if not d["gpus"]:
            out.leave_out(d["name"], "no GPUs")
    out.nodes = [d for d in out.nodes if d["gpus"]]
    return out
