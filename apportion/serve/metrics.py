"""``GET /metrics``: Prometheus' text format, every name prefixed ``apportion_``.

Two sources, each the right one for what it counts:

* **the loop** (:meth:`ServeMetrics.observe`, one call per pass): round latency, the
  solver's wall time and gap, fallbacks, rounds, launches and launch failures by
  executor. These are this process's counters (they start at zero with it, as
  Prometheus expects of a counter; its ``rate()`` handles restarts).
* **the store** (:class:`StoreCollector`, read at every scrape through its own
  connection): jobs by state and by tenant, the queue's length (per tenant too), waiting
  jobs by their typed reason and the oldest one's age, GPUs allocated and free per type
  and held per tenant (against its quota, with ``--tenants``), and three histograms of
  every job the store holds: submission to decision (to the first round that placed it or
  gave it a typed reason: how quickly the event-driven rounds answer), the admission wait
  (submission to first start) and the completion time of finished jobs. The store is the source of truth for what exists now; a scrape
  never sees a value the store does not hold, and as jobs are never deleted the
  histograms only grow, as Prometheus expects of a histogram's counts.
  ``apportion_store_up`` is 0 when it cannot be read.

Estimator refits are read from the loop's refit object at every scrape. Every series is
one Prometheus sees as data: the ``_created`` samples prometheus_client adds to counters
and histograms by default are turned off (:func:`prometheus_client.disable_created_metrics`),
and ``apportion_build_info`` says which version and Python answer.
"""

from __future__ import annotations

import bisect
import logging
import math
import platform
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from apportion import __version__
from apportion.cluster import Cluster
from apportion.lifecycle import JobState
from apportion.serve.views import gpu_use
from apportion.store import open_store
from apportion.store_decisions import first_decisions
from apportion.store_queue import NOT_YET, reason_counts

log = logging.getLogger(__name__)

# what an executor's Event.action says about a launch
LAUNCH_ACTIONS = frozenset({"start", "resize", "migrate", "restart"})
FAILED_ACTIONS = frozenset({"failed", "error", "refused"})
QUEUED = frozenset({JobState.SUBMITTED, JobState.QUEUED, JobState.CHECKPOINTED})
# seconds: a round of a few jobs takes milliseconds, a big solve its whole budget
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, math.inf)
# seconds a job waits, or takes to finish: from a round's length to a week
JOB_BUCKETS = (10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
               86400.0, 259200.0, 604800.0, math.inf)
# seconds from a submission to the round that decides it: event-driven rounds take about
# the debounce plus a solve (a few seconds); the interval bounds it (300 s in deploy/)
DECISION_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    1800.0, 3600.0, math.inf)


class ServeMetrics:
    """The loop's metrics, on a registry of their own (one per server, none global)."""

    def __init__(self, registry: CollectorRegistry, executor: str,
                 interval_s: float | None = None) -> None:
        disable_created_metrics()  # no `_created` series beside counters and histograms
        self.executor = executor
        Info("apportion_build", "the apportion that answers: its version and Python",
             registry=registry).info({"version": __version__,
                                      "python": platform.python_version()})
        self.interval = Gauge("apportion_round_interval_seconds", "the loop's interval: "
                              "a round starts at the latest this long after the last",
                              registry=registry)
        if interval_s is not None:
            self.interval.set(interval_s)
        self.solver_status = Counter("apportion_solver_rounds", "rounds by the backend that "
                                     "answered and its status (optimal, feasible, fallback, "
                                     "...)", ["backend", "status"], registry=registry)
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
        self.solver_status.labels(str(report.backend), str(report.status)).inc()
        if report.fallback:
            self.fallbacks.inc()
        for e in tick.events:
            if e.action in LAUNCH_ACTIONS:
                self.launches.labels(self.executor).inc()
            elif e.action in FAILED_ACTIONS:
                self.launch_failures.labels(self.executor).inc()


def _tenant(rec: Any) -> str:
    return str(rec.spec.get("tenant") or "default")


def _histogram(name: str, doc: str, values: list[float],
               bounds: tuple[float, ...] = JOB_BUCKETS) -> HistogramMetricFamily:
    """A histogram of ``values`` over ``bounds`` (cumulative, as Prometheus reads a
    histogram)."""
    ordered = sorted(values)
    buckets = [(("+Inf" if math.isinf(b) else f"{b:g}"),
                float(len(ordered) if math.isinf(b) else bisect.bisect_right(ordered, b)))
               for b in bounds]
    h = HistogramMetricFamily(name, doc)
    h.add_metric([], buckets, sum_value=float(sum(ordered)))
    return h


