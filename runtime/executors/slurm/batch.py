"""One allocation as one Slurm batch job: the components, the script, the launch file.

An allocation places ``k_n`` GPUs of one type on each chosen node ``n``.
Slurm's ``--gres=gpu:<type>:<count>`` is *per node* for the whole job, so a
job asking different counts on different nodes cannot be one ordinary
allocation. Slurm 22.05 expresses it as a **heterogeneous job**: components separated by
``#SBATCH hetjob`` in the batch script (:mod:`.slurm_submit` writes it), each
with its own ``--nodelist``, ``--nodes``, ``--gres`` (and CPUs and memory),
and one ``srun --het-group=0-K`` step in the script spans every component.
Nodes asking the same thing share one component, so a uniform placement
(the common case) is an ordinary single-component job. Heterogeneous jobs
are started by the backfill scheduler only (``SchedulerType=sched/backfill``,
Slurm's default).

The step runs one task per node, ``python -m apportion.runtime.executors.slurm.task
LAUNCH.json`` (see that module), which starts the node's ranks with the
workload contract. Everything a launch needs is written into the job's
folder (``<workdir>/<job_dirname(id)>``), which must be on storage every
node sees (it also holds the checkpoints): ``slurm-launch-<L>.json`` and
``slurm-<L>.sh`` (every option as ``#SBATCH`` lines; ``sbatch --parsable``
submits it); Slurm writes the batch output to ``slurm-<jobid>.out``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.decision import Allocation

JOB_NAME_PREFIX = "apportion-"


@dataclass(frozen=True)
class Component:
    """Nodes that ask for the same resources: one component of the job."""

    nodes: tuple[str, ...]
    gres: str  # gpu:a40:2 (per node)
    cpus: int  # per node (one task per node)
    mem_mib: int | None  # per node

    def options(self) -> list[str]:
        opts = [f"--nodes={len(self.nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(self.nodes)}", f"--gres={self.gres}",
                f"--cpus-per-task={self.cpus}"]
        if self.mem_mib:
            opts.append(f"--mem={self.mem_mib}M")
        return opts


def gres_for(gpu_type_raw: str | None, count: int) -> str:
    """``gpu:<type>:<n>``; an untyped GPU (no type in gres.conf) is ``gpu:<n>``."""
    return f"gpu:{gpu_type_raw}:{count}" if gpu_type_raw else f"gpu:{count}"


def rank_layout(placement: Mapping[str, int]) -> list[dict[str, Any]]:
    """Nodes in a fixed order (by name) with their global ranks, contiguous per node.

    Rank 0 is on the first node, whose address becomes ``MASTER_ADDR``.
    """
    out, r = [], 0
    for node in sorted(placement):
        k = int(placement[node])
        out.append({"name": node, "ranks": list(range(r, r + k))})
        r += k
    return out


def node_requests(alloc: Allocation, node_cpus: Mapping[str, int] | None = None,
                  node_mem_gib: Mapping[str, float] | None = None, node_gpus: Mapping[str, int]
                  | None = None, request_memory: bool = True
                  ) -> dict[str, tuple[int, int | None]]:
    """CPUs and memory (MiB) per node: the GPUs' share of each node, as the round computes
    them (``apportion.round``), or the allocation's totals split by GPU count."""
    out = {}
    for node, k in alloc.placement.items():
        if node_cpus and node_gpus and node in node_cpus and node_gpus.get(node):
            cpus = node_cpus[node] * k // node_gpus[node]
            mem = node_mem_gib[node] * k / node_gpus[node] if node_mem_gib else 0.0
        else:
            share = k / max(1, alloc.gpus)
            cpus = math.floor(alloc.cpus * share)
            mem = alloc.host_memory_gib * share
        out[node] = (max(1, int(cpus)), int(mem * 1024) if request_memory and mem > 0 else None)
    return out


def components(placement: Mapping[str, int], gres_type: Mapping[str, str | None],
               requests: Mapping[str, tuple[int, int | None]]) -> list[Component]:
    """The job's components: nodes grouped by what they ask (GRES, CPUs, memory)."""
    groups: dict[tuple[str, int, int | None], list[str]] = {}
    for node in sorted(placement):
        cpus, mem = requests.get(node, (1, None))
        key = (gres_for(gres_type.get(node), int(placement[node])), cpus, mem)
        groups.setdefault(key, []).append(node)
    return [Component(tuple(nodes), g, c, m) for (g, c, m), nodes in groups.items()]


def common_options(job_name: str, jobdir: Path, partition: str | None,
                   extra: Sequence[str] = ()) -> list[str]:
    opts = [f"--job-name={job_name}", f"--chdir={jobdir}",
            f"--output={jobdir / 'slurm-%j.out'}", "--open-mode=append", "--no-requeue"]
    if partition:
        opts.append(f"--partition={partition}")
    return opts + list(extra)
