"""Online refit: measured iteration times flow back into the estimator the rounds use.

The estimator is the user's (``run --estimator``): the refit corrects it, it never
replaces it. Every measured iteration time of a running job becomes an estimator
sample (job, plan, placement, GPU type, time). When a measurement misses the round's
estimate by more than ``threshold`` (relative), the estimator is refitted on all samples
so far through its own ``fit`` (the analytic model recalibrates its per-type efficiency,
Morphling's fits its k-parameters per architecture that has enough samples while the
others keep their priors, the cell estimator recalibrates its cells, a table remembers the
rows, ``auto`` does each and re-picks per job); the next round's candidates use it. Every
``fit`` takes any mix of samples: a workload the catalog cannot build is skipped by the
models and kept by the tables. One sample per job and round: the loop polls often, the plan changes
only between rounds. A store's samples from earlier runs warm it before the first round.

A spilled plan's step (Hydra: the model trained shard by shard) is no sample: the
estimators model whole-model steps, and a spilled step is mostly host<->device copies;
fitted as a whole step it would make every cell of its GPU type look slow. Its time
is the spilled estimate's (``estimation.models.spill``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from apportion.estimation.base import Sample
from apportion.estimation.models.analytic import AnalyticEstimator

from apportion.cluster import Cluster
from apportion.decision import Allocation
from apportion.jobs import JobSpec

log = logging.getLogger(__name__)


@dataclass
class OnlineRefit:
    cluster: Cluster
    estimator: Any = field(default_factory=AnalyticEstimator)
    threshold: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    refits: int = 0
    _seen: set[tuple[int, str]] = field(default_factory=set)

    def observe(self, round_index: int, job: JobSpec, alloc: Allocation, measured_s: float) -> bool:
        """Record one measurement; returns True when it triggered a refit."""
        if (round_index, job.id) in self._seen or measured_s <= 0 or alloc.plan.spilled:
            return False
        self._seen.add((round_index, job.id))
        self.samples.append(Sample(job, alloc.plan, dict(alloc.placement), alloc.gpu_type,
                                   measured_s))
        try:
            predicted = self.estimator.predict(job, alloc.plan, alloc.placement,
                                               self.cluster).iter_time_s
        except (KeyError, ValueError) as exc:  # a workload the catalog cannot build
            log.info("no estimate of %s to compare (%s); its sample joins the next refit",
                     job.id, exc)
            return False
        error = abs(predicted - measured_s) / measured_s
        if error <= self.threshold:
            return False
        self._fit()
        log.info("refit after %s: predicted %.3gs, measured %.3gs (%.0f%% off)", job.id,
                 predicted, measured_s, 100 * error)
        return True

    def warm(self, samples: Iterable[Sample]) -> None:
        """Fit on what earlier runs measured (the store's samples), before the first round."""
        self.samples.extend(s for s in samples if s.iter_time_s > 0 and not s.plan.spilled)
        if self.samples:
            self._fit()

    def _fit(self) -> None:
        """Refit on every sample so far. An estimator that cannot fit yet (Morphling's model
        needs 7 samples of an architecture) keeps what it had: the rounds go on with it,
        and a later refit with more samples tries again."""
        fit = self.estimator.fit
        takes_cluster = "cluster" in inspect.signature(fit).parameters
        try:
            fit(self.samples, self.cluster) if takes_cluster else fit(self.samples)
        except ValueError as exc:
            log.info("estimator not refitted yet (%d samples): %s", len(self.samples), exc)
            return
        self.refits += 1
