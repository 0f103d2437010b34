"""Ground truth of Pollux's setting: progress per second is throughput times statistical
efficiency, at the job's batch and its current progress.

Pollux's simulator (OSDI'21; ``experiments/pollux_reference/README.md`` lists its rules)
counts a job's progress in samples of its application's smallest validated batch ``M0``
(:mod:`apportion.estimation.goodput`): a step at global batch ``M`` makes ``M * E(M)`` of
them, ``E`` the statistical efficiency from the gradient statistics logged at ``M`` for
the epoch the job is in. So the rate of a job on an allocation is

    samples of M0 per second = M * E(M) / (step seconds, accumulation included)

with the step time :class:`~apportion.estimation.goodput.throughput.PlacementTable` reads
from Pollux's measurements (its placement table by GPUs per node and per-GPU batch, else
its 3-D interpolation), and ``M`` split over the GPUs by Pollux's fixed-batch rule
(:func:`~apportion.estimation.goodput.split_batch`). A job's work (its trace's
``iterations``) is the progress at the end of its application's last epoch
(:func:`~apportion.estimation.goodput.application_work`).

The efficiency changes at each epoch's end, so the rate depends on the job's progress:
:class:`PolluxTruth` says so (``by_progress``), and the simulator asks it with the job's
``progress`` every round and advances a job epoch by epoch within a round
(:meth:`PolluxTruth.next_change`). The batch is the allocation's where the policy chose
one (``batch=``; ``rates_batches``), else the job's own (the workload file's): the
baselines' setting, as Pollux's simulator runs Tiresias and Optimus. Asked without a
progress (a profile, the isolated time), the rate is the one at the start of training.

Only the GPU type Pollux measured on (T4) runs: any other rates 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from apportion.estimation.goodput import (
    POLLUX_LIMITS,
    AppMeasurements,
    GradientNoise,
    PlacementTable,
    application_work,
    read_application,
    split_batch,
    statistical_efficiency,
)
from apportion.estimation.goodput.measurements import pollux_root

from apportion.errors import InputError
from apportion.gpus import canonical_gpu_name

#: the GPU type Pollux's measurements come from (its testbed: nodes of 4 NVIDIA T4)
POLLUX_GPU = "T4"


@dataclass(frozen=True)
class PolluxApp:
    """One application as the truth reads it."""

    name: str
    init_batch: int               # M0: progress is counted in its samples
    max_batch: int                # the largest validated batch
    local_range: tuple[int, int]  # the per-GPU batch range (yolov3's capped at 8)
    noise: GradientNoise
    table: PlacementTable
    work: float                   # samples of M0 to finish

    @classmethod
    def of(cls, app: AppMeasurements) -> PolluxApp:
        noise = GradientNoise(app.gradients)
        return cls(app.name, app.init_batch, app.max_batch, app.local_batch_range, noise,
                   PlacementTable(app.placements, app.scalability),
                   application_work(app, noise))


_APPS: dict[tuple[str, str], PolluxApp] = {}


def pollux_app(name: str, root: Path | None = None) -> PolluxApp:
    """Application ``name`` read from Pollux's data folder (once per process)."""
    folder = root if root is not None else pollux_root()
    key = (str(folder), name)
    if key not in _APPS:
        _APPS[key] = PolluxApp.of(read_application(name, folder))
    return _APPS[key]


def application_of(job: Any) -> str:
    """The application a job trains: a name, or its trace's job type (a SimJob or a job
    view's)."""
    if isinstance(job, str):
        return job
    rec = getattr(job, "trace", None) or job
    return str(getattr(rec, "job_type", None) or getattr(rec, "model", ""))


