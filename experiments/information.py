"""What every policy may know in a replay: the ``oracle`` and ``estimated`` information modes.

A comparison is fair only when every policy decides from the same information.
The simulator therefore hands every policy — apportion's formulations and
every baseline alike — the same rate source for a run:

* ``oracle``: measured truth for every configuration (the ground truth through
  :class:`~apportion.experiments.groundtruth.NoisyView`, sigma 0 unless
  ``--noise`` is given). What a scheduler with perfect profiles would know.
* ``estimated`` (the default): :class:`ProfiledRates`. Each job is profiled
  once at a fixed budget — its throughput measured on one GPU and on its
  requested GPU count of every GPU type (Sia bootstraps from one GPU per type;
  Gavel measures each job's throughput on each type at its scale factor),
  with seeded log-normal measurement noise (sigma 0.1 by default). Every
  other configuration is predicted from the nearest measurement by a scaling
  model, the same for every policy: the ``--estimator`` (the analytic model by
  default; ``crius`` and ``morphling`` the other estimators; ``tables``
  interpolates between the measured points alone, log-log; ``auto`` is what
  ``--estimator auto`` picks with a replay's information: every job has
  measurements of its own model and batch, the profile's, and auto's first rule
  answers those from the tables, so it scales as ``tables`` does and is named
  ``auto:tables``). A spread placement pays what the scaling model says it
  costs over a consolidated one.

apportion's formulations read these rates through
:class:`~apportion.estimation.rate_estimator.RateEstimator` (plans and memory
from the estimator, times from the view), so apportion never knows more than
the baselines it is compared with, and never less.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from apportion.cluster import Cluster
from apportion.errors import CatalogError
from apportion.estimation.models.analytic import nominal_placement
from apportion.estimation.rates import EstimatorRates
from apportion.estimation.registry import make_estimator
from apportion.experiments.groundtruth import NoisyView
from apportion.models import get_model
from apportion.view import INFORMATION_MODES

DEFAULT_PROFILE_NOISE = 0.1


def _noise(seed: int, sigma: float, *key: Any) -> float:
    if sigma <= 0:
        return 1.0
    h = hashlib.blake2b("|".join(str(k) for k in (seed, "profile", *key)).encode(),
                        digest_size=8).digest()
    u1 = (int.from_bytes(h[:4], "big") + 0.5) / 2**32
    u2 = (int.from_bytes(h[4:], "big") + 0.5) / 2**32
    return math.exp(sigma * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2))


class ProfiledRates:
    """The ``estimated`` mode's rate source: a fixed profiling budget, one scaling model."""

    def __init__(self, truth: Any, cluster: Cluster, sigma: float = DEFAULT_PROFILE_NOISE,
                 seed: int = 0, estimator: str | Any = "analytic") -> None:
        self.truth = truth
        self.base = truth  # the measured tables (Morphling's policy reads its plan catalogue)
        self.cluster = cluster
        self.sigma = sigma
        self.seed = seed
        self.estimator_name = estimator if isinstance(estimator, str) else type(estimator).__name__
        if estimator == "auto":  # every replayed job is profiled: auto's tables answer it
            estimator, self.estimator_name = "tables", "auto:tables"
        self.scaling = (None if estimator == "tables" else EstimatorRates(
            make_estimator(estimator) if isinstance(estimator, str) else estimator, cluster))
        self.name = f"profiled({self.estimator_name}, sigma {sigma})"
        self.interpolated = getattr(truth, "interpolated", set())
        self.caps = cluster.capacity_by_type()
        self._measured: dict[tuple[Any, ...], float] = {}
        # a truth that rates batches is profiled at the batch asked (each one once, at the
        # start of training: a profile is not re-measured as the job progresses)
        self.rates_batches = bool(getattr(truth, "rates_batches", False))

    # -- the profiling budget -------------------------------------------------------------
    def points(self, js: Any, gpu_type: str) -> list[int]:
        """GPU counts profiled for ``js`` on ``gpu_type``: one GPU and its request."""
        cap = self.caps.get(gpu_type, 0)
        return sorted({g for g in (1, int(js.spec.requested_gpus)) if 1 <= g <= cap})

    def measured(self, js: Any, gpu_type: str, gpus: int, plan: str | None = None,
                 **kw: Any) -> float:
        """One profiling measurement (consolidated placement), noise included."""
        key = (js.id, gpu_type, gpus, plan, tuple(sorted(kw.items(), key=lambda x: x[0]))
               if kw else ())
        if key not in self._measured:
            r = float(self.truth.rate(js.trace, gpu_type, gpus, None, plan, **kw))
            self._measured[key] = r * _noise(self.seed, self.sigma, js.id, gpu_type, gpus, plan) \
                if r > 0 else 0.0
        return self._measured[key]

    # -- the scaling model ----------------------------------------------------------------
    def model_rate(self, js: Any, gpu_type: str, gpus: int,
                   placement: Mapping[str, int] | None = None) -> float:
        """The scaling model's iterations/s (relative figures are all that is used)."""
        if self.scaling is not None:
            try:
                get_model(js.spec.model)
            except CatalogError:
                pass
            else:
                return self.scaling.rate(js, gpu_type, gpus, placement)
        # no model of this workload (a trace's own job type, or ``tables``): sub-linear
        # data-parallel scaling, 5 % lost per extra GPU's share of the all-reduce
        return gpus / (1.0 + 0.05 * (gpus - 1)) if gpus <= self.caps.get(gpu_type, 0) else 0.0

    def _spread_factor(self, js: Any, gpu_type: str, gpus: int,
                       placement: Mapping[str, int] | None) -> float:
        if not placement or self.scaling is None:
            return 1.0
        nominal = nominal_placement(self.cluster, gpu_type, gpus)
        if nominal is None or len(placement) <= len(nominal):
            return 1.0
        base = self.model_rate(js, gpu_type, gpus)
        spread = self.model_rate(js, gpu_type, gpus, placement)
        return min(1.0, spread / base) if base > 0 and spread > 0 else 1.0

    def rate(self, js: Any, gpu_type: str, gpus: int, placement: Mapping[str, int] | None = None,
             plan: str | None = None, **kw: Any) -> float:
        if gpus <= 0 or gpus > self.caps.get(gpu_type, 0):
            return 0.0
        pts = self.points(js, gpu_type)
        if gpus in pts:
            r = self.measured(js, gpu_type, gpus, plan, **kw)
            return r * self._spread_factor(js, gpu_type, gpus, placement) if r > 0 else 0.0
        refs = [(g, self.measured(js, gpu_type, g, plan, **kw)) for g in pts]
        refs = [(g, r) for g, r in refs if r > 0]
        if not refs:  # never ran where it was profiled on this type: borrow another type's
            refs_other = [(t, g, self.measured(js, t, g, plan, **kw)) for t in sorted(self.caps)
                          if t != gpu_type for g in self.points(js, t)]
            refs_other = [x for x in refs_other if x[2] > 0]
            if not refs_other:
                return 0.0
            t0, g0, r0 = max(refs_other, key=lambda x: x[2])
            here, there = self.model_rate(js, gpu_type, gpus), self.model_rate(js, t0, g0)
            return r0 * here / there if here > 0 and there > 0 else 0.0
        if self.scaling is None and len(refs) >= 2:  # tables: log-log between the points
            (g1, r1), (g2, r2) = refs[0], refs[-1]
            exp = min(1.0, max(0.0, math.log(r2 / r1) / math.log(g2 / g1)))
            return r2 * (gpus / g2) ** exp
        here = self.model_rate(js, gpu_type, gpus)
        if here <= 0:
            return 0.0
        # the nearest profiled count the model also runs: a count measured running that the
        # model thinks does not fit is no reference for a ratio, but the other point still is
        for g0, r0 in sorted(refs, key=lambda x: abs(math.log(gpus / x[0]))):
            there = self.model_rate(js, gpu_type, g0)
            if there > 0:
                return r0 * here / there * self._spread_factor(js, gpu_type, gpus, placement)
        return 0.0


def rate_source(information: str, truth: Any, cluster: Cluster, seed: int = 0,
                noise: float = 0.0, estimator: str | Any = "analytic",
                profile_noise: float = DEFAULT_PROFILE_NOISE) -> Any:
    """The rate source every policy of a run sees in ``information`` mode."""
    if information == "oracle":
        return NoisyView(truth, noise, seed)
    if information == "estimated":
        return ProfiledRates(truth, cluster, profile_noise if noise <= 0 else noise, seed,
                             estimator)
    raise ValueError(f"unknown information mode {information!r}; choose "
                     f"{', '.join(INFORMATION_MODES)}")
