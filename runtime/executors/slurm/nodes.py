"""What each Slurm node really offers, and batch requests that never ask for more.

A cluster file is written by hand or imported once; Slurm's controller decides
what a batch job may ask of a node, and ``sbatch`` refuses at submission, for
good, a job asking more memory than a node's ``RealMemory`` (less
``MemSpecLimit``), more CPUs than it has, or more GPUs than its ``Gres``. A
cluster file saying ``host_memory_gib: 8`` for nodes whose RealMemory is 8000
(Slurm's MB are MiB: 8000 MiB is less than 8 GiB) made every whole-node
launch fail, every round. So the Slurm executor reads each node's figures
from ``scontrol show node`` (:func:`limits_from_records`), caps each request
at the GPUs' share of them (:func:`cap_requests`), and says where the cluster
file disagrees (:func:`disagreements`), since the rounds plan on the file.

GPUs are never capped: an allocation's GPU count is the decision itself, so a
placement asking more GPUs than a node has is left for sbatch to refuse with
its own reason, which the run records as that launch's failure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from apportion.runtime.executors.slurm.commands import parse_gres

from apportion.cluster import Cluster

# Of a node's schedulable memory, the share no request takes. RealMemory is often the
# physical total (what ``slurmd -C`` prints) where MemSpecLimit is unset, and a job that is
# given all of it under a cgroup limit leaves the node's own daemons nothing.
MEMORY_HEADROOM = 0.02
MEMORY_TOLERANCE = 0.01  # a cluster file within 1 % of RealMemory agrees (imports round GiB)


@dataclass(frozen=True)
class NodeLimits:
    """What Slurm lets one job ask of one node (``None``: Slurm did not say)."""

    name: str
    cpus: int | None  # CPUEfctv (CPUs jobs may use, specialised cores excluded), else CPUTot
    memory_mib: int | None  # RealMemory less MemSpecLimit
    gpus: int | None  # the node's GPU GRES count

    @classmethod
    def from_record(cls, rec: Mapping[str, str]) -> NodeLimits:
        cpus = _int(rec.get("CPUEfctv")) or _int(rec.get("CPUTot"))
        mem = _int(rec.get("RealMemory"))
        if mem is not None:
            mem -= _int(rec.get("MemSpecLimit")) or 0
        try:
            gpus: int | None = sum(g.count for g in parse_gres(rec.get("Gres", ""))
                                   if g.name == "gpu")
        except ValueError:
            gpus = None
        return cls(rec.get("NodeName", ""), cpus, mem if mem and mem > 0 else None, gpus)


def limits_from_records(records: Iterable[Mapping[str, str]]) -> dict[str, NodeLimits]:
    """Per node name, from ``scontrol show node -o`` records (:func:`parse_records`)."""
    return {r["NodeName"]: NodeLimits.from_record(r) for r in records if r.get("NodeName")}


def cap_requests(requests: Mapping[str, tuple[int, int | None]], placement: Mapping[str, int],
                 limits: Mapping[str, NodeLimits], headroom: float = MEMORY_HEADROOM
                 ) -> dict[str, tuple[int, int | None]]:
    """Each node's (CPUs, memory MiB) request, at most the share of the node's CPUs and
    memory (less ``headroom``) that the job's GPUs there are of the node's GPUs. Nodes Slurm
    said nothing about keep their request."""
    out: dict[str, tuple[int, int | None]] = {}
    for node, (cpus, mem) in requests.items():
        lim = limits.get(node)
        if lim is None:
            out[node] = (cpus, mem)
            continue
        k = int(placement.get(node, 0))
        share = min(1.0, k / lim.gpus) if lim.gpus else 1.0
        if lim.cpus:
            cpus = min(cpus, max(1, math.floor(lim.cpus * share)))
        if mem is not None and lim.memory_mib:
            mem = min(mem, max(1, math.floor(lim.memory_mib * (1.0 - headroom) * share)))
        out[node] = (cpus, mem)
    return out


def disagreements(cluster: Cluster, limits: Mapping[str, NodeLimits]) -> list[str]:
    """One line per node of ``cluster`` whose cluster-file figures are not Slurm's."""
    out = []
    for name, node in sorted(cluster.nodes.items()):
        lim = limits.get(name)
        if lim is None:
            out.append(f"node {name} of the cluster file is not a node of this Slurm cluster: "
                       "sbatch refuses every launch placed there")
            continue
        said = []
        if lim.memory_mib and abs(node.host_memory_gib * 1024 - lim.memory_mib) > \
                MEMORY_TOLERANCE * lim.memory_mib:
            said.append(f"host_memory_gib {node.host_memory_gib:g} "
                        f"({node.host_memory_gib * 1024:.0f} MiB) where Slurm's RealMemory "
                        f"gives {lim.memory_mib} MiB")
        if lim.cpus and node.cpus != lim.cpus:
            said.append(f"cpus_per_node {node.cpus} where Slurm has {lim.cpus} CPUs")
        if lim.gpus is not None and node.gpus != lim.gpus:
            said.append(f"{node.gpus} GPUs where Slurm's Gres has {lim.gpus} GPUs")
        if said:
            out.append(f"node {name}: the cluster file says " + "; ".join(said))
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "", "N/A", "(null)") else None
    except ValueError:
        return None
