"""Rates from an estimator: the rate source policies see on a real cluster.

In the simulator, policies read rates measured from a ground truth (see
``apportion.experiments.information``). On an operator's cluster there is no
truth table: every policy — baselines included — reads the same estimator
through :class:`EstimatorRates`, so ``solve-round --policy sia`` and
``--policy apportion`` decide from the same information.

A rate is iterations/s of a job on ``gpus`` GPUs of a type: the best plan the
estimator finds over pipeline-stage counts (powers of two up to 16), on the
given placement when one is asked for (so a spread placement pays its slower
links), else on the most consolidated one. With ``spill`` (an operator's round), a
catalog model no plan fits whole is rated on one GPU where Hydra's spilling fits it
(:func:`~apportion.estimation.models.spill.spilled_on`), as the cells and plans
formulations offer it: a baseline can then choose that GPU, and it runs the spilled plan.
A replay's rate sources do not spill: their measured rates are of whole runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apportion.estimation.models.spill import spilled_on
from apportion.estimation.registry import source_of

from apportion.cluster import Cluster
from apportion.plans import Cell


class EstimatorRates:
    """A :class:`apportion.view.RateSource` answering from an estimator (memoised)."""

    def __init__(self, estimator: Any, cluster: Cluster, max_stages: int = 16,
                 spill: bool = False) -> None:
        self.estimator = estimator
        self.cluster = cluster
        self.max_stages = max_stages
        self.spill = spill
        self.name = f"estimated:{type(estimator).__name__}"
        self._memo: dict[tuple[Any, ...], float] = {}

    def rate(self, job: Any, gpu_type: str, gpus: int, placement: Mapping[str, int] | None = None,
             plan: str | None = None, **kw: Any) -> float:
        spec = job.spec
        key = (spec.model, spec.global_batch_size, gpu_type, gpus,
               tuple(sorted((placement or {}).items())))
        if key not in self._memo:
            self._memo[key] = self._rate(spec, gpu_type, gpus, placement)
        return self._memo[key]

    def describe(self, job: Any, gpu_type: str, gpus: int,
                  placement: Mapping[str, int] | None = None) -> dict[str, Any] | None:
        """Where the rate of ``job`` on ``gpus`` GPUs of ``gpu_type`` came from: the source
        of the estimate it was read from (None: no estimate there)."""
        e = self._best(job.spec, gpu_type, gpus, placement)
        if e is None:
            return None
        return source_of(e, self.estimator, job.spec)

    def _rate(self, spec: Any, gpu_type: str, gpus: int,
              placement: Mapping[str, int] | None) -> float:
        e = self._best(spec, gpu_type, gpus, placement)
        return 0.0 if e is None else 1.0 / e.iter_time_s

    def _best(self, spec: Any, gpu_type: str, gpus: int,
              placement: Mapping[str, int] | None) -> Any:
        """The fastest feasible estimate over stage counts (on ``placement`` when spread)."""
        if self.cluster.capacity_by_type().get(gpu_type, 0) < gpus or gpus <= 0:
            return None
        best = None
        s = 1
        while s <= min(gpus, self.max_stages):
            if gpus % s == 0:
                e = self.estimator.best_in_cell(spec, Cell(spec.id, gpu_type, gpus, s),
                                                self.cluster)
                if e is not None and e.feasible and e.iter_time_s > 0:
                    if placement and len(placement) > 1 and hasattr(self.estimator, "predict"):
                        e2 = self.estimator.predict(spec, e.plan, dict(placement), self.cluster)
                        if e2.feasible and e2.iter_time_s > 0:
                            e = e2
                    if best is None or e.iter_time_s < best.iter_time_s:
                        best = e
            s *= 2
        if best is None and gpus == 1 and self.spill:  # fits no GPU whole: Hydra's spilling
            e, _ = spilled_on(spec, self.cluster, gpu_type, self.estimator)
            if e is not None and 0 < e.iter_time_s < float("inf"):
                best = e
        return best
