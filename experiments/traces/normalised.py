"""The normalised CSV of ``../shared/data/traces/``, read once for the formats built on it.

``job_id, submit_time_s, num_gpus, duration_s`` plus optional ``tenant`` (or ``cluster``),
``model``, ``gpu_type``, ``batch_size``, ``iterations`` (or Gavel's ``total_steps``),
``v100_est_duration_s``, ``deadline_s``, ``max_gpus`` and ``elastic`` (``true`` / ``false``:
whether the job may run on other GPU counts than its own; true where not given). Which format a file is — a raw cluster trace
(:mod:`.raw`), Gavel's job types (:mod:`.gavel`), ElasticFlow's models
(:mod:`.elasticflow`) — is the registry's to detect; this module only reads the rows.
A user's own workload has a stricter reader of its own (:mod:`.workload`).
"""

from __future__ import annotations

import io
import itertools
import logging
from pathlib import Path

import pandas as pd
from apportion.experiments.traces.base import (
    ANY_SECONDS,
    GPUS,
    ITERATIONS,
    POSITIVE_COUNT,
    SECONDS,
    SimJob,
    Trace,
    elasticity,
    is_missing,
    read_trace_csv,
    sorted_jobs,
)

from apportion.errors import InputError

log = logging.getLogger(__name__)

REQUIRED = ("job_id", "submit_time_s", "num_gpus", "duration_s")


def load_normalised_csv(path: str | Path, limit: int | None = None, fmt: str = "") -> Trace:
    """Read a normalised CSV; optional columns fill the matching SimJob fields (``model``
    only as the ground-truth key, ``job_type``: which truth knows it is the format's
    business). ``fmt``: the format's name the trace carries.

    Jobs without a duration and without iterations are dropped (noted)."""
    p = Path(path)
    text, table = read_trace_csv(
        p, REQUIRED, "job_id",
        {"submit_time_s": SECONDS, "num_gpus": GPUS, "duration_s": ANY_SECONDS,
         "iterations": ITERATIONS, "total_steps": ITERATIONS,
         "v100_est_duration_s": ANY_SECONDS, "batch_size": POSITIVE_COUNT,
         "deadline_s": ANY_SECONDS, "max_gpus": POSITIVE_COUNT},
        optional=frozenset({"duration_s", "iterations", "total_steps", "v100_est_duration_s",
                            "deadline_s", "max_gpus"}))
    elastic = [elasticity(table, i) for i in range(len(table) if limit is None
                                                   else min(limit, len(table)))]
    try:
        df = pd.read_csv(io.StringIO(text), nrows=limit, dtype={"job_id": str})
    except Exception as exc:  # noqa: BLE001 (pandas raises many types for bad CSV)
        raise InputError(str(p), "(file)", f"not a readable CSV: {exc}") from None
    jobs: list[SimJob] = []
    dropped = 0
    has = set(df.columns)
    for k, r in enumerate(df.itertuples(index=False)):
        d = r._asdict()
        dur = d.get("duration_s")
        dur = None if is_missing(dur) else float(dur)
        iters = d.get("iterations", d.get("total_steps"))
        iters = None if is_missing(iters) else float(iters)
        if dur is None and "v100_est_duration_s" in has:
            dur = float(d["v100_est_duration_s"])
        gpus = int(d["num_gpus"])
        if gpus <= 0 or ((dur is None or dur <= 0) and not iters):
            dropped += 1
            continue
        model = d.get("model") if "model" in has else None
        dl = d.get("deadline_s") if "deadline_s" in has else None
        jobs.append(SimJob(
            job_id=str(d["job_id"]), submit_s=float(d["submit_time_s"]), gpus=gpus,
            iterations=iters or 0.0, job_type=str(model) if model is not None else "unknown",
            model=None, batch=int(d["batch_size"]) if "batch_size" in has else 1,
            gpu_type=str(d["gpu_type"]) if "gpu_type" in has and isinstance(d["gpu_type"], str)
            else None,
            tenant=str(d.get("tenant", d.get("cluster", "default"))),
            deadline_s=None if dl is None or is_missing(dl) else float(dl),
            duration_s=dur, max_gpus=elastic[k][0], elastic=elastic[k][1]))
    notes = []
    if dropped:
        log.info("%s: dropped %d jobs without duration or GPUs", p, dropped)
        notes.append(f"dropped {dropped} rows with zero or missing duration or GPUs")
    unordered = sum(1 for a, b in itertools.pairwise(jobs) if b.submit_s < a.submit_s)
    if unordered:
        log.info("%s: %d submit times out of order; sorted", p, unordered)
        notes.append(f"{unordered} submit times out of order (sorted)")
    return Trace(p.stem, sorted_jobs(jobs), str(p), notes, fmt)
