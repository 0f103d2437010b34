"""Throughput of data-parallel training by placement and per-GPU batch (Pollux's model).

Pollux (OSDI'21, section 3.2) models one step of synchronous data parallelism on ``K`` GPUs
over ``N`` nodes, with per-GPU batch ``m`` and ``s`` extra gradient-accumulation steps:

* compute, linear in the per-GPU batch:   ``T_c(m) = alpha_c + beta_c * m``;
* gradient synchronisation, zero on one GPU, else a constant plus a term growing with the
  replicas, with its own pair of parameters inside one node and across nodes:
  ``T_s = alpha_r + beta_r * (K - 2)`` (N = 1), ``alpha_n + beta_n * (K - 2)`` (N > 1);
* the two overlap, by an exponent ``gamma`` in [1, 10] (1: none, 10: about full):
  ``T_step = (T_c^gamma + T_s^gamma)^(1/gamma)``; accumulation steps add compute only:
  ``T = s * T_c + T_step``, and the step trains on ``M = K * m * (s + 1)`` samples.

:class:`ThroughputModel` fits the seven parameters by least squares on logarithms (so a
0.1-s step weighs as much as a 10-s one) to the measured rows of one application: the
log-errors of the predicted step time and of the predicted compute time (the measured step
less its synchronisation), from several starting points, keeping the best.
:class:`TableThroughput` interpolates the measured rows instead (linearly in the per-GPU
batch, among the rows of the same GPU and node count) and falls back to a fitted model
elsewhere; it is what Pollux's own simulator treats as the truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from apportion.estimation.base import ParamsMixin
from apportion.estimation.goodput.measurements import StepTimes
from scipy.optimize import least_squares

PARAMS = ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n", "gamma")
GAMMA_RANGE = (1.0, 10.0)


def step_time(params: np.ndarray, nodes: np.ndarray, gpus: np.ndarray, local_batch: np.ndarray,
              accumulation: np.ndarray | int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(T, T_c)``: seconds of one optimizer step (with ``accumulation`` extra compute
    steps) and of one compute step, for parameters in :data:`PARAMS` order."""
    a_c, b_c, a_r, b_r, a_n, b_n, gamma = params
    nodes, gpus, local_batch = (np.asarray(x, dtype=float) for x in (nodes, gpus, local_batch))
    compute = a_c + b_c * local_batch
    extra = np.maximum(gpus - 2.0, 0.0)
    sync = np.where(nodes > 1, a_n + b_n * extra, a_r + b_r * extra)
    sync = np.where(gpus > 1, sync, 0.0)
    # the p-norm with p = gamma, scaled by the larger term so large gammas stay finite
    big = np.maximum(compute, sync)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = big * ((compute / big) ** gamma + (sync / big) ** gamma) ** (1.0 / gamma)
    step = np.where(big > 0, step, 0.0)
    return np.asarray(accumulation, dtype=float) * compute + step, compute


def log_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """How far predictions are from measurements: RMSLE, and the median, mean and worst
    absolute relative error."""
    rel = np.abs(predicted / measured - 1.0)
    return {"rmsle": float(np.sqrt(np.mean(np.log(predicted / measured) ** 2))),
            "median_abs_rel": float(np.median(rel)), "mean_abs_rel": float(np.mean(rel)),
            "max_abs_rel": float(np.max(rel)), "rows": int(measured.size)}


