"""What Pollux measured of each application, read from its simulator's data folder.

Pollux (OSDI'21) measured six training applications on its testbed (nodes of 4 NVIDIA T4)
and published, per application ``<app>``, three kinds of file (``SOURCES.md`` beside the
data says where each comes from):

* ``<app>/placements.csv`` and ``<app>/scalability.csv``: the step time and the part of it
  spent synchronising gradients, per placement (GPU count, node count) and per-GPU batch;
* ``<app>/validation-<B>.csv``: one row per epoch of training at global batch ``B``, with
  the progress reached (in steps of the smallest batch), and the gradient's squared norm
  ``grad_sqr`` and variance ``grad_var`` over that epoch -- the inputs of the statistical
  efficiency (:mod:`apportion.estimation.goodput.efficiency`).

These readers turn the files into arrays and nothing else; the models live beside them.
The limits each application runs within (how many epochs make a job, the per-GPU batch
range) are Pollux's simulator's (:data:`POLLUX_LIMITS`), stated here because a workload file
names only the application.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apportion.env import data_root
from apportion.errors import InputError


@dataclass(frozen=True)
class AppLimits:
    """How a job of one application runs in Pollux's evaluation.

    ``max_epochs``: the epochs a job trains for (its work); ``max_local_batch``: a per-GPU
    batch cap tighter than the measured range (yolov3's memory), ``None`` for the measured
    range's top."""

    max_epochs: int
    max_local_batch: int | None = None


#: Pollux's simulator's per-application limits (SOURCES.md: "a job ends after max_epochs
#: epochs ... with yolov3's per-GPU batch at most 8").
POLLUX_LIMITS: Mapping[str, AppLimits] = {
    "bert": AppLimits(2),
    "cifar10": AppLimits(100),
    "ncf": AppLimits(10),
    "imagenet": AppLimits(90),
    "deepspeech2": AppLimits(80),
    "yolov3": AppLimits(50, max_local_batch=8),
}


@dataclass(frozen=True)
class StepTimes:
    """Measured step times: one entry per measured row (arrays of equal length)."""

    nodes: np.ndarray        # nodes the job spans
    gpus: np.ndarray         # GPUs (data-parallel replicas) in all
    local_batch: np.ndarray  # per-GPU batch of one step
    step_s: np.ndarray       # one optimizer step, seconds
    sync_s: np.ndarray       # the part of it spent synchronising gradients, seconds
    placement: tuple[str, ...]  # the digit string of GPUs per node ('' for scalability rows)

    def __len__(self) -> int:
        return int(self.step_s.size)

    @property
    def compute_s(self) -> np.ndarray:
        """Forward and backward time of one step: the step less its synchronisation."""
        return self.step_s - self.sync_s

    def select(self, mask: np.ndarray) -> StepTimes:
        idx = np.flatnonzero(mask)
        return StepTimes(self.nodes[idx], self.gpus[idx], self.local_batch[idx],
                         self.step_s[idx], self.sync_s[idx],
                         tuple(self.placement[i] for i in idx))

    @staticmethod
    def concat(*parts: StepTimes) -> StepTimes:
        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        return StepTimes(cat("nodes"), cat("gpus"), cat("local_batch"), cat("step_s"),
                         cat("sync_s"), tuple(x for p in parts for x in p.placement))


@dataclass(frozen=True)
class GradientLog:
    """Per epoch of training at one global batch: the progress at the epoch's end (in steps
    of the application's smallest validated batch) and the gradient statistics during it."""

    batch: int
    progress: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


@dataclass(frozen=True)
class AppMeasurements:
    """Everything measured of one application."""

    name: str
    placements: StepTimes
    scalability: StepTimes
    gradients: tuple[GradientLog, ...]  # sorted by batch
    limits: AppLimits

    @property
    def step_times(self) -> StepTimes:
        """Every measured step: the placement table and the scalability table together."""
        return StepTimes.concat(self.placements, self.scalability)

    @property
    def init_batch(self) -> int:
        """M0: the smallest validated global batch (the batch progress is counted in)."""
        return self.gradients[0].batch

    @property
    def max_batch(self) -> int:
        """The largest validated global batch: no job runs beyond what was validated."""
        return self.gradients[-1].batch

    @property
    def local_batch_range(self) -> tuple[int, int]:
        """The per-GPU batch range: the placement table's, capped by the application's limit."""
        lo = int(self.placements.local_batch.min())
        hi = int(self.placements.local_batch.max())
        if self.limits.max_local_batch is not None:
            hi = min(hi, self.limits.max_local_batch)
        return lo, hi


def pollux_root() -> Path:
    """Pollux's data folder: ``$APPORTION_DATA/pollux``."""
    return data_root() / "pollux"


def _rows(path: Path, fields: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in fields if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(str(path), missing[0], "column missing "
                                 f"(the file has {', '.join(reader.fieldnames or [])})")
            return list(reader)
    except OSError as exc:
        raise InputError(str(path), "file", f"cannot be read: {exc.strerror or exc}") from exc


def _floats(path: Path, rows: list[dict[str, str]], name: str) -> np.ndarray:
    try:
        out = np.array([float(r[name]) for r in rows], dtype=float)
    except ValueError as exc:
        raise InputError(str(path), name, f"not a number ({exc})") from exc
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise InputError(str(path), name, "must be finite and non-negative")
    return out


def read_placements(path: Path) -> StepTimes:
    """``placement,local_bsz,step_time,sync_time``: a placement is a digit string of GPUs per
    node (``44`` = two nodes of 4)."""
    rows = _rows(path, ("placement", "local_bsz", "step_time", "sync_time"))
    placement = tuple(r["placement"].strip() for r in rows)
    for p in placement:
        if not p.isdigit() or "0" in p:
            raise InputError(str(path), "placement", f"{p!r} is not a string of GPUs per node")
    return StepTimes(np.array([len(p) for p in placement], dtype=float),
                     np.array([sum(map(int, p)) for p in placement], dtype=float),
                     _floats(path, rows, "local_bsz"), _floats(path, rows, "step_time"),
                     _floats(path, rows, "sync_time"), placement)


def read_scalability(path: Path) -> StepTimes:
    """``num_nodes,num_replicas,local_bsz,step_time,sync_time``: larger placements by count."""
    rows = _rows(path, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
    return StepTimes(_floats(path, rows, "num_nodes"), _floats(path, rows, "num_replicas"),
                     _floats(path, rows, "local_bsz"), _floats(path, rows, "step_time"),
                     _floats(path, rows, "sync_time"), ("",) * len(rows))


def read_gradient_log(path: Path) -> GradientLog:
    """``validation-<B>.csv``: ``progress,iteration,metric,grad_sqr,grad_var`` per epoch."""
    try:
        batch = int(path.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError) as exc:
        raise InputError(str(path), "name", "must be validation-<batch>.csv") from exc
    rows = _rows(path, ("progress", "grad_sqr", "grad_var"))
    if not rows:
        raise InputError(str(path), "rows", "no epoch recorded")
    return GradientLog(batch, _floats(path, rows, "progress"), _floats(path, rows, "grad_sqr"),
                       _floats(path, rows, "grad_var"))


def read_application(name: str, root: Path | None = None,
                     limits: AppLimits | None = None) -> AppMeasurements:
    """One application's measurements from ``<root>/traces/<name>/`` (root: Pollux's data
    folder, :func:`pollux_root` by default); ``limits`` default to Pollux's for the name."""
    folder = (root if root is not None else pollux_root()) / "traces" / name
    if limits is None:
        if name not in POLLUX_LIMITS:
            raise InputError(str(folder), "application", f"{name!r} is not one of Pollux's "
                             f"({', '.join(POLLUX_LIMITS)}); give its limits")
        limits = POLLUX_LIMITS[name]
    logs = sorted((read_gradient_log(p) for p in folder.glob("validation-*.csv")),
                  key=lambda g: g.batch)
    if not logs:
        raise InputError(str(folder), "validation-<B>.csv", "no gradient log found")
    short = min(g.progress.size for g in logs)
    if short < limits.max_epochs:
        raise InputError(str(folder), "validation-<B>.csv", f"{short} epochs recorded, "
                         f"{limits.max_epochs} needed")
    return AppMeasurements(name, read_placements(folder / "placements.csv"),
                           read_scalability(folder / "scalability.csv"), tuple(logs), limits)


def read_applications(root: Path | None = None) -> dict[str, AppMeasurements]:
    """Every application of :data:`POLLUX_LIMITS` from Pollux's data folder."""
    return {name: read_application(name, root) for name in POLLUX_LIMITS}
