"""The GPU counts a job is offered on one GPU type: its request's fractions and its elastic
scale-up, one rule for the cells and the plans formulations.

A job is as elastic as it says (DESIGN.md). Every job keeps the counts its request gave it
before elasticity (the formulation's fractions of the request: ``N/2, N, 2N`` for cells,
within the cluster and a ``max_gpus`` it sets); an elastic job (``JobSpec.elastic``, the default) is also offered the powers of two above
them, and its own limit, up to the most GPUs it may be given (:func:`count_limit`). Each
of those is kept only while its rate model still gains: a count must be at least
``1 + min_gain`` times as fast as the fastest smaller count kept (:func:`grow`), and the
ladder stops at the first that is not (a larger count that is not faster is dominated: the
same work for more GPUs). A job that must keep its size (``elastic: false``) is offered its
request alone.

Why powers of two and a stop: a job of 4 GPUs on 256 GPUs would otherwise have 63 sizes
on each type; doubling reaches any useful width in ``log2`` steps, each a real choice (a
data-parallel job's speed-up per doubling shrinks), and the stop leaves out every size
past the knee of the job's own curve. Growing and shrinking are priced by the restart the
objective already charges (:mod:`apportion.formulations.objectives`); a round whose jobs
ask for more GPUs than the cluster has offers no job more than its request
(:func:`apportion.formulations.candidates.trim_scale_up`).

The most GPUs any job is ever given on a type is :func:`most_gpus` (a lower bound on the
average JCT may let a job take any count up to it, and no more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from apportion.jobs import JobSpec

#: the fewest samples of the global batch each data-parallel GPU must get
MIN_SAMPLES_PER_GPU = 1
#: a larger count is kept only where it is this much faster than the fastest smaller one
MIN_GAIN = 0.1


def count_limit(job: JobSpec, capacity: int) -> int:
    """The most GPUs ``job`` may be given on a GPU type with ``capacity`` GPUs (0: none).

    Its request when it is not elastic; else the smallest of the type's capacity, the
    ``max_gpus`` the job sets and its global batch over :data:`MIN_SAMPLES_PER_GPU` (one
    sample per data-parallel GPU). A batch smaller than the request bounds nothing: the
    request already gives a GPU less than a sample, so the batch is not the job's
    data-parallel width (its plan is tensor- or pipeline-parallel, or the trace gives no
    batch: Gavel's jobs carry 1). The request itself always stands (within the capacity).
    """
    n = job.requested_gpus
    if not job.elastic:
        return n if n <= capacity else 0
    limit = capacity
    if job.max_gpus is not None:
        limit = min(limit, job.max_gpus)
    if job.global_batch_size >= n:
        limit = min(limit, job.global_batch_size // MIN_SAMPLES_PER_GPU)
    return max(limit, min(n, capacity))


def base_counts(n: int, scales: Iterable[float], limit: int) -> list[int]:
    """The request's fractions ``int(n * s)`` within ``[1, limit]``, sorted."""
    return sorted({g for s in scales if 1 <= (g := int(n * s)) <= limit})


def ladder(job: JobSpec, scales: Iterable[float], capacity: int
           ) -> tuple[list[int], list[int]]:
    """The counts ``job`` is offered on a type of ``capacity`` GPUs before any is estimated:
    ``(base, scale_up)``. ``base``: the request's ``scales`` within the capacity and the
    job's ``max_gpus`` (the counts every job had before elasticity; its request alone when
    it is not elastic); ``scale_up``: the powers of two above them and the job's limit
    (:func:`count_limit`), ascending, for :func:`grow` to keep while they gain."""
    if not job.elastic:
        return ([job.requested_gpus] if job.requested_gpus <= capacity else []), []
    base = base_counts(job.requested_gpus, scales, base_cap(job, capacity))
    return base, scale_ups(job, max(base, default=0), capacity)


def base_cap(job: JobSpec, capacity: int) -> int:
    """The most GPUs a job's base counts may take on a type of ``capacity`` GPUs: the
    capacity, and the ``max_gpus`` it sets (never below its request)."""
    return capacity if job.max_gpus is None else min(capacity, max(job.max_gpus,
                                                                   job.requested_gpus))


def scale_ups(job: JobSpec, top: int, capacity: int) -> list[int]:
    """An elastic job's scale-up counts above its base counts' largest ``top``: the powers
    of two and its limit (:func:`count_limit`), ascending (none for a job that is not
    elastic)."""
    if not job.elastic:
        return []
    limit = count_limit(job, capacity)
    ups, g = [], 1
    while g <= limit:
        if g > top:
            ups.append(g)
        g *= 2
    if limit > top and (not ups or ups[-1] != limit):
        ups.append(limit)
    return ups


def most_gpus(job: JobSpec, scales: Iterable[float], capacity: int) -> int:
    """The most GPUs any formulation using :func:`ladder` can give ``job`` on a type of
    ``capacity`` GPUs (its largest base or scale-up count; 0: none): what a lower bound on
    the average JCT may let it take, and no more."""
    base, ups = ladder(job, scales, capacity)
    return max(base + ups, default=0)


def grow(ups: list[int], best: float, rate: Callable[[int], float],
         min_gain: float = MIN_GAIN) -> list[int]:
    """The scale-up counts of ``ups`` (ascending) worth offering: each at least ``1 +
    min_gain`` times as fast as the fastest count below it (``best`` to start: the base
    counts' fastest), stopping at the first that is not. ``rate(g)``: the job's best
    estimated speed on ``g`` GPUs (0 where no cell of that size fits or runs)."""
    kept = []
    for g in ups:
        r = rate(g)
        if not r > best * (1.0 + min_gain):
            break
        kept.append(g)
        best = r
    return kept


__all__ = ["MIN_GAIN", "MIN_SAMPLES_PER_GPU", "base_cap", "base_counts", "count_limit", "grow",
           "ladder", "most_gpus", "scale_ups"]
