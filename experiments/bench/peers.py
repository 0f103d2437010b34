"""`apportion bench solve --peers`: apportion's round against its peers on the same instances.

Every method solves the same held-out round (``experiments.bench.solve``'s generator,
seed 1 by default: J queued jobs from Crius's table-2 models on Crius-shaped nodes
of four GPU types, about 1.28 GPUs per job) under the same wall-clock budget,
through the same pipeline (admission, the policy, the independent validator):

* ``apportion``: the cell formulation and its solver chain (isolated backends, as
  operators run ``solve-round``);
* ``gavel-max-sum-throughput`` and ``gavel-max-min-fairness``: Gavel's two LPs
  (cvxpy) and its round mechanism (the Gavel baseline policy);
* ``pop-2``, ``pop-4``, ``pop-8``: the cell round split POP-style
  (:mod:`apportion.solvers.partition`, local processes);
* ``sia``: the Sia-style ILP over each job's configurations per GPU type (the
  Sia baseline policy, its MILP limited to the budget);
* ``crius-greedy``: Crius's algorithm 1 (the cell greedy with its local search).

One common metric, computed here and not by any method: the **sum of normalised
throughput** of the validated placements — each placed job's iterations/s on
its real placement, by the analytic estimator every method was given as its
rate source, divided by its iterations/s on its requested GPUs of its
requested type (of the best type when it named none). Ratios are to
apportion's figures on the same instance. Wall time is the whole round as a
library call: candidates, model, solve, decoding and validation.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from typing import Any

from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.rates import EstimatorRates
from apportion.experiments.bench.solve import synthetic_jobs
from apportion.policies import make_policy
from apportion.validator import validate

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.inputs import parse_count
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round
from apportion.view import JobView

log = logging.getLogger(__name__)

PEER_SIZES = (1000, 2000, 5000, 10000)
METHODS = ("apportion", "gavel-max-sum-throughput", "gavel-max-min-fairness", "pop-2", "pop-4",
           "pop-8", "sia", "crius-greedy")


#: jobs a peer round may have (the targets stop at 10,000; Sia's ILP grows with the square)
MAX_PEER_JOBS = 100_000


def parse_sizes(sizes: str | None, quick: bool = False) -> tuple[int, ...]:
    """``--sizes`` (comma-separated job counts), each bounded by :data:`MAX_PEER_JOBS`
    before a round of that size is generated; default the targets (1,000 with ``quick``)."""
    if not sizes:
        return (1000,) if quick else PEER_SIZES
    parts = [x.strip() for x in sizes.split(",")]
    if not all(parts):
        raise InputError("--sizes", "sizes", f"{sizes!r}: give comma-separated job counts")
    return tuple(parse_count(x, "--sizes", maximum=MAX_PEER_JOBS) for x in parts)


def peer_cluster(jobs: int) -> Cluster:
    """Crius's four node shapes with about 1.28 GPUs per job (Crius's own 1,280-GPU cluster
    at 1,000 jobs)."""
    from apportion.experiments.bench.solve import synthetic_cluster

    return synthetic_cluster(round(jobs * 1.28), 4)


def normalised_throughput(decision: Decision, cluster: Cluster, jobs: list[JobSpec],
                          rates: EstimatorRates) -> float:
    """Sum over placed jobs of (rate on its placement) / (rate on its request)."""
    by_id = {j.id: j for j in jobs}
    total = 0.0
    for a in decision.allocations:
        job = by_id[a.job]
        js = JobView.from_spec(job)
        types = [job.requested_gpu_type] if job.requested_gpu_type else cluster.gpu_types
        ref = max((rates.rate(js, t, job.requested_gpus) for t in types), default=0.0)
        if ref <= 0:  # the request itself cannot run: its best configuration anywhere
            ref = max(rates.rate(js, t, g) for t in cluster.gpu_types
                      for g in {1, job.requested_gpus, 2 * job.requested_gpus})
        r = rates.rate(js, a.gpu_type, a.gpus, a.placement)
        total += r / ref if ref > 0 else 0.0
    return total


def run_method(method: str, cluster: Cluster, jobs: list[JobSpec], now: float,
               budget_s: float) -> tuple[Decision, float]:
    """(decision, wall seconds) of one method on one round."""
    t0 = time.perf_counter()
    if method == "apportion":
        res = run_round(cluster, jobs, now, RoundConfig(time_budget_s=budget_s, isolate=True))
    elif method.startswith("pop-"):
        cfg = RoundConfig(time_budget_s=budget_s, partitions=int(method.split("-")[1]))
        res = run_round(cluster, jobs, now, cfg)
    elif method == "crius-greedy":
        res = run_round(cluster, jobs, now, RoundConfig(backend="greedy", time_budget_s=budget_s))
    elif method == "sia":
        res = run_round(cluster, jobs, now, RoundConfig(time_budget_s=budget_s),
                        policy=make_policy("sia", time_limit_s=budget_s))
    else:
        res = run_round(cluster, jobs, now, RoundConfig(time_budget_s=budget_s),
                        policy=make_policy(method))
    return res.decision, time.perf_counter() - t0


def bench_peers(sizes: tuple[int, ...] = PEER_SIZES, methods: tuple[str, ...] = METHODS,
                budget_s: float = 30.0, seed: int = 1) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rates_est = AnalyticEstimator()
    for n in sizes:
        cluster = peer_cluster(n)
        jobs = synthetic_jobs(n, cluster.gpu_types, seed)
        now = 36000.0
        rates = EstimatorRates(rates_est, cluster)
        base: dict[str, Any] | None = None
        for method in methods:
            load = os.getloadavg()[0]
            try:
                dec, wall = run_method(method, cluster, jobs, now, budget_s)
            except Exception as exc:
                log.exception("%s on %d jobs failed", method, n)
                rows.append({"jobs": n, "gpus": cluster.total_gpus, "method": method,
                             "error": repr(exc)[:300], "load": round(load, 2)})
                continue
            valid = validate(dec, cluster, jobs).ok
            metric = normalised_throughput(dec, cluster, jobs, rates) if valid else None
            rep = dec.report
            row = {"jobs": n, "gpus": cluster.total_gpus, "method": method,
                   "wall_s": round(wall, 3), "metric": metric, "valid": valid,
                   "placed": len(dec.allocations), "status": rep.status, "backend": rep.backend,
                   "gap": rep.gap, "fallback": rep.fallback, "load": round(load, 2),
                   # the round's own objective (the cell methods': the same graph's values)
                   "objective": rep.objective}
            if method == "apportion":
                base = row
            if base is not None and base.get("metric"):
                row["metric_ratio"] = None if metric is None else metric / base["metric"]
                row["wall_ratio"] = wall / base["wall_s"] if base["wall_s"] else None
            log.info("%s", row)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], budget_s: float) -> str:
    head = (f"Budget {budget_s:g} s per method and instance; machine: {platform.machine()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}; `load` is the "
            "1-minute load average when the method started.\n\n"
            "| jobs | GPUs | method | wall s | x apportion | sum of normalised throughput | "
            "x apportion | placed | valid | status | gap | load |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    body = ""
    for r in rows:
        if "error" in r:
            body += f"| {r['jobs']} | {r['gpus']} | {r['method']} | error: {r['error']} |" \
                    " | | | | | | | |\n"
            continue
        body += (f"| {r['jobs']} | {r['gpus']} | {r['method']} | {r['wall_s']:.2f} | "
                 f"{fmt(r.get('wall_ratio'), '.2f')} | {fmt(r['metric'], '.1f')} | "
                 f"{fmt(r.get('metric_ratio'), '.3f')} | {r['placed']} | {r['valid']} | "
                 f"{r['status']} | {fmt(r['gap'], '.3%')} | {r['load']} |\n")
    return head + body


__all__ = ["METHODS", "PEER_SIZES", "bench_peers", "markdown", "normalised_throughput",
           "peer_cluster", "run_method"]
