"""Metrics of a simulated run: per-job table, timeline aggregates, the summary.

Definitions (the summary keys are a contract of ``apportion simulate --json``):

* ``jct`` = finish - submit; ``queueing delay`` = first start - submit;
* ``makespan_s`` = last finish - first submit;
* ``utilization`` = GPU-seconds held by jobs / (GPUs x makespan) (Gavel's
  definition: busy workers over total worker time), also per GPU type;
* ``throughput`` = samples/s at ground truth, averaged over rounds and peak;
* ``deadline_ratio`` = jobs finished by their deadline / jobs with a deadline
  (ElasticFlow's deadline satisfactory ratio);
* ``ftf_rho`` (finish-time fairness, Themis): JCT / the job's isolated time on
  what it asked for (iterations / true rate of its requested GPUs of its
  requested type, or of its best type); mean and max;
* ``restarts`` per job; solver time per round; fallbacks taken;
* ``avg_jct_all_s`` / ``p99_jct_all_s``: over *every* job, an unfinished one counted
  as in the system until the replay's end (a lower bound on its JCT). ``avg_jct_s``
  averages finished jobs only, which flatters a policy that leaves its long jobs
  unstarted; the quality tables rank by this one.
* ``sla_kept``: of the *guaranteed* jobs (Morphling's SLA jobs), the share that
  finished no later than their SLA time stretched by ``SLA_TOLERANCE``, plus the
  replay's unavoidable waits (``sla_slack_s``: until the next round, and the first
  start's cost). The SLA time (``sla_s``) is Morphling's promise: the job's time on
  what it asked for under the plan it asked for (its trace's ``exec_plan``, in the
  fastest measured placement); a job with no plan of its own is promised its
  ``isolated_s`` (the fastest plan on its request). A guaranteed job queued, preempted or
  slowed past that, or left unfinished, broke its SLA; ``sla_jobs`` counts the
  guaranteed jobs measured (None and 0 when the trace has none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from apportion.cluster import Cluster

JOB_COLUMNS = ["job_id", "submit_s", "gpus", "gpu_type", "job_type", "model", "tenant",
               "guaranteed", "iterations", "done", "first_start_s", "finish_s", "jct_s",
               "queue_s", "restarts", "preemptions", "gpu_seconds", "deadline_s", "met_deadline",
               "isolated_s", "ftf_rho", "finished", "dropped", "sla_s", "run_mode"]


def run_mode(js: Any) -> str:
    """How a fine-tuning job ran (YMIR's modes, fixed at its first start): ``merged into
    <lead>``, ``leads <members>``, ``from <source>`` (started from a finished sibling's
    weights), or empty (alone; every other job)."""
    lead = getattr(js, "merged_into", None)
    if lead:
        return f"merged into {lead}"
    members = getattr(js, "members", ())
    if members:
        return "leads " + ",".join(members)
    src = (getattr(js, "mode", None) or {}).get("source")
    return f"from {src.job_id}" if src is not None else ""


def _isolated(js: Any, truth: Any) -> float:
    j = js.trace
    types = [j.gpu_type] if j.gpu_type else []
    best = 0.0
    for t in types or ["A100-40GB", "A40", "A10", "V100-32GB", "A800-80GB", "P100", "K80"]:
        try:
            best = max(best, float(truth.rate(j, t, j.gpus)))
        except Exception:  # a truth that does not know the type
            continue
    return j.iterations / best if best > 0 else math.nan


def _sla_time(js: Any, truth: Any, isolated: float) -> float:
    """A guaranteed job's promised time: its own plan on its request (see the docstring)."""
    j = js.trace
    if not j.guaranteed:
        return math.nan
    if j.plan and j.gpu_type:
        try:
            rate = float(truth.rate(j, j.gpu_type, j.gpus, None, j.plan))
        except Exception:  # noqa: BLE001 - a truth without plans: the isolated time
            rate = 0.0
        if rate > 0:
            return j.iterations / rate
    return isolated


def job_frame(done: list[Any], unfinished: list[Any], truth: Any) -> pd.DataFrame:
    rows = []
    for js, fin in [(x, True) for x in done] + [(x, False) for x in unfinished]:
        j = js.trace
        jct = (js.finish - j.submit_s) if fin and js.finish is not None else math.nan
        iso = _isolated(js, truth)
        rows.append({
            "job_id": j.job_id, "submit_s": j.submit_s, "gpus": j.gpus, "gpu_type": j.gpu_type,
            "job_type": j.job_type, "model": j.model, "tenant": j.tenant,
            "guaranteed": j.guaranteed, "iterations": j.iterations, "done": js.done,
            "first_start_s": js.first_start, "finish_s": js.finish if fin else None,
            "jct_s": jct,
            "queue_s": (js.first_start - j.submit_s) if js.first_start is not None else math.nan,
            "restarts": js.restarts, "preemptions": js.preemptions, "gpu_seconds": js.gpu_seconds,
            "deadline_s": j.deadline_s,
            "met_deadline": (bool(fin and js.finish is not None and js.finish <= j.deadline_s)
                             if j.deadline_s is not None else None),
            "isolated_s": iso, "ftf_rho": jct / iso if iso and iso > 0 and fin else math.nan,
            "finished": fin, "dropped": bool(getattr(js, "dropped", False)),
            "sla_s": _sla_time(js, truth, iso), "run_mode": run_mode(js),
        })
    df = pd.DataFrame(rows, columns=JOB_COLUMNS)
    return df.sort_values(["submit_s", "job_id"], kind="stable").reset_index(drop=True)


SLA_TOLERANCE = 0.05  # a guaranteed job may finish 5 % later than its promised time


def sla_kept(jobs: pd.DataFrame, slack_s: float = 0.0) -> tuple[float | None, int]:
    """(share of guaranteed jobs that kept their SLA, how many were measured): see the
    module docstring. A guaranteed job with no SLA time (a truth that does not know its
    type) is not measured."""
    if not len(jobs) or "guaranteed" not in jobs:
        return None, 0
    g = jobs[jobs["guaranteed"].astype(bool) & jobs["sla_s"].notna()]
    if not len(g):
        return None, 0
    limit = g["sla_s"].to_numpy(dtype=float) * (1.0 + SLA_TOLERANCE) + slack_s
    jct = g["jct_s"].to_numpy(dtype=float)
    kept = g["finished"].to_numpy(dtype=bool) & (np.nan_to_num(jct, nan=np.inf) <= limit)
    return round(float(kept.mean()), 4), len(g)


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else round(x, 4)


def jct_all(jobs: pd.DataFrame, end_s: float) -> np.ndarray:
    """Every job's JCT, an unfinished one's as ``end_s - submit`` (at least 0): a lower
    bound, so a policy cannot gain by leaving jobs unfinished."""
    if not len(jobs):
        return np.zeros(0)
    jct = jobs["jct_s"].to_numpy(dtype=float)
    open_ = np.maximum(0.0, end_s - jobs["submit_s"].to_numpy(dtype=float))
    return np.where(jobs["finished"].to_numpy(dtype=bool), jct, open_)


def summarize(jobs: pd.DataFrame, timeline: pd.DataFrame, rounds: pd.DataFrame,
              cluster: Cluster, t0: float, end_s: float | None = None,
              sla_slack_s: float = 0.0) -> dict[str, Any]:
    """The summary; ``end_s`` is when the replay stopped (default: its last finish or
    timeline sample); ``sla_slack_s`` the waits no policy can avoid (see ``sla_kept``)."""
    fin = jobs[jobs["finished"]]
    jct = fin["jct_s"].to_numpy(dtype=float)
    out: dict[str, Any] = {"jobs": len(jobs), "finished": len(fin),
                           "dropped": int(jobs["dropped"].sum()) if len(jobs) else 0}
    modes = (jobs["run_mode"].fillna("").astype(str) if "run_mode" in jobs
             else pd.Series([], dtype=str))
    out["merged_jobs"] = int(modes.str.startswith(("merged into", "leads")).sum())
    out["transferred_jobs"] = int(modes.str.startswith("from ").sum())
    out["avg_jct_s"] = _f(jct.mean()) if len(jct) else None
    out["median_jct_s"] = _f(np.median(jct)) if len(jct) else None
    out["p95_jct_s"] = _f(np.percentile(jct, 95)) if len(jct) else None
    out["p99_jct_s"] = _f(np.percentile(jct, 99)) if len(jct) else None
    if end_s is None:
        ends = [float(fin["finish_s"].max())] if len(fin) else []
        if len(timeline) and "t" in timeline:
            ends.append(float(timeline["t"].max()))
        end_s = max(ends) if ends else 0.0
    every = jct_all(jobs, end_s)
    out["avg_jct_all_s"] = _f(every.mean()) if len(every) else None
    out["p99_jct_all_s"] = _f(np.percentile(every, 99)) if len(every) else None
    out["avg_queue_s"] = _f(fin["queue_s"].mean()) if len(fin) else None
    out["sla_kept"], out["sla_jobs"] = sla_kept(jobs, sla_slack_s)
    first = float(jobs["submit_s"].min()) if len(jobs) else 0.0
    last = float(fin["finish_s"].max()) if len(fin) else first
    span = max(0.0, last - first)
    out["makespan_s"] = _f(span)
    cap = cluster.capacity_by_type()
    total = sum(cap.values())
    if len(timeline) and span > 0:
        dt = float(timeline["t"].diff().dropna().min()) if len(timeline) > 1 else span
        dt = dt if dt > 0 else span
        busy = {g: float(timeline.get(f"busy_{g}", pd.Series(dtype=float)).sum() * dt)
                for g in cap}
        out["utilization"] = _f(sum(busy.values()) / (total * span))
        out["utilization_by_type"] = {g: _f(busy[g] / (cap[g] * span)) for g in sorted(cap)}
        thr = timeline["throughput_samples_s"]
        out["avg_throughput_samples_s"] = _f(thr.mean())
        out["peak_throughput_samples_s"] = _f(thr.max())
        out["avg_queue_len"] = _f(timeline["queued"].mean())
    else:
        out["utilization"] = 0.0
        out["utilization_by_type"] = {g: 0.0 for g in sorted(cap)}
        out["avg_throughput_samples_s"] = out["peak_throughput_samples_s"] = 0.0
        out["avg_queue_len"] = 0.0
    out["avg_restarts"] = _f(jobs["restarts"].mean()) if len(jobs) else 0.0
    dl = jobs[jobs["deadline_s"].notna()]
    out["deadline_ratio"] = _f(dl["met_deadline"].astype(bool).mean()) if len(dl) else None
    rho = fin["ftf_rho"].to_numpy(dtype=float)
    rho = rho[~np.isnan(rho)]
    out["ftf_rho_mean"] = _f(rho.mean()) if len(rho) else None
    out["ftf_rho_max"] = _f(rho.max()) if len(rho) else None
    if len(rounds):
        out["rounds"] = len(rounds)
        out["solver_s_mean"] = _f(rounds["solver_s"].mean())
        out["solver_s_max"] = _f(rounds["solver_s"].max())
        out["policy_s_total"] = _f(rounds["policy_s"].sum())
        # the solvers' work in nominal seconds (a deterministic budget's count, beside the
        # seconds: it does not move with the machine's load)
        out["solver_work_s_total"] = _f(rounds["work_s"].sum()) if "work_s" in rounds else 0.0
        out["fallbacks"] = int(rounds["fallback"].sum())
        # the optimising policies' proven gaps (a bound on each round's model; Gavel's: the
        # LP's optimum over its rounding): how far from optimal the rounds were, where known
        gaps = pd.to_numeric(rounds["gap"], errors="coerce").dropna() if "gap" in rounds \
            else pd.Series(dtype=float)
        out["rounds_with_bound"] = len(gaps)
        out["gap_mean"] = _f(gaps.mean()) if len(gaps) else None
        out["gap_max"] = _f(gaps.max()) if len(gaps) else None
    else:
        out.update(rounds=0, solver_s_mean=0.0, solver_s_max=0.0, policy_s_total=0.0,
                   solver_work_s_total=0.0, fallbacks=0)
    return out


def jct_cdf(jobs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(jobs.loc[jobs["finished"], "jct_s"].to_numpy(dtype=float))
    return x, np.arange(1, len(x) + 1) / max(1, len(x))
