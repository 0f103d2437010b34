"""``GET /metrics``: Prometheus' text format, every name prefixed ``apportion_``.

Two sources, each the right one for what it counts:

* **the loop** (:meth:`ServeMetrics.observe`, one call per pass): round latency, the
  solver's wall time and gap, fallbacks, rounds, launches and launch failures by
  executor. These are this process's counters (they start at zero with it, as
  Prometheus expects of a counter; its ``rate()`` handles restarts).
* **the store** (:class:`StoreCollector`, read at every scrape through its own
  connection): jobs by state, the queue's length, GPUs allocated and free per type.
  The store is the source of truth for what exists now; a scrape never sees a value
  the store does not hold. ``apportion_store_up`` is 0 when it cannot be read.

Estimator refits are read from the loop's refit object at every scrape.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from apportion.cluster import Cluster
from apportion.lifecycle import JobState
from apportion.serve.views import gpu_use
from apportion.store import open_store

log = logging.getLogger(__name__)

# what an executor's Event.action says about a launch
LAUNCH_ACTIONS = frozenset({"start", "resize", "migrate", "restart"})
FAILED_ACTIONS = frozenset({"failed", "error", "refused"})
QUEUED = frozenset({JobState.SUBMITTED, JobState.QUEUED, JobState.CHECKPOINTED})
# seconds: a round of a few jobs takes milliseconds, a big solve its whole budget
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, math.inf)


class ServeMetrics:
    """The loop's metrics, on a registry of their own (one per server, none global)."""

    def __init__(self, registry: CollectorRegistry, executor: str) -> None:
        self.executor = executor
        self.round_duration = Histogram(
            "apportion_round_duration_seconds", "one round: read the queue, solve, record, "
            "apply through the executor", registry=registry, buckets=BUCKETS)
        self.solver_wall = Histogram(
            "apportion_solver_wall_seconds", "the solver's wall time per round",
            registry=registry, buckets=BUCKETS)
        self.solver_gap = Gauge(
            "apportion_solver_gap_ratio", "the last round's relative optimality gap "
            "(NaN when its backend reports none)", registry=registry)
        self.rounds = Counter("apportion_rounds", "rounds solved and applied",
                              registry=registry)
        self.fallbacks = Counter("apportion_solver_fallbacks", "rounds whose solve fell back "
                                 "to another backend or a heuristic", registry=registry)
        self.launches = Counter("apportion_launches", "worker groups an executor launched "
                                "(start, resize, migrate, restart)", ["executor"],
                                registry=registry)
        self.launch_failures = Counter("apportion_launch_failures", "launches an executor "
                                       "could not start", ["executor"], registry=registry)
        self.last_round = Gauge("apportion_last_round_timestamp_seconds", "when the loop "
                                "last finished a pass (Unix time)", registry=registry)
        self.solver_gap.set(math.nan)
        # the executor's series exist at zero from the start (a rate needs a first sample)
        self.launches.labels(executor)
        self.launch_failures.labels(executor)

    def observe(self, tick: Any) -> None:
        """One pass of the loop (a :class:`~apportion.runtime.loop.RoundTick`)."""
        self.last_round.set(tick.finished_at)
        if tick.decision is None:
            return
        report = tick.decision.report
        self.rounds.inc()
        self.round_duration.observe(tick.duration_s)
        self.solver_wall.observe(max(0.0, float(report.wall_s)))
        gap = report.gap
        self.solver_gap.set(float(gap) if gap is not None and math.isfinite(gap) else math.nan)
        if report.fallback:
            self.fallbacks.inc()
        for e in tick.events:
            if e.action in LAUNCH_ACTIONS:
                self.launches.labels(self.executor).inc()
            elif e.action in FAILED_ACTIONS:
                self.launch_failures.labels(self.executor).inc()


class StoreCollector(Collector):
    """Read at every scrape: what the store holds now, and the refits so far."""

    def __init__(self, state: Path, cluster: Cluster, refits: Callable[[], int]) -> None:
        self.state = state
        self.cluster = cluster
        self.refits = refits

    def describe(self) -> list[Metric]:
        return []  # no names checked at registration: collect() reads the store

    def collect(self) -> Iterator[Metric]:
        refits = CounterMetricFamily("apportion_estimator_refits", "estimator refits from "
                                     "measured iteration times")
        refits.add_metric([], float(self.refits()))
        yield refits
        up = GaugeMetricFamily("apportion_store_up", "1 when the state store could be read")
        try:
            with open_store(self.state, readonly=True) as store:
                recs = store.jobs()
                use = gpu_use(store, self.cluster)
        except Exception as exc:  # noqa: BLE001 - a scrape reports the store down; it never fails
            log.warning("metrics: the store cannot be read: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        jobs = GaugeMetricFamily("apportion_jobs", "jobs in the store by lifecycle state",
                                 labels=["state"])
        for s in JobState:
            jobs.add_metric([s.value], float(sum(r.state is s for r in recs)))
        yield jobs
        yield GaugeMetricFamily("apportion_queue_length", "jobs waiting for GPUs (submitted, "
                                "queued, checkpointed)",
                                value=float(sum(r.state in QUEUED for r in recs)))
        allocated = GaugeMetricFamily("apportion_gpus_allocated", "GPUs held by running jobs",
                                      labels=["gpu_type"])
        free = GaugeMetricFamily("apportion_gpus_free", "GPUs no running job holds (down "
                                 "and quarantined nodes count for none)", labels=["gpu_type"])
        for t, u in use.items():
            allocated.add_metric([t], float(u["allocated"]))
            free.add_metric([t], float(u["free"]))
        yield allocated
        yield free
