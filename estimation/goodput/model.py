"""Goodput: throughput times statistical efficiency, at the batch that maximises it.

Pollux (OSDI'21) schedules by *goodput*: the samples per second a job processes on a
placement, times the statistical efficiency of the batch it trains with
(:mod:`~apportion.estimation.goodput.efficiency`), i.e. its progress per second counted in
samples of its initial batch ``M0``. More GPUs raise the throughput only if the global batch
grows with them, and a larger batch makes each sample count for less, so the batch is a
decision made with the placement: for ``K`` GPUs over ``N`` nodes this model tries global
batches from ``max(M0, K * min per-GPU batch)`` up to the largest validated one, each as
``K`` GPUs x per-GPU batch ``m`` x ``(s + 1)`` accumulation steps with the fewest steps that
keep ``m`` within the per-GPU range, and keeps the one of most goodput.

:class:`GoodputModel` is the estimator the formulation calls:
``goodput(job, gpus, nodes, progress) -> GoodputChoice(rate, batch, local_batch,
accumulation)``. Progress and rate are in samples of ``M0`` (Pollux's data counts progress
in steps of ``M0``: times ``M0`` gives samples), so ``remaining_work / rate`` is the time to
finish at that choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from apportion.estimation.base import ParamsMixin
from apportion.estimation.goodput.efficiency import GradientNoise, statistical_efficiency
from apportion.estimation.goodput.measurements import (
    AppMeasurements,
    read_application,
    read_applications,
)
from apportion.estimation.goodput.throughput import TableThroughput, ThroughputModel

THROUGHPUT_SOURCES = ("fitted", "table")
NOISE_SOURCES = ("batch", "initial")


class GoodputChoice(NamedTuple):
    """The best way to run a job on a placement; ``rate`` 0 (and the rest 0) when no batch
    fits (more GPUs than the largest batch can feed)."""

    rate: float          # progress per second, samples of M0
    batch: int           # global batch M = gpus * local_batch * (accumulation + 1)
    local_batch: int     # per-GPU batch of one step
    accumulation: int    # extra gradient-accumulation steps before each update


@dataclass(frozen=True)
class _App:
    limits_batch: tuple[int, int]  # (M0, largest validated batch)
    local_range: tuple[int, int]
    noise: GradientNoise
    throughput: ThroughputModel | TableThroughput
    work: float                    # samples of M0 to finish the job


def application_work(app: AppMeasurements, noise: GradientNoise | None = None) -> float:
    """Samples of ``M0`` a job of ``app`` makes in all: the progress at the end of its last
    epoch (``max_epochs``), where the slowest gradient log reaches it (Pollux's simulator
    ends a job there)."""
    noise = noise if noise is not None else GradientNoise(app.gradients)
    return float(noise.epoch_ends[app.limits.max_epochs - 1])


def split_batch(batch: int, gpus: int, local_range: tuple[int, int], init_batch: int,
                max_batch: int) -> tuple[int, int]:
    """``(per-GPU batch, extra accumulation steps)`` a fixed global ``batch`` runs as on
    ``gpus`` GPUs, by Pollux's simulator's rule for a job whose batch it does not choose
    (its ``update_local_bsz``, a fact of the replays held to its figures): the fewest
    accumulation steps that keep the per-GPU share within the per-GPU maximum, at least one
    on a single GPU past ``init_batch``, the per-GPU batch rounded up and capped so the
    global batch stays within ``max_batch``. The batch run is ``gpus * local * (accum + 1)``."""
    local = math.ceil(batch / gpus - 1e-8)
    accum = math.ceil(local / local_range[1] - 1e-8) - 1
    if gpus == 1 and batch > init_batch:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    return min(atomic, int(max_batch / (gpus * (accum + 1)))), accum


def job_application(job: Any) -> str:
    """The application a job trains: a name, or a job's ``application`` (else ``model``)."""
    if isinstance(job, str):
        return job
    return str(getattr(job, "application", None) or job.model)


