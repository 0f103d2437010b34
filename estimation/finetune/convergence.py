"""YMIR's iteration and time estimators: loss-curve fit, iterations to target, duration.

* :class:`LossCurveFit` fits Optimus's convergence model
  ``l(k) = 1 / (b0 k + b1) + b2`` plus one extra term ``b3 exp(-b4 k)``. The YMIR
  text says its Eqn. 3 "advances Optimus's curve-fitting model by introducing a
  new term" without printing it; fine-tuning from a pretrained backbone drops the
  loss sharply in the first steps and then settles into Optimus's 1/k tail, which
  an exponential term captures and the 1/k form alone fits poorly. ``extra_term=False``
  gives plain Optimus for comparison.
* :func:`iterations_for_mode` applies a transfer gain (Eqn. 1: the fraction of
  normal iterations saved) per mode: temporal ``(1-g) N_B``; spatial
  ``(1-g) max(N_A, N_B)`` iterations of the merged job.
* :class:`ThroughputTable` is the time estimator (Eqn. 5): iterations x iteration
  time of a global batch for any GPU count, linearly interpolated over measured
  ``(GPUs, local batch) -> step time`` profiles, as YMIR's simulator does.

Estimators follow scikit-learn: parameters in ``__init__``, fitted attributes end in ``_``.
"""

from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

log = logging.getLogger(__name__)


class LossCurveFit:
    """Fit ``l(k) = 1/(b0 k + b1) + b2 [+ b3 exp(-b4 k)]`` (all b >= 0) to a loss curve."""

    def __init__(self, extra_term: bool = True) -> None:
        self.extra_term = extra_term

    @staticmethod
    def _curve(p: np.ndarray, k: np.ndarray, extra: bool) -> np.ndarray:
        out = 1.0 / (p[0] * k + p[1]) + p[2]
        if extra:
            out = out + p[3] * np.exp(-p[4] * k)
        return out

    def fit(self, steps: np.ndarray, losses: np.ndarray) -> LossCurveFit:
        k = np.asarray(steps, float)
        y = np.asarray(losses, float)
        if k.shape != y.shape or k.size < (5 if self.extra_term else 3):
            raise ValueError("need matching steps/losses with enough points to fit")
        self.scale_ = float(max(k.max(), 1.0))  # fit on k/scale for conditioning
        ks = k / self.scale_
        n = 5 if self.extra_term else 3
        y0, ymin = float(y[0]), float(y.min())
        starts = [np.array([1.0, 1.0 / max(y0 - ymin, 1e-3), max(ymin * 0.9, 0.0), 0.5 * y0, 10.0])[:n],
                  np.array([10.0, 1.0, max(ymin * 0.5, 0.0), y0, 50.0])[:n]]
        best = None
        for x0 in starts:
            res = least_squares(lambda p: self._curve(p, ks, self.extra_term) - y, x0,
                                bounds=(np.full(n, 0.0) + np.r_[0, 1e-6, 0, 0, 0][:n], np.inf))
            if best is None or res.cost < best.cost:
                best = res
        assert best is not None
        self.params_ = best.x
        self.rmse_ = float(math.sqrt(2 * best.cost / y.size))
        return self

    def predict(self, steps: np.ndarray) -> np.ndarray:
        return self._curve(self.params_, np.asarray(steps, float) / self.scale_, self.extra_term)

    def iterations_to(self, target_loss: float, max_iterations: float = 1e9) -> float:
        """Smallest k with predicted loss <= target (bisection on the decreasing curve)."""
        if self.predict(np.array([0.0]))[0] <= target_loss:
            return 0.0
        if self.predict(np.array([max_iterations]))[0] > target_loss:
            return math.inf
        lo, hi = 0.0, max_iterations
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if self.predict(np.array([mid]))[0] <= target_loss:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-6 * max(1.0, hi):
                break
        return hi


