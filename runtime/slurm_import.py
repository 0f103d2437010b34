"""The nodes of a Slurm cluster, read from ``scontrol show node -o``.

One dict per node in the shape every importer returns (see
``runtime.cluster_import``): ``name`` (the Slurm node name, which decisions and
``--nodelist`` use), ``gpu_type`` (the raw GRES type, ``a40``), ``gpus``,
``cpus`` (``CPUEfctv``, else ``CPUTot``), ``memory_gib`` (``RealMemory``) and
the extras ``slurm_partitions`` and ``slurm_features``, which the node group
keeps as labels.

Nodes without GPUs are left out (login and CPU nodes). Nodes Slurm will not
run jobs on (``DOWN``, ``DRAIN``, ``FAIL``, ``NOT_RESPONDING``, ``FUTURE``,
``INVAL``, ``POWERED_DOWN``...) are left out too unless asked, since the
scheduler would otherwise plan on capacity Slurm never grants; both are logged.
A node carrying two GPU types cannot be one node of the cluster model (one GPU
type per node), which is an error naming the node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from apportion.runtime.slurm_commands import parse_gres, parse_records, run

from apportion.errors import InputError

log = logging.getLogger(__name__)

UNAVAILABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "INVAL", "POWERED_DOWN",
               "POWERING_DOWN", "MAINT", "REBOOT_ISSUED", "UNKNOWN")


def scontrol_nodes(env: Mapping[str, str] | None = None) -> str:
    """The cluster's ``scontrol show node -o`` text (``--future`` nodes included, then skipped)."""
    return run(["scontrol", "show", "node", "-o"], env=env)


def nodes_from_scontrol(text: str, source: str = "scontrol show node -o",
                        include_unavailable: bool = False) -> list[dict[str, Any]]:
    """Parse ``scontrol show node`` output into importer node dicts (see the module doc)."""
    nodes: list[dict[str, Any]] = []
    skipped: dict[str, list[str]] = {"without GPUs": [], "unavailable": []}
    for rec in parse_records(text):
        name = rec.get("NodeName")
        if not name:
            continue
        try:
            gpus = [g for g in parse_gres(rec.get("Gres", "")) if g.name == "gpu"]
        except ValueError as exc:
            raise InputError(source, f"{name}.Gres", str(exc)) from None
        if not gpus or sum(g.count for g in gpus) == 0:
            skipped["without GPUs"].append(name)
            continue
        types = sorted({g.type or "gpu" for g in gpus})
        if len(types) > 1:
            raise InputError(source, f"{name}.Gres", f"node carries GPUs of several types "
                             f"({', '.join(types)}); apportion models one GPU type per node, so "
                             "split it in Slurm or leave it out of the cluster file")
        state = rec.get("State", "")
        flags = set(state.upper().replace("*", "+NOT_RESPONDING").replace("~", "+POWERED_DOWN")
                    .split("+"))
        if not include_unavailable and flags & set(UNAVAILABLE):
            skipped["unavailable"].append(f"{name} ({state})")
            continue
        cpus = _int(rec.get("CPUEfctv") or rec.get("CPUTot"), source, f"{name}.CPUTot")
        mem_mib = _int(rec.get("RealMemory"), source, f"{name}.RealMemory")
        node: dict[str, Any] = {"name": name, "gpu_type": types[0],
                                "gpus": sum(g.count for g in gpus), "cpus": cpus,
                                "memory_gib": round(mem_mib / 1024, 3) if mem_mib else None}
        parts = rec.get("Partitions", "")
        if parts and parts != "(null)":
            node["slurm_partitions"] = parts
        feats = rec.get("ActiveFeatures", "")
        if feats and feats != "(null)":
            node["slurm_features"] = feats
        nodes.append(node)
    for why, names in skipped.items():
        if names:
            log.warning("left out %d Slurm node(s) %s: %s", len(names), why, ", ".join(names))
    return nodes


def import_slurm(text: str | None = None, env: Mapping[str, str] | None = None,
                 include_unavailable: bool = False, source: str | None = None
                 ) -> list[dict[str, Any]]:
    """The nodes of the Slurm cluster ``scontrol`` reaches (or of saved ``text``)."""
    if text is None:
        from apportion.runtime.slurm_commands import SlurmError

        try:
            text = scontrol_nodes(env)
        except SlurmError as exc:
            raise InputError("--from slurm", "scontrol", str(exc)) from None
    return nodes_from_scontrol(text, source or "scontrol show node -o", include_unavailable)


def _int(text: str | None, source: str, field: str) -> int | None:
    if text is None or text in ("", "N/A", "(null)"):
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(source, field, f"not an integer: {text!r}") from None
