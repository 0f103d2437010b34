"""Schedule quality in Crius's setting (issue 13, item 7): apportion against every baseline.

    python -m apportion.experiments.quality [--traces philly-d1,philly-d4,crius-venus,...]
        [--policies fcfs,srtf,...,apportion,apportion-oracle] [--seeds 3] [--workers 2]
        [--budget 5] [--max-jobs N] [--runs DIR] [--name quality_crius]

Traces (all on Crius's 1,280-GPU cluster, table 1):

* ``philly-dN`` — day N of the 14-day, ~13,000-job Philly window of ``apportion
  bench sim`` (the window the Crius 8.4 reproduction's "Philly day 1" is the first day
  of), adapted as Crius 8.1 with the run's seed: each seed draws other models, batch
  sizes, GPU counts and types, so seeds are different workloads;
* ``crius-venus``, ``crius-pai`` — Crius's own adapted traces (438 and 125 jobs).
  They are fixed files: a seed changes nothing there but a randomised policy's draws
  (the confidence interval of a deterministic policy is then 0).

``apportion`` schedules on its analytic estimates; ``apportion-oracle`` is the same
policy fed the simulator's measured rates (``Optimising(oracle=True)``), as every
baseline is. Each run is written under ``--runs`` (resumable: a finished run has its
``summary.json``), then one markdown table per trace and one JSON with mean and 95 %
confidence interval (Student's t over seeds) of average and p99 JCT are written to
``experiments/results/<name>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_TRACES = ("philly-d1", "philly-d4", "philly-d7", "philly-d10", "philly-d13",
                  "crius-venus", "crius-pai")
BASELINES = ("fcfs", "srtf", "tiresias", "gandiva", "gavel", "gavel-max-min-fairness",
             "elasticflow-ls", "sia", "crius-greedy")
APPORTION = ("apportion", "apportion-oracle")
DAY = 86400.0


def load(trace: str, seed: int, max_jobs: int | None = None) -> tuple[Any, Any]:
    """(trace, ground truth) for a trace name of this module (see the module docstring)."""
    from apportion.experiments.bench.sim import bench_trace
    from apportion.experiments.harness import crius_cluster, resolve

    m = re.fullmatch(r"philly-d(\d+)", trace)
    if m:
        day = int(m.group(1))
        if not 1 <= day <= 14:
            raise ValueError(f"{trace}: the Philly window has days 1..14")
        t, truth = bench_trace(14.0, seed=seed)
        t = t.window((day - 1) * DAY, day * DAY)
    else:
        t, truth = resolve(trace, crius_cluster(), seed)
    if max_jobs:
        t = t.head(max_jobs)
    return t, truth


def make(policy: str, budget: float) -> Any:
    from apportion.experiments.policies import make_policy

    if policy == "apportion-oracle":
        pol = make_policy("apportion", time_budget_s=budget, oracle=True)
        pol.name = policy
        return pol
    if policy.startswith("apportion"):
        return make_policy(policy, time_budget_s=budget)
    return make_policy(policy)


def run_dir(runs: Path, trace: str, policy: str, seed: int) -> Path:
    return runs / trace / f"{policy}-s{seed}"


def _one(args: tuple[str, str, int, float, int | None, str]) -> dict[str, Any]:
    trace, policy, seed, budget, max_jobs, runs = args
    from apportion.experiments.harness import crius_cluster, write_run
    from apportion.experiments.simulator import SimConfig, Simulator

    out = run_dir(Path(runs), trace, policy, seed)
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    t, truth = load(trace, seed, max_jobs)
    t0 = time.perf_counter()
    res = Simulator(crius_cluster(), t, make(policy, budget), truth, SimConfig(seed=seed)).run()
    res.summary["wall_s"] = round(time.perf_counter() - t0, 1)
    res.summary["quality_trace"] = trace
    write_run(res, out)
    return res.summary


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student's t; 0 for one value)."""
    a = np.asarray([x for x in xs if x is not None and math.isfinite(x)], dtype=float)
    if len(a) == 0:
        return math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), 0.0
    half = float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return float(a.mean()), half


