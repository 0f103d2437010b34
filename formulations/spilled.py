"""Spilled cells (Hydra): a job whose model fits no GPU of the cluster is trained shard by
shard on one GPU, its shards' parameters and optimizer state moved between host and device.

The candidate builder calls :func:`spilled_candidates` for a job none of whose
cells fits (it would be pending ``no-fit-memory``): one cell per GPU type, one
GPU, one stage, whose plan is spilled (``ExecutionPlan.spill_shards``) and
whose time is the spilled estimate (``estimation.models.spill``: the round's
estimator's compute with recomputation, plus every shard's host<->device copies
per iteration at the host link's bandwidth, less what double buffering hides).
Spilled cells are offered only where nothing else fits, so a job that fits
normally never gets one in place of a better cell; once offered they are
cells like any other, valued by the round's one objective.

Why one GPU and not data parallel: the spilled trainer steps each shard's
optimizer inside its backward unit, with no gradient all-reduce between
replicas, and Hydra's own hybrid of spilling with data parallelism is left to
future work in its paper (section 7). Why the GPU's share of its node's host
memory bounds a spilled cell: the cells formulation has no host-memory rows, and
every allocation is given its GPUs' share of their node (``assembly.node_share``,
which the validator sums); a spilled job holds its whole model's weights and
optimizer state there.

:func:`fits_device` is the other half of the same idea for every cell: where a
node group says a job may use less device memory than the catalog's GPU has
(``NodeGroup.gpu_memory_gib``), a cell that needs more is no cell; and a cell whose
plan the validator's own ledger (:mod:`apportion.plan_memory`, a lower bound on each
GPU's bytes) finds larger than the GPU is no cell either, whatever its estimator says
(a rate source that only knows the job runs there lends the cell an inner model's plan,
which must still fit).
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx
from apportion.estimation.base import Estimate
from apportion.estimation.models.spill import (
    RESERVE_GIB,
    USABLE_FRACTION,
    device_budget,
    host_share_bytes,
    spilled_on,
)

from apportion.cluster import Cluster
from apportion.jobs import JobSpec
from apportion.models import catalog_model
from apportion.plan_memory import fits_memory, type_memory_bytes
from apportion.plans import Cell

# device_budget, host_share_bytes and the analytic defaults lived here before the rate
# sources needed them (apportion.estimation.models.spill): re-exported for compatibility
__all__ = ["RESERVE_GIB", "USABLE_FRACTION", "device_budget", "fits_device", "host_share_bytes",
           "spilled_candidates", "spilled_cells"]


def fits_device(cluster: Cluster, gpu_type: str, est: Estimate, job: JobSpec | None = None
                ) -> bool:
    """Whether a cell's memory per GPU fits what the cluster lets a job use on that type:
    its estimate, and (given the ``job``) its plan by the validator's ledger."""
    said = cluster.gpu_memory_bytes(gpu_type)
    if said is not None and est.mem_per_gpu > said:
        return False
    return job is None or fits_memory(job, est.plan, type_memory_bytes(cluster, gpu_type))


def spilled_cells(job: JobSpec, cluster: Cluster, estimator: Any
                  ) -> tuple[list[tuple[Cell, Estimate]], list[str]]:
    """One spilled cell per GPU type where the model can be cut and its host state fits
    (:func:`~apportion.estimation.models.spill.spilled_on`), and why each other type has
    none."""
    cells: list[tuple[Cell, Estimate]] = []
    why: list[str] = []
    if catalog_model(job.model) is None:  # cut by its layers: a catalog model only
        return cells, [f"{job.model!r} is not a catalog model (spilling cuts its layers)"]
    for gpu_type in sorted(cluster.capacity_by_type()):
        e, no = spilled_on(job, cluster, gpu_type, estimator)
        if e is not None:
            cells.append((Cell(job.id, gpu_type, 1, 1), e))
        elif no is not None:
            why.append(no)
    return cells, why


def spilled_candidates(g: nx.DiGraph, job_vertex: str, job: JobSpec, cluster: Cluster,
                       estimator: Any) -> list[tuple[Cell, Estimate]]:
    """The spilled cells of a job no cell fits; where there are none, the job vertex's
    ``reason_detail`` says why (it stays pending ``no-fit-memory``)."""
    cells, why = spilled_cells(job, cluster, estimator)
    if not cells and why:  # (no reason: it fits whole, and its cells lack a time instead)
        g.nodes[job_vertex]["reason_detail"] = (
            "no cell of any GPU type fits its memory, and it cannot be spilled: " +
            ("; ".join(why) if why else "no GPU type here"))
    return [(c, e) for c, e in cells if math.isfinite(e.iter_time_s)]