class ThroughputModel(ParamsMixin):
    """Pollux's throughput model, fitted to one application's measured step times.

    Fitted attributes: ``params_`` (the seven numbers, :data:`PARAMS` order), ``errors_``
    (:func:`log_errors` of the step time on the rows fitted)."""

    def __init__(self, restarts: int = 1) -> None:
        self.restarts = restarts

    def fit(self, rows: StepTimes) -> ThroughputModel:
        keep = (rows.step_s > 0) & (rows.compute_s > 0)
        if int(keep.sum()) < len(PARAMS):
            raise ValueError(f"{int(keep.sum())} usable rows; {len(PARAMS)} needed to fit")
        r = rows.select(keep)
        log_step, log_compute = np.log(r.step_s), np.log(r.compute_s)

        def residuals(p: np.ndarray) -> np.ndarray:
            step, compute = step_time(p, r.nodes, r.gpus, r.local_batch)
            return np.concatenate([np.log(step) - log_step, np.log(compute) - log_compute])

        slope, intercept = np.polyfit(r.local_batch, r.compute_s, 1)
        one = r.nodes == 1
        multi = r.gpus > 1
        sync_in = float(np.median(r.sync_s[one & multi])) if np.any(one & multi) else 0.01
        sync_out = float(np.median(r.sync_s[~one])) if np.any(~one) else sync_in
        base = np.array([max(intercept, 1e-4), max(slope, 1e-7), sync_in, 0.0, sync_out, 0.0,
                         1.0])
        lower = np.array([1e-6, 0, 0, 0, 0, 0, GAMMA_RANGE[0]])
        upper = np.array([np.inf] * 6 + [GAMMA_RANGE[1]])
        rng = np.random.default_rng(0)  # fixed: the same data always gives the same fit
        best = None
        for k in range(max(1, self.restarts)):
            x0 = base.copy()
            if k:
                x0[:6] *= np.exp(rng.normal(0.0, 0.5, 6))
                x0[2:6] += rng.uniform(0.0, 0.01, 4)
                x0[6] = rng.uniform(*GAMMA_RANGE)
            x0 = np.clip(x0, lower + 1e-9, np.where(np.isfinite(upper), upper - 1e-9, np.inf))
            res = least_squares(residuals, x0, bounds=(lower, upper), method="trf")
            if best is None or res.cost < best.cost:
                best = res
        assert best is not None
        self.params_ = best.x
        self.errors_ = log_errors(self.predict_step(r.nodes, r.gpus, r.local_batch), r.step_s)
        return self

    def predict_step(self, nodes: Any, gpus: Any, local_batch: Any,
                     accumulation: Any = 0) -> np.ndarray:
        """Seconds of one optimizer step (vectorised)."""
        return step_time(self.params_, nodes, gpus, local_batch, accumulation)[0]

    def throughput(self, nodes: Any, gpus: Any, local_batch: Any, accumulation: Any = 0
                   ) -> np.ndarray:
        """Samples per second (vectorised)."""
        batch = np.asarray(gpus, float) * np.asarray(local_batch, float) * (
            np.asarray(accumulation, float) + 1.0)
        return batch / self.predict_step(nodes, gpus, local_batch, accumulation)

    def named_params(self) -> Mapping[str, float]:
        return dict(zip(PARAMS, map(float, self.params_)))


class TableThroughput(ParamsMixin):
    """The measured step times themselves, interpolated in the per-GPU batch among the rows
    of the same (nodes, GPUs) -- averaged over the placements that share the counts (``44``
    and ``2222`` differ in node count; ``43`` and ``34`` do not) -- and Pollux's fitted model
    where no row has the counts or the batch lies outside the measured ones.

    Fitted attributes: ``model_`` (the fallback :class:`ThroughputModel`), ``table_``
    ((nodes, GPUs) -> (per-GPU batches, step seconds, sync seconds), batches ascending)."""

    def __init__(self, restarts: int = 1) -> None:
        self.restarts = restarts

    def fit(self, rows: StepTimes) -> TableThroughput:
        self.model_ = ThroughputModel(self.restarts).fit(rows)
        groups: dict[tuple[int, int], dict[float, list[tuple[float, float]]]] = {}
        for n, k, m, st, sy in zip(rows.nodes, rows.gpus, rows.local_batch, rows.step_s,
                                   rows.sync_s):
            groups.setdefault((int(n), int(k)), {}).setdefault(float(m), []).append((st, sy))
        self.table_ = {}
        for key, by_batch in groups.items():
            ms = np.array(sorted(by_batch))
            vals = np.array([np.mean(by_batch[m], axis=0) for m in ms])
            self.table_[key] = (ms, vals[:, 0], vals[:, 1])
        return self

    def predict_step(self, nodes: int, gpus: int, local_batch: Any, accumulation: Any = 0
                     ) -> np.ndarray:
        m = np.asarray(local_batch, dtype=float)
        s = np.asarray(accumulation, dtype=float)
        entry = self.table_.get((int(nodes), int(gpus)))
        fitted = self.model_.predict_step(nodes, gpus, m, s)
        if entry is None:
            return fitted
        ms, step, sync = entry
        st = np.interp(m, ms, step)
        measured = s * (st - np.interp(m, ms, sync)) + st
        inside = (m >= ms[0]) & (m <= ms[-1])
        return np.where(inside, measured, fitted)

    def throughput(self, nodes: int, gpus: int, local_batch: Any, accumulation: Any = 0
                   ) -> np.ndarray:
        batch = float(gpus) * np.asarray(local_batch, float) * (
            np.asarray(accumulation, float) + 1.0)
        return batch / self.predict_step(nodes, gpus, local_batch, accumulation)


