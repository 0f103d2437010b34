"""Put today's lower bound (experiments/lower_bound.py) into quality runs without replaying
them: the bound reads only the trace, the cluster, the truth and the round rules, never a
policy's replay, so each row's bound is computed again for each seed the row replayed and
written into its ``summary.csv``:

* ``avg_jct_lower_bound_s``: the mean over the seeds of the bound (every job until it
  finishes);
* ``avg_jct_all_lower_bound_s`` and ``avg_jct_to_bound`` (``avg_jct_all_s`` over that mean)
  for a policy that finished every job in every seed; n/a for one that did not: the bound
  its all-jobs average is compared with counts each job until its replay's end, which the
  run does not keep;
* ``avg_jct_to_bound_ci95`` emptied (the per-seed averages are not kept) and
  ``bound_of_means`` true, so ``summarise.py`` prints the ratio ``≈``: the mean JCT over the
  mean bound, not the mean of per-seed ratios.

    python experiments/results/quality/rebound.py experiments/results/quality/runs/ROW ...

Each run's folder name is its row (``ROWS``, the rows ``rows.py`` replays); a Philly day's
trace is ``traces/philly-dN.csv`` under the current folder (``philly_days.py`` writes it).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from apportion.experiments.harness import cluster_from_arg, resolve
from apportion.experiments.lower_bound import bound_summary
from apportion.experiments.objective_default import ROWS
from apportion.experiments.simulator import PROFILES, Simulator

from apportion.policies import make_policy


def row_bounds(name: str, seeds: int) -> list[float]:
    """The row's bound (every job until it finishes) for seeds 0 .. seeds - 1."""
    row = ROWS[name]
    cl = cluster_from_arg(row.cluster)
    out = []
    for seed in range(seeds):
        t, truth = resolve(row.trace, cl, seed)
        if row.max_jobs:
            t = t.head(row.max_jobs)
        cfg = replace(PROFILES[row.profile], information="oracle")
        sim = Simulator(cl, t, make_policy("fcfs"), truth, cfg)  # the truth as replays see it
        every = {"jobs": len(t.jobs), "finished": len(t.jobs)}
        got = bound_summary(t.jobs, sim.truth, cl, every, None, cfg.start_cost_s,
                            cfg.interval_s)
        out.append(float(got["avg_jct_lower_bound_s"]))
    return out


def rebound(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "summary.csv")
    seeds = int(df["seeds"].max())
    bound = float(np.mean(row_bounds(run.name, seeds)))
    every = df["finished"] >= df["jobs"]
    avg = df["avg_jct_all_s"].where(df["avg_jct_all_s"].notna(), df["avg_jct_s"])
    df["avg_jct_lower_bound_s"] = bound
    df["avg_jct_all_lower_bound_s"] = np.where(every, bound, np.nan)
    df["avg_jct_to_bound"] = np.where(every, avg / bound, np.nan)
    df["avg_jct_to_bound_ci95"] = np.nan
    df["bound_of_means"] = True
    df.to_csv(run / "summary.csv", index=False)
    return df


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        d = rebound(Path(arg))
        print(f"{Path(arg).name}: bound {d['avg_jct_lower_bound_s'].iloc[0]:.1f} s; "
              f"avg / bound {d['avg_jct_to_bound'].min():.2f}-{d['avg_jct_to_bound'].max():.2f}")