class PolluxTruth:
    """Progress per second (samples of ``M0``) of Pollux's applications on T4s."""

    name = "pollux"
    by_progress = True  # the simulator asks with the job's progress, epoch by epoch
    rates_batches = True  # an allocation's own batch is rated at that batch

    def __init__(self, root: Path | None = None, gpus_per_node: int = 4) -> None:
        self.root = root
        self.gpus_per_node = gpus_per_node
        self.interpolated: set[tuple[Any, ...]] = set()
        self._steps: dict[tuple[str, tuple[int, ...], int], tuple[float, float]] = {}
        self._best_eff: dict[tuple[str, int], float] = {}
        self.source = str(root if root is not None else pollux_root())

    @classmethod
    def for_cluster(cls, cluster: Any) -> PolluxTruth:
        """The truth on ``cluster``: a job's GPUs fill nodes of the cluster's T4 nodes' size
        where no placement is given (4, Pollux's)."""
        per = 4
        if cluster is not None and POLLUX_GPU in getattr(cluster, "gpu_types", ()):
            per = int(cluster.max_gpus_per_node(POLLUX_GPU))
        return cls(gpus_per_node=per)

    def app(self, job: Any) -> PolluxApp:
        name = application_of(job)
        if name not in POLLUX_LIMITS:
            raise KeyError(f"{name!r} is not one of Pollux's applications "
                           f"({', '.join(POLLUX_LIMITS)})")
        return pollux_app(name, self.root)

    def knows(self, job: Any) -> bool:
        return application_of(job) in POLLUX_LIMITS

    # -- the rate ------------------------------------------------------------------------
    def placement_of(self, gpus: int, placement: Mapping[str, int] | None) -> tuple[int, ...]:
        """GPUs per node, in the placement's node order; the fewest full nodes without one."""
        if placement:
            return tuple(int(k) for k in placement.values() if k > 0)
        full, rest = divmod(int(gpus), self.gpus_per_node)
        return (self.gpus_per_node,) * full + ((rest,) if rest else ())

    def split(self, job: Any, gpus: int, batch: int | None = None) -> tuple[int, int, int]:
        """``(batch run, per-GPU batch, extra accumulation steps)`` of ``job`` at ``batch``
        (its own where None) on ``gpus`` GPUs (Pollux's fixed-batch rule)."""
        a = self.app(job)
        want = int(batch if batch is not None else max(1, getattr(job, "batch", 1)))
        local, accum = split_batch(want, gpus, a.local_range, a.init_batch, a.max_batch)
        return gpus * local * (accum + 1), local, accum

    def step(self, job: Any, shape: tuple[int, ...], local: int) -> tuple[float, float]:
        a = self.app(job)
        key = (a.name, shape, local)
        got = self._steps.get(key)
        if got is None:
            got = self._steps[key] = a.table.step(shape, local)
        return got

    def rate(self, job: Any, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None, *,
             progress: float | None = None, batch: int | None = None, **_: Any) -> float:
        """Samples of ``M0`` per second of ``job`` on ``gpus`` GPUs of ``gpu_type`` at its
        ``batch`` (its own where None), after ``progress`` samples (the start where None);
        0 where it cannot run (another GPU type, a per-GPU batch below the measured range,
        a placement nothing measured is near)."""
        if gpus <= 0 or not self.knows(job) or canonical_gpu_name(gpu_type) != POLLUX_GPU:
            return 0.0
        a = self.app(job)
        real, local, accum = self.split(job, gpus, batch)
        if local < a.local_range[0] or local <= 0:
            return 0.0
        st, sy = self.step(job, self.placement_of(gpus, placement), local)
        if not (math.isfinite(st) and math.isfinite(sy)) or st <= 0:
            return 0.0
        seconds = st + (st - sy) * accum
        done = 0.0 if progress is None else float(progress)
        sqr, var = a.noise.stats(done, real)
        eff = float(statistical_efficiency(real, a.init_batch, sqr, var))
        return real * eff / seconds

    def optimistic_rate(self, job: Any, gpu_type: str, gpus: int) -> float:
        """The fastest ``job`` could progress on ``gpus`` GPUs of ``gpu_type`` at any point
        of its training: its best epoch's efficiency and, where it lets the scheduler choose
        its batch (``batch_range``), its best batch (the validated ones and a geometric grid
        between), on the fewest nodes. What a lower bound on its time must assume
        (``experiments/optimistic_rates.py`` asks it where a truth offers it)."""
        if gpus <= 0 or not self.knows(job) or canonical_gpu_name(gpu_type) != POLLUX_GPU:
            return 0.0
        a = self.app(job)
        rng = getattr(getattr(job, "trace", None) or job, "batch_range", None)
        if rng is None:
            batches = [int(max(1, getattr(job, "batch", 1)))]
        else:
            lo, hi = int(rng[0]), int(rng[1])
            batches = sorted({int(round(float(b))) for b in np.geomspace(lo, hi, 48)}
                             | {int(b) for b in a.noise.batches if lo <= b <= hi} | {lo, hi})
        shape = self.placement_of(gpus, None)
        best = 0.0
        for b in batches:
            real, local, accum = self.split(job, gpus, b)
            if local < a.local_range[0] or local <= 0:
                continue
            st, sy = self.step(job, shape, local)
            if not (math.isfinite(st) and math.isfinite(sy)) or st <= 0:
                continue
            best = max(best, real * self._best_efficiency(a, real) / (st + (st - sy) * accum))
        return best

    def _best_efficiency(self, a: PolluxApp, batch: int) -> float:
        """The largest efficiency of ``batch`` over the epochs a job of ``a`` trains."""
        key = (a.name, int(batch))
        got = self._best_eff.get(key)
        if got is None:
            epochs = int(np.searchsorted(a.noise.epoch_ends, a.work, side="left")) + 1
            effs = [float(statistical_efficiency(batch, a.init_batch, *a.noise.stats(
                float(start), batch))) for start in
                np.concatenate([[0.0], a.noise.epoch_ends[:epochs - 1]])]
            got = self._best_eff[key] = max(effs)
        return got

    def next_change(self, job: Any, progress: float) -> float:
        """The progress where the rate next changes: the end of the epoch at ``progress``
        (the job's work once in its last)."""
        a = self.app(job)
        ends = a.noise.epoch_ends
        e = a.noise.epoch(float(progress))
        return float(min(ends[e], a.work)) if e < ends.size else a.work

    def grad_stats(self, job: Any, progress: float, batch: int | None = None
                   ) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` a job reports at ``progress``: those logged at the batch
        it runs (its own where None) for its current epoch (what Pollux's jobs measure),
        ``grad_var`` per sample as the workload contract reports it (Pollux's logs hold the
        variance of an ``M0``-sample gradient: times ``M0``)."""
        a = self.app(job)
        b = batch if batch is not None else max(1, getattr(job, "batch", 1))
        sqr, var = a.noise.stats(float(progress), min(max(b, a.init_batch), a.max_batch))
        return float(sqr), float(var) * a.init_batch

    def work(self, job: Any) -> float:
        return self.app(job).work

    def batch_limits(self, job: Any) -> tuple[int, int]:
        a = self.app(job)
        return a.init_batch, a.max_batch


def check_application(source: str, where: str, name: str) -> None:
    """A workload's application must be one Pollux measured (named in the refusal)."""
    if name not in POLLUX_LIMITS:
        raise InputError(source, where, f"application {name!r} is not one Pollux measured "
                         f"({', '.join(POLLUX_LIMITS)})")


__all__ = ["POLLUX_GPU", "PolluxApp", "PolluxTruth", "application_of", "check_application",
           "pollux_app"]