def rotation(placement: tuple[int, ...]) -> tuple[int, ...]:
    """The smallest rotation of a placement's GPUs per node: the form Pollux's placement
    table keys it by (``42`` and ``24`` are one placement; ``1424`` and ``1442`` are two)."""
    counts = tuple(int(k) for k in placement if k)
    if not counts:
        return ()
    return min(counts[i:] + counts[:i] for i in range(len(counts)))


class PlacementTable:
    """Step times as Pollux's own simulator takes them to be true (its README's rule).

    A placement the placement table measured (its GPUs per node, in rotation order:
    :func:`rotation`) is linearly interpolated in the per-GPU batch among that placement's
    rows; any other (more than 4 nodes, or a per-GPU batch outside the placement's rows) is
    linearly interpolated over (nodes, GPUs, per-GPU batch) among every row, the placement
    table's averaged by their counts and the scalability table's, on their Delaunay
    triangulation (node counts past the largest measured one read as it). Outside every
    measurement there is no step time (NaN): Pollux's simulator never runs a job there.

    Unlike :class:`TableThroughput` (which keys rows by node and GPU count only and falls
    back to a fitted model), this tells ``1424`` from ``1442`` and extrapolates nothing:
    what a replay held to Pollux's figures must advance jobs by. Built from an
    application's :class:`~apportion.estimation.goodput.measurements.StepTimes`."""

    def __init__(self, placements: StepTimes, scalability: StepTimes) -> None:
        from scipy.spatial import Delaunay

        rows: dict[tuple[int, ...], dict[float, tuple[float, float]]] = {}
        for p, m, st, sy in zip(placements.placement, placements.local_batch,
                                placements.step_s, placements.sync_s):
            rows.setdefault(rotation(tuple(int(c) for c in p)), {})[float(m)] = (st, sy)
        self.table = {key: (np.array(sorted(by)), np.array([by[m] for m in sorted(by)]))
                      for key, by in rows.items()}
        groups: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
        for n, k, m, st, sy in zip(placements.nodes, placements.gpus, placements.local_batch,
                                   placements.step_s, placements.sync_s):
            groups.setdefault((float(n), float(k), float(m)), []).append((st, sy))
        points = [list(x) for x in groups] + [
            [float(n), float(k), float(m)] for n, k, m in
            zip(scalability.nodes, scalability.gpus, scalability.local_batch)]
        values = [list(np.mean(v, axis=0)) for v in groups.values()] + [
            [float(st), float(sy)] for st, sy in zip(scalability.step_s, scalability.sync_s)]
        self.max_nodes = int(max(p[0] for p in points))
        # scipy's LinearNDInterpolator on these points (what Pollux's simulator calls),
        # evaluated here from its triangulation: the same barycentric weights, without the
        # interpolator's per-call overhead (tens of ms a point)
        self.tri = Delaunay(np.array(points, dtype=float))
        self.values = np.array(values, dtype=float)

    def step(self, placement: tuple[int, ...], local_batch: float) -> tuple[float, float]:
        """``(step seconds, sync seconds)`` of one step of ``local_batch`` per GPU on
        ``placement`` (GPUs per node); NaN where nothing was measured near it."""
        key = rotation(placement)
        entry = self.table.get(key)
        m = float(local_batch)
        if entry is not None and entry[0][0] <= m <= entry[0][-1]:
            ms, vals = entry
            return float(np.interp(m, ms, vals[:, 0])), float(np.interp(m, ms, vals[:, 1]))
        x = np.array([min(len(key), self.max_nodes), sum(key), m], dtype=float)
        simplex = int(self.tri.find_simplex(x[None, :])[0])
        if simplex < 0:
            return math.nan, math.nan
        t = self.tri.transform[simplex]
        b = t[:3] @ (x - t[3])
        st, sy = np.append(b, 1.0 - b.sum()) @ self.values[self.tri.simplices[simplex]]
        return float(st), float(sy)