class StoreCollector(Collector):
    """Read at every scrape: what the store holds now, and the refits so far."""

    def __init__(self, state: Path, cluster: Cluster, refits: Callable[[], int],
                 quotas: Mapping[str, int] | None = None) -> None:
        self.state = state
        self.cluster = cluster
        self.refits = refits
        self.quotas = dict(quotas or {})

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
                waiting = [r for r in recs if r.state in QUEUED]
                why = reason_counts(store)  # the dashboard's queue counts the same
                starts = store.first_starts()
                decided = first_decisions(store)
        except Exception as exc:  # noqa: BLE001 - a scrape reports the store down; it never fails
            log.warning("metrics: the store cannot be read: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        now = time.time()
        yield from _job_families(recs, waiting, sorted({_tenant(r) for r in recs}
                                                       | set(self.quotas)), now)
        yield from _gpu_families(recs, why, use, self.quotas)
        yield from _wait_histograms(recs, starts, decided)


def _job_families(recs: list[Any], waiting: list[Any], tenants: list[str],
                  now: float) -> Iterator[Metric]:
    """The jobs by state, the queue's length, and per tenant its jobs by state, its queue
    and its longest wait (as of ``now``)."""
    jobs = GaugeMetricFamily("apportion_jobs", "jobs in the store by lifecycle state",
                             labels=["state"])
    for s in JobState:
        jobs.add_metric([s.value], float(sum(r.state is s for r in recs)))
    yield jobs
    yield GaugeMetricFamily("apportion_queue_length", "jobs waiting for GPUs (submitted, "
                            "queued, checkpointed)", value=float(len(waiting)))
    by_tenant = GaugeMetricFamily("apportion_tenant_jobs", "jobs by tenant and lifecycle "
                                  "state", labels=["tenant", "state"])
    counts = Tally((_tenant(r), r.state.value) for r in recs)
    for t in tenants:
        for s in JobState:
            by_tenant.add_metric([t, s.value], float(counts.get((t, s.value), 0)))
    yield by_tenant
    queue = GaugeMetricFamily("apportion_tenant_queue_length", "jobs of each tenant "
                              "waiting for GPUs", labels=["tenant"])
    oldest = GaugeMetricFamily("apportion_oldest_pending_seconds", "how long each "
                               "tenant's longest-waiting job has waited (0: none waits)",
                               labels=["tenant"])
    for t in tenants:
        mine = [r for r in waiting if _tenant(r) == t]
        queue.add_metric([t], float(len(mine)))
        oldest.add_metric([t], max((max(0.0, now - r.submitted_at) for r in mine),
                                   default=0.0))
    yield queue
    yield oldest


def _gpu_families(recs: list[Any], why: list[Any], use: Mapping[str, Mapping[str, Any]],
                  quotas: Mapping[str, int]) -> Iterator[Metric]:
    """The waiting jobs by reason, the GPUs allocated and free per type, each tenant's
    held GPUs and (with ``--tenants``) its quota."""
    reasons = GaugeMetricFamily("apportion_pending_jobs", "waiting jobs by the typed "
                                f"reason their last round gave ({NOT_YET}: no round yet)",
                                labels=["reason"])
    tally = {r.reason or NOT_YET: r.jobs for r in why}
    for reason, n in sorted(tally.items()):
        reasons.add_metric([reason], float(n))
    yield reasons
    allocated = GaugeMetricFamily("apportion_gpus_allocated", "GPUs held by running jobs",
                                  labels=["gpu_type"])
    free = GaugeMetricFamily("apportion_gpus_free", "GPUs no running job holds (down "
                             "and quarantined nodes count for none)", labels=["gpu_type"])
    for t, u in use.items():
        allocated.add_metric([t], float(u["allocated"]))
        free.add_metric([t], float(u["free"]))
    yield allocated
    yield free
    held = GaugeMetricFamily("apportion_tenant_gpus_allocated", "GPUs each tenant's "
                             "running jobs hold", labels=["tenant", "gpu_type"])
    per = Tally((_tenant(r), str(r.running["gpu_type"])) for r in recs
                if r.state is JobState.RUNNING and r.running for _ in
                range(int(r.running["gpus"])))
    for (t, g), n in sorted(per.items()):
        held.add_metric([t, g], float(n))
    yield held
    if quotas:
        quota = GaugeMetricFamily("apportion_tenant_quota_gpus", "each tenant's GPU quota "
                                  "for guaranteed jobs (--tenants)", labels=["tenant"])
        for t, q in sorted(quotas.items()):
            quota.add_metric([t], float(q))
        yield quota


def _wait_histograms(recs: list[Any], starts: Mapping[str, float],
                     decided: Mapping[str, float]) -> Iterator[Metric]:
    """How long jobs waited for their first start and their first decision, and the
    finished jobs' JCTs."""
    yield _histogram("apportion_admission_wait_seconds", "from submission to a job's "
                     "first start, of every job that has started",
                     [max(0.0, starts[r.id] - r.submitted_at) for r in recs
                      if r.id in starts])
    yield _histogram("apportion_submit_to_decision_seconds", "from submission to the "
                     "first round that decided the job (placed it, or left it out with "
                     "a typed reason), of every job a round has decided",
                     [max(0.0, decided[r.id] - r.submitted_at) for r in recs
                      if r.id in decided], DECISION_BUCKETS)
    yield _histogram("apportion_job_completion_seconds", "from submission to the end, of "
                     "every finished job (its JCT)",
                     [max(0.0, r.updated_at - r.submitted_at) for r in recs
                      if r.state is JobState.FINISHED])