def aggregate(runs: Path, traces: list[str], policies: list[str], seeds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tr in traces:
        rows = []
        for p in policies:
            summ = [json.loads(f.read_text()) for s in range(seeds)
                    if (f := run_dir(runs, tr, p, s) / "summary.json").exists()]
            if not summ:
                continue
            h = [x["avg_jct_s"] / 3600 if x.get("avg_jct_s") is not None else math.nan for x in summ]
            h99 = [x["p99_jct_s"] / 3600 if x.get("p99_jct_s") is not None else math.nan for x in summ]
            q = [x["avg_queue_s"] / 3600 if x.get("avg_queue_s") is not None else math.nan for x in summ]
            avg, avg_ci = mean_ci(h)
            p99, p99_ci = mean_ci(h99)
            rows.append({"policy": p, "seeds": len(summ), "jobs": float(np.mean([x["jobs"] for x in summ])),
                         "finished": float(np.mean([x["finished"] for x in summ])),
                         "avg_jct_h": avg, "avg_jct_ci95_h": avg_ci, "p99_jct_h": p99,
                         "p99_jct_ci95_h": p99_ci, "avg_queue_h": mean_ci(q)[0],
                         "avg_restarts": float(np.mean([x.get("avg_restarts") or 0.0 for x in summ])),
                         "utilization": float(np.mean([x.get("utilization") or 0.0 for x in summ])),
                         "wall_s": float(np.mean([x.get("wall_s") or x.get("sim_wall_s") or 0 for x in summ])),
                         "per_seed_avg_jct_h": h, "per_seed_p99_jct_h": h99})
        if rows:
            out[tr] = {"rows": rows, **_ranks(rows)}
    return out


def _ranks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Which policy has the lowest mean average / p99 JCT, and apportion's place."""
    info: dict[str, Any] = {}
    for key in ("avg_jct_h", "p99_jct_h"):
        order = sorted(rows, key=lambda r: r[key])
        info[f"best_{key}"] = order[0]["policy"]
        for name in APPORTION:
            ranked = [r["policy"] for r in order]
            if name in ranked:
                info[f"rank_{name}_{key}"] = ranked.index(name) + 1
    return info


def _fmt(v: float, ci: float | None = None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.2f}" if ci is None else f"{v:.2f} ± {ci:.2f}"


def write(agg: dict[str, Any], name: str, meta: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [f"# Schedule quality on Crius's 1,280-GPU cluster ({name})", "",
             "Mean ± 95 % confidence half-width over seeds (Student's t). JCT in hours over finished",
             "jobs. `apportion`: analytic estimates; `apportion-oracle`: the simulator's measured",
             "rates, as every baseline sees them. " + meta.get("note", ""), "",
             f"Machine: {meta['machine']}. Seeds: {meta['seeds']}. Solver budget: {meta['budget']} s.",
             ""]
    for tr, block in agg.items():
        lines += [f"## {tr}", "",
                  "| policy | seeds | finished/jobs | avg JCT (h) | p99 JCT (h) | avg queue (h) | restarts/job | util | wall (s) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        best_avg, best_p99 = block["best_avg_jct_h"], block["best_p99_jct_h"]
        for r in sorted(block["rows"], key=lambda r: r["avg_jct_h"]):
            avg = _fmt(r["avg_jct_h"], r["avg_jct_ci95_h"])
            p99 = _fmt(r["p99_jct_h"], r["p99_jct_ci95_h"])
            avg = f"**{avg}**" if r["policy"] == best_avg else avg
            p99 = f"**{p99}**" if r["policy"] == best_p99 else p99
            lines.append(f"| {r['policy']} | {r['seeds']} | {r['finished']:.0f}/{r['jobs']:.0f} | {avg} | {p99} "
                         f"| {_fmt(r['avg_queue_h'])} | {r['avg_restarts']:.2f} | {r['utilization']:.3f} "
                         f"| {r['wall_s']:.0f} |")
        lines.append("")
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "traces": agg}, indent=1,
                                                     default=float) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m apportion.experiments.quality")
    ap.add_argument("--traces", default=",".join(DEFAULT_TRACES))
    ap.add_argument("--policies", default=",".join(BASELINES + APPORTION))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=float, default=5.0, help="solver budget per round (s), the policy default")
    ap.add_argument("--max-jobs", type=int, default=None)
    ap.add_argument("--runs", default=str(Path(__file__).resolve().parents[1] / "results" / "quality-runs"))
    ap.add_argument("--name", default="quality_crius")
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    traces = [t for t in a.traces.split(",") if t]
    policies = [p for p in a.policies.split(",") if p]
    runs = Path(a.runs)
    # the slow policies first, so the workers stay busy to the end
    jobs = sorted(((t, p, s, a.budget, a.max_jobs, str(runs)) for t in traces for p in policies
                   for s in range(a.seeds)), key=lambda j: (not j[1].startswith("apportion"), j[0], j[2]))
    todo = [j for j in jobs if not (run_dir(runs, j[0], j[1], j[2]) / "summary.json").exists()]
    if todo:
        with mp.get_context("spawn").Pool(max(1, min(a.workers, len(todo)))) as pool:
            for s in pool.imap_unordered(_one, todo):
                print(f"{s.get('quality_trace')} {s['policy']} seed {s['seed']}: avg JCT "
                      f"{(s.get('avg_jct_s') or math.nan) / 3600:.3f} h, wall {s.get('wall_s')} s", flush=True)
    meta = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
            "seeds": a.seeds, "budget": a.budget, "max_jobs": a.max_jobs, "note": a.note,
            "policies": policies, "traces": traces}
    path = write(aggregate(runs, traces, policies, a.seeds), a.name, meta)
    print(path)
    return path


if __name__ == "__main__":
    main()