class GoodputModel(ParamsMixin):
    """Pollux's goodput for each application of a data folder.

    Parameters:
      * ``throughput``: ``"fitted"`` (Pollux's seven-parameter model, least squares on the
        measured rows) or ``"table"`` (the measured rows interpolated, the fitted model where
        none was measured: what Pollux's simulator takes as the truth);
      * ``noise``: ``"batch"`` (each candidate batch's efficiency from the statistics logged
        at that batch: what training at it would see, the simulator's truth) or
        ``"initial"`` (one noise scale, the one logged at ``M0``, for every candidate: what a
        job reports before it has tried larger batches); statistics a job reports override
        both (``goodput(..., grad_stats=)``);
      * ``batch_points``: candidate global batches tried, spaced geometrically (the validated
        batches are always among them);
      * ``restarts``: starting points of each throughput fit.

    Fitted attributes: ``apps_`` (name -> its models and limits), ``fit_errors_`` (name ->
    the throughput fit's errors on its rows)."""

    def __init__(self, throughput: str = "fitted", noise: str = "batch", batch_points: int = 48,
                 restarts: int = 1) -> None:
        self.throughput = throughput
        self.noise = noise
        self.batch_points = batch_points
        self.restarts = restarts

    @classmethod
    def from_data(cls, root: Path | None = None, names: list[str] | None = None,
                  **params: Any) -> GoodputModel:
        """Fitted on Pollux's data folder (``$APPORTION_DATA/pollux`` by default)."""
        apps = (read_applications(root) if names is None
                else {n: read_application(n, root) for n in names})
        return cls(**params).fit(apps)

    def fit(self, apps: Mapping[str, AppMeasurements]) -> GoodputModel:
        if self.throughput not in THROUGHPUT_SOURCES:
            raise ValueError(f"throughput={self.throughput!r}: one of {THROUGHPUT_SOURCES}")
        if self.noise not in NOISE_SOURCES:
            raise ValueError(f"noise={self.noise!r}: one of {NOISE_SOURCES}")
        self.apps_: dict[str, _App] = {}
        self.fit_errors_: dict[str, dict[str, float]] = {}
        for name, app in apps.items():
            tp: ThroughputModel | TableThroughput
            if self.throughput == "table":
                tp = TableThroughput(self.restarts).fit(app.step_times)
                self.fit_errors_[name] = tp.model_.errors_
            else:
                tp = ThroughputModel(self.restarts).fit(app.step_times)
                self.fit_errors_[name] = tp.errors_
            noise = GradientNoise(app.gradients)
            self.apps_[name] = _App((app.init_batch, app.max_batch), app.local_batch_range,
                                    noise, tp, application_work(app, noise))
        return self

    # -- what the formulation asks ------------------------------------------------------

    def work(self, job: Any) -> float:
        """Samples of ``M0`` a job of this application makes in all (its epochs' progress)."""
        return self._app(job).work

    def max_gpus(self, job: Any) -> int:
        """The most GPUs any batch can feed: the largest batch over the smallest per-GPU one."""
        a = self._app(job)
        return a.limits_batch[1] // a.local_range[0]

    def throughput_at(self, job: Any, gpus: int, nodes: int, local_batch: Any,
                      accumulation: Any = 0) -> np.ndarray:
        """Samples per second at a per-GPU batch and accumulation (vectorised over both)."""
        _check_placement(gpus, nodes)
        return np.asarray(self._app(job).throughput.throughput(nodes, gpus, local_batch,
                                                               accumulation), dtype=float)

    def efficiency(self, job: Any, batch: Any, progress: float = 0.0,
                   grad_stats: tuple[float, float] | None = None) -> np.ndarray:
        """Statistical efficiency of global ``batch`` at ``progress`` (samples of ``M0``)."""
        a = self._app(job)
        if grad_stats is not None:
            return statistical_efficiency(batch, a.limits_batch[0], *grad_stats)
        at = None if self.noise == "batch" else a.limits_batch[0]
        return a.noise.efficiency(progress, batch, at=at)

    def candidates(self, job: Any, gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(batch, local_batch, accumulation)`` of every candidate on ``gpus`` GPUs (empty
        when none fits): the fewest accumulation steps that keep the per-GPU batch in range,
        the per-GPU batch rounded up, batches past the largest validated one dropped."""
        a = self._app(job)
        m0, top = a.limits_batch
        lo_local, hi_local = a.local_range
        low = max(m0, gpus * lo_local)
        if low > top:
            empty = np.zeros(0, dtype=int)
            return empty, empty, empty
        want = np.unique(np.concatenate([
            np.geomspace(low, top, max(2, self.batch_points)),
            [b for b in a.noise.batches if low <= b <= top], [low, top]]))
        per_gpu = want / gpus
        accum = np.maximum(np.ceil(per_gpu / hi_local - 1e-9), 1).astype(int) - 1
        local = np.maximum(np.ceil(per_gpu / (accum + 1) - 1e-9).astype(int), lo_local)
        batch = gpus * local * (accum + 1)
        ok = batch <= top
        # rounding up can step past the largest batch: the next smaller per-GPU batch then
        local = np.where(ok, local, np.floor(top / (gpus * (accum + 1))).astype(int))
        batch = gpus * local * (accum + 1)
        ok = (local >= lo_local) & (local <= hi_local) & (batch >= m0) & (batch <= top)
        uniq = {(int(b), int(m), int(s)) for b, m, s in zip(batch[ok], local[ok], accum[ok])}
        rows = np.array(sorted(uniq), dtype=int).reshape(-1, 3)
        return rows[:, 0], rows[:, 1], rows[:, 2]

    def goodput(self, job: Any, gpus: int, nodes: int, progress: float = 0.0,
                grad_stats: tuple[float, float] | None = None,
                batch: int | None = None) -> GoodputChoice:
        """The best (rate, batch, per-GPU batch, accumulation) for ``job`` on ``gpus`` GPUs
        over ``nodes`` nodes after ``progress`` samples of ``M0``. ``grad_stats``
        (``grad_sqr``, ``grad_var``) are statistics the job reported; ``batch`` fixes the
        global batch (a job that does not let it move: the fewest accumulation steps that
        fit it)."""
        _check_placement(gpus, nodes)
        if batch is not None:
            return self._fixed(job, gpus, nodes, progress, grad_stats, int(batch))
        b, m, s = self.candidates(job, gpus)
        if b.size == 0:
            return GoodputChoice(0.0, 0, 0, 0)
        rate = (self.throughput_at(job, gpus, nodes, m, s)
                * self.efficiency(job, b, progress, grad_stats))
        i = int(np.argmax(rate))
        return GoodputChoice(float(rate[i]), int(b[i]), int(m[i]), int(s[i]))

    def curve(self, job: Any, progress: float = 0.0, gpus_per_node: int = 4,
              limit: int | None = None) -> dict[int, GoodputChoice]:
        """The best choice at every GPU count from 1 to ``limit`` (default: the most any
        batch feeds), each on the fewest nodes of ``gpus_per_node`` that hold it: where
        goodput stops growing is where more GPUs stop paying (the elastic cells' top)."""
        top = self.max_gpus(job) if limit is None else min(limit, self.max_gpus(job))
        return {k: self.goodput(job, k, -(-k // gpus_per_node), progress)
                for k in range(1, top + 1)}

    def _fixed(self, job: Any, gpus: int, nodes: int, progress: float,
               grad_stats: tuple[float, float] | None, batch: int) -> GoodputChoice:
        a = self._app(job)
        lo_local, hi_local = a.local_range
        per_gpu = batch / gpus
        accum = max(int(np.ceil(per_gpu / hi_local - 1e-9)), 1) - 1
        local = int(np.ceil(per_gpu / (accum + 1) - 1e-9))
        if local < lo_local:
            return GoodputChoice(0.0, 0, 0, 0)
        real = gpus * local * (accum + 1)
        rate = float(self.throughput_at(job, gpus, nodes, local, accum)
                     * self.efficiency(job, min(max(real, a.limits_batch[0]), a.limits_batch[1]),
                                       progress, grad_stats))
        return GoodputChoice(rate, real, local, accum)

    def _app(self, job: Any) -> _App:
        name = job_application(job)
        try:
            return self.apps_[name]
        except KeyError:
            raise KeyError(f"no goodput model for application {name!r}; fitted: "
                           f"{', '.join(sorted(self.apps_))}") from None


def _check_placement(gpus: int, nodes: int) -> None:
    if gpus < 1 or nodes < 1 or nodes > gpus:
        raise ValueError(f"{gpus} GPUs over {nodes} nodes is not a placement")