def iterations_for_mode(mode: str, normal_iters: float, gain: float = 0.0,
                        partner_iters: float | None = None) -> float:
    """Iterations to target under a mode (Eqn. 2); a gain is the fraction saved."""
    if mode == "normal":
        return normal_iters
    if not gain < 1.0:
        raise ValueError("gain must be < 1")
    if mode == "temporal":
        return (1.0 - gain) * normal_iters
    if mode == "spatial":
        if partner_iters is None:
            raise ValueError("spatial needs the partner's iterations")
        return (1.0 - gain) * max(normal_iters, partner_iters)
    raise ValueError(f"unknown mode {mode!r}")


def epochs_to_target(curve: list[float], target: float, higher_is_better: bool = True) -> float | None:
    """First epoch (1-based) a measured per-epoch metric curve reaches the target, else None."""
    for i, v in enumerate(curve):
        if (v >= target - 1e-12) if higher_is_better else (v <= target + 1e-12):
            return float(i + 1)
    return None


def measured_gain(normal_epochs: float, transfer_epochs: float | None) -> float:
    """Eqn. 1 on measured curves: 1 - transfer/normal; never reaching the target is -1."""
    if transfer_epochs is None:
        return -1.0
    return 1.0 - transfer_epochs / normal_epochs


@dataclass
class ThroughputTable:
    """Measured step times per (GPUs, local batch); interpolates for unseen configs."""

    table: dict[int, list[tuple[float, float]]]  # gpus -> sorted [(local_bsz, step_time)]
    max_local_bsz: float

    @classmethod
    def from_fminfo(cls, folder: str | Path, model: str) -> ThroughputTable:
        """Read ``{model}_placements.csv`` (1 node) and ``{model}_scalability.csv``.

        A placement like ``"11"`` lists GPUs per node (two nodes, one each); its GPU
        count is the digit sum. Scalability rows give ``num_replicas`` GPUs.
        """
        folder = Path(folder)
        rows: dict[int, dict[float, list[float]]] = {}
        pl = folder / f"{model}_placements.csv"
        sc = folder / f"{model}_scalability.csv"
        for path, gpus_of in ((pl, lambda r: sum(int(c) for c in r["placement"])),
                              (sc, lambda r: int(r["num_replicas"]))):
            if not path.is_file():
                continue
            with path.open() as fh:
                for r in csv.DictReader(fh):
                    g = gpus_of(r)
                    rows.setdefault(g, {}).setdefault(float(r["local_bsz"]), []).append(
                        float(r["step_time"]))
        if not rows:
            raise FileNotFoundError(f"no profiles for {model} in {folder}")
        table = {g: sorted((b, float(np.mean(ts))) for b, ts in d.items()) for g, d in rows.items()}
        max_b = max(b for d in table.values() for b, _ in d)
        return cls(table, max_b)

    def step_time(self, gpus: int, local_bsz: float) -> float:
        """Time of one step at ``local_bsz`` per GPU on ``gpus`` GPUs (interpolated)."""
        known = sorted(self.table)
        if gpus in self.table:
            pts = self.table[gpus]
            return float(np.interp(local_bsz, [b for b, _ in pts], [t for _, t in pts]))
        lo = max((g for g in known if g < gpus), default=known[0])
        hi = min((g for g in known if g > gpus), default=known[-1])
        tl, th = self.step_time(lo, local_bsz), self.step_time(hi, local_bsz)
        if hi == lo:
            return tl
        return tl + (th - tl) * (gpus - lo) / (hi - lo)

    def iteration_time(self, gpus: int, global_batch: float) -> float:
        """One optimiser step of ``global_batch`` on ``gpus`` GPUs, with accumulation when needed."""
        if gpus < 1:
            raise ValueError("gpus must be >= 1")
        per_gpu = global_batch / gpus
        accum = max(1, math.ceil(per_gpu / self.max_local_bsz))
        return accum * self.step_time(gpus, per_gpu / accum)

    def duration(self, iterations: float, gpus: int, global_batch: float) -> float:
        """Eqn. 5: iterations x iteration time."""
        return iterations * self.iteration_time(gpus, global_batch)

    def max_useful_gpus(self, global_batch: float, min_local_bsz: float = 1.0) -> int:
        """Batch-size-scaled GPU limit: at least ``min_local_bsz`` samples per GPU."""
        return max(1, int(global_batch // max(min_local_bsz, 1e-9)))
