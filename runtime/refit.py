"""Online refit: measured iteration times flow back into the estimator the rounds use.

Every measured iteration time of a running job becomes an estimator sample
(job, plan, placement, GPU type, time). When a measurement misses the round's
estimate by more than ``threshold`` (relative), the estimator is refitted on
all samples so far (the analytic model recalibrates its per-type efficiency;
the next round's candidates use it). One sample per job and round: the loop
polls often, the plan changes only between rounds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.base import Sample

from apportion.cluster import Cluster
from apportion.decision import Allocation
from apportion.jobs import JobSpec

log = logging.getLogger(__name__)


@dataclass
class OnlineRefit:
    cluster: Cluster
    estimator: AnalyticEstimator = field(default_factory=AnalyticEstimator)
    threshold: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    refits: int = 0
    _seen: set[tuple[int, str]] = field(default_factory=set)

    def observe(self, round_index: int, job: JobSpec, alloc: Allocation, measured_s: float) -> bool:
        """Record one measurement; returns True when it triggered a refit."""
        if (round_index, job.id) in self._seen or measured_s <= 0:
            return False
        self._seen.add((round_index, job.id))
        self.samples.append(Sample(job, alloc.plan, dict(alloc.placement), alloc.gpu_type,
                                   measured_s))
        predicted = self.estimator.predict(job, alloc.plan, alloc.placement, self.cluster).iter_time_s
        error = abs(predicted - measured_s) / measured_s
        if error <= self.threshold:
            return False
        self.estimator.fit(self.samples, self.cluster)
        self.refits += 1
        log.info("refit after %s: predicted %.3gs, measured %.3gs (%.0f%% off); efficiency %s",
                 job.id, predicted, measured_s, 100 * error, self.estimator.efficiency_)
        return True
