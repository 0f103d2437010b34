"""Admission, written once: which jobs may enter this round at all.

The first stage of every round (``apportion.round``). A job is refused
before any candidate is built when it can never be planned on this cluster
as submitted: its model or GPU type is not in the catalog, or it asks for
more GPUs than the cluster has. Each refusal is a typed
:class:`~apportion.decision.Pending` naming the stage (``admit``) and saying
the job can never fit (Kubernetes' UnschedulableAndUnresolvable), so
operators see why and simulators never wait on it.

Admission also reconciles running jobs with the cluster the round sees: a
job said to run on a node that is gone (a node fault removed it from the
effective cluster) or on a GPU type the cluster lacks no longer runs; it is
admitted as a queued job that resumes from its checkpoint.

Memory fit and deadlines need estimates; they are the candidates stage's
reasons (``no-fit-memory``, ``deadline-unmeetable``), not admission's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from apportion.cluster import Cluster
from apportion.decision import Pending, Reason
from apportion.errors import CatalogError
from apportion.gpus import canonical_gpu_name
from apportion.jobs import JobSpec
from apportion.models import catalog_model, get_model


@dataclass
class Admission:
    admitted: list[JobSpec]
    refused: list[Pending] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # ran on nodes the cluster no longer has


def catalog_problem(job: JobSpec, rated: Callable[[JobSpec], bool] | None = None) -> str | None:
    """Why ``job`` cannot be planned from the catalog (None: it can).

    ``rated``: whether the round's rate source rates the job. A model the catalog lacks is
    no problem where it does (an operator's measured-only model, with ``--estimator
    tables`` rows for it): the round schedules it from its rates, its DP plan, as the
    baselines do (:func:`apportion.models.catalog_model`)."""
    try:
        if job.requested_gpu_type:
            canonical_gpu_name(job.requested_gpu_type)
        if catalog_model(job.model) is None and not (rated is not None and rated(job)):
            get_model(job.model)  # raises, naming the catalog's models
    except CatalogError as exc:
        return str(exc)
    return None


def _runs_on(job: JobSpec, cluster: Cluster) -> bool:
    r = job.running
    assert r is not None
    if r.gpu_type not in cluster.capacity_by_type():
        return False
    return all(n in cluster.nodes and cluster.nodes[n].gpu_type == r.gpu_type
               and cluster.nodes[n].gpus >= k for n, k in r.placement.items())


def admit(cluster: Cluster, jobs: list[JobSpec], catalog: bool = True,
          rated: Callable[[JobSpec], bool] | None = None) -> Admission:
    """Split ``jobs`` into those the round plans and typed refusals (stage ``admit``).

    ``catalog=False`` where rates come from measurements keyed by the trace's own job
    types (a replay of a trace whose models are not catalog names); ``rated`` admits a
    model the catalog lacks where the round's rate source rates it (see
    :func:`catalog_problem`)."""
    total = cluster.total_gpus
    out = Admission([])
    for job in jobs:
        problem = catalog_problem(job, rated) if catalog else None
        if problem is not None:
            out.refused.append(Pending(job.id, Reason.CATALOG, problem, stage="admit",
                                       can_ever_fit=False))
            continue
        if job.requested_gpus > total:
            out.refused.append(Pending(
                job.id, Reason.TOO_LARGE, f"asks for {job.requested_gpus} GPUs; the cluster has "
                f"{total}", stage="admit", can_ever_fit=False))
            continue
        if job.running is not None and not _runs_on(job, cluster):
            job = dataclasses.replace(job, running=None)
            out.requeued.append(job.id)
        out.admitted.append(job)
    return out
