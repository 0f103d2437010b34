"""`apportion bench sim`: how fast the simulator replays a two-week, 10,000+ job trace.

The trace is a 14-day window of Microsoft Philly (``philly.csv``) holding
about 13,000 jobs (as Crius's "two-week traces of 13,000+ jobs"), adapted as Crius section 8.1 describes (models, batches,
GPU counts and types drawn with seed 0; iterations from duration x Crius's
measured throughput), replayed on Crius's 1,280-GPU cluster (table 1) with
5-minute rounds. Reports wall time, CPU time (the figure a loaded machine does
not stretch), the load average, rounds and rounds per second, rounds that fell
back to the greedy, and the schedule (average JCT, utilisation); the
information mode every policy sees is explicit (``--information``, the
replays' default ``estimated``). With ``--max-rounds`` only the first rounds are
replayed (the rate is still reported), so the optimising policy can be timed
without waiting hours. ``--mip-gap`` sets the solver chain's tolerance (an
answer that close to the best proven bound is final; from 1e-3 LP rounding goes
first). For a policy with a solver chain the report says where its time went
(:func:`chain_profile`): rounds by the chain that ran, each backend's seconds, and the
HiGHS runs stopped because their incumbent stalled.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from apportion.experiments import groundtruth as gt
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.bench.against import child_env, ratio
from apportion.experiments.harness import crius_cluster
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.solvers.chain import MIP_REL_GAP

from apportion.errors import InputError
from apportion.policies import make_policy, policy_names


def window_with(trace: tr.Trace, days: float, jobs: int) -> tuple[float, float]:
    """The first ``days`` window whose job count is closest to ``jobs``."""
    t = np.array([j.submit_s for j in trace.jobs])
    span = days * 86400.0
    counts = np.searchsorted(t, t + span, side="left") - np.arange(len(t))
    i = int(np.argmin(np.abs(counts - jobs)))
    return float(t[i]), float(t[i] + span)


def bench_trace(days: float = 14.0, seed: int = 0, jobs: int = 13000) -> tuple[tr.Trace, Any]:
    raw = catalog.load_trace("philly")
    s, e = window_with(raw, days, jobs)
    truth = gt.CriusTruth()
    return tr.adapt_crius(raw.window(s, e), truth, seed=seed), truth


def chain_profile(rounds: Any) -> dict[str, Any]:
    """Where the replay's solver time went: rounds by the chain that ran (backends in
    order, ``+``-joined), each backend's total wall, and the HiGHS runs stopped because
    their incumbent stalled (rounds and seconds). Empty for a policy without a chain."""
    if not len(rounds) or "chain" not in rounds.columns:
        return {}
    by_chain = rounds["chain"].fillna("").value_counts()
    per_backend: dict[str, float] = {}
    stalled_s = 0.0
    for chain, secs, stalled in zip(rounds["chain"].fillna(""), rounds["chain_s"].fillna(""),
                                    rounds["stalled"]):
        if not chain:
            continue
        for name, w in zip(chain.split("+"), secs.split("+")):
            per_backend[name] = per_backend.get(name, 0.0) + float(w)
            if stalled and name == "highs":
                stalled_s += float(w)
    return {"rounds_by_chain": {k or "(none)": int(v) for k, v in by_chain.items()},
            "solver_s_by_backend": {k: round(v, 2) for k, v in sorted(per_backend.items())},
            "highs_stalled_rounds": int(rounds["stalled"].sum()),
            "highs_stalled_s": round(stalled_s, 2)}


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far (MiB; None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kib / (1024.0 * 1024.0) if platform.system() == "Darwin" else kib / 1024.0, 1)


def check_policy(policy: str) -> None:
    """``bench sim --policy``: a registered policy, checked before the two-week trace is
    loaded (an unknown name surfaced only after it, as a KeyError)."""
    if policy not in policy_names():
        raise InputError("--policy", "policy", f"{policy!r} is not a policy; known: "
                         f"{', '.join(policy_names())}")


def main(policy: str = "fcfs", days: float = 14.0, time_budget: float = 2.0,
         max_rounds: int | None = None, information: str = "estimated",
         mip_gap: float = MIP_REL_GAP, deterministic: bool = False,
         persistent: bool | None = None) -> dict[str, Any]:
    """One replay of the bench window; ``persistent`` None: the policy's default (the kept
    LP, ``RoundConfig.persistent``)."""
    check_policy(policy)
    t0 = time.perf_counter()
    trace, truth = bench_trace(days)
    load_s = time.perf_counter() - t0
    opts: dict[str, Any] = {"time_budget_s": time_budget, "mip_gap": mip_gap} \
        if policy.startswith("apportion") else {}
    if persistent is not None and opts:
        opts["persistent"] = persistent
    cfg = SimConfig(max_sim_s=None if max_rounds is None else max_rounds * 300.0,
                    information=information, deterministic=deterministic,
                    jct_bound=False)  # the replay's speed alone
    pol = make_policy(policy, **opts)
    sim = Simulator(crius_cluster(), trace, pol, truth, cfg)
    load0 = os.getloadavg()[0]
    c1 = time.process_time()
    t1 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1
    s = res.summary
    rd = res.rounds
    return {
        "policy": policy, "information": information, "trace_jobs": len(trace),
        "trace_days": days, "cluster_gpus": 1280, "time_budget_s": time_budget,
        "mip_gap": mip_gap if policy.startswith("apportion") else None,
        "deterministic": deterministic,
        "persistent": bool(getattr(getattr(pol, "cfg", None), "persistent", False)),
        "rounds": s["rounds"], "finished": s["finished"], "sim_wall_s": round(wall, 2),
        "sim_cpu_s": round(cpu, 2), "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "rounds_per_s": round(s["rounds"] / wall, 2) if wall > 0 else None,
        "policy_s_total": s["policy_s_total"], "trace_load_s": round(load_s, 2),
        # the solvers' work (nominal seconds, solvers.base.WORK_PER_S): with
        # ``deterministic`` what the replay is timed by, the same on any machine
        "solver_work_s_total": s.get("solver_work_s_total", 0.0),
        "rounds_time_limited": s.get("rounds_time_limited", 0),
        "peak_rss_mib": peak_rss_mib(),
        **({"session": pol.session.stats.as_dict()} if getattr(pol, "session", None) else {}),
        "fallback_rounds": int(rd["fallback"].sum()) if len(rd) else 0,
        **chain_profile(rd),
        "avg_jct_s": s["avg_jct_s"], "median_jct_s": s.get("median_jct_s"),
        "utilization": s["utilization"],
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }


def side_by_side(against: str, policy: str = "fcfs", days: float = 14.0,
                 time_budget: float = 2.0, max_rounds: int | None = None,
                 information: str = "estimated", mip_gap: float = MIP_REL_GAP,
                 deterministic: bool = False, persistent: bool | None = None
                 ) -> dict[str, Any]:
    """The same replay by this install and by ``against`` (another install's interpreter,
    :func:`apportion.experiments.bench.against.check_against`), each a ``bench sim``
    process, both started together so they share the machine's minutes: ``this`` and
    ``against`` (each one's :func:`main` result, or its exit code and last error lines),
    ``ratios`` (this over against: CPU, wall, solver work, peak memory),
    ``avg_jct_change`` (relative) and ``same_schedule`` (the same rounds, finished jobs and
    average JCT: a deterministic replay of unchanged scheduling repeats exactly)."""
    args = ["bench", "sim", "--policy", policy, "--days", repr(days), "--time-budget",
            repr(time_budget), "--information", information, "--mip-gap", repr(mip_gap)]
    args += ["--max-rounds", str(max_rounds)] if max_rounds is not None else []
    args += ["--deterministic"] if deterministic else []
    # None: each install's own default (one from before the kept LP was the default builds
    # every LP afresh, and knows no --fresh)
    args += [] if persistent is None else ["--persistent"] if persistent else ["--fresh"]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ap-sim-") as tmp:
        procs = {}
        for code, python in (("this", sys.executable), ("against", against)):
            err = open(Path(tmp) / f"{code}.err", "w")  # a file: an hour's progress lines
            procs[code] = (subprocess.Popen(
                [python, "-m", "apportion.cli", *args, "--json", str(Path(tmp) / f"{code}.json")],
                cwd=tmp, env=child_env(), stdout=subprocess.DEVNULL, stderr=err), err)
        for code, (proc, err) in procs.items():
            rc = proc.wait()
            err.close()
            got = Path(tmp) / f"{code}.json"
            if rc == 0 and got.exists():
                out[code] = json.loads(got.read_text())
            else:
                lines = (Path(tmp) / f"{code}.err").read_text().strip().splitlines()
                out[code] = {"exit": rc, "error": lines[-3:]}
    a, b = out["this"], out["against"]
    out["ratios"] = {k: ratio(a.get(k), b.get(k)) for k in
                     ("sim_cpu_s", "sim_wall_s", "solver_work_s_total", "peak_rss_mib")}
    ja, jb = a.get("avg_jct_s"), b.get("avg_jct_s")
    out["avg_jct_change"] = round((ja - jb) / jb, 6) if ja is not None and jb else None
    out["same_schedule"] = all(k in a and a.get(k) == b.get(k)
                               for k in ("rounds", "finished", "avg_jct_s", "median_jct_s"))
    return out
