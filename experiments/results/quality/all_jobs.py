"""Fill ``avg_jct_all_s`` into a summary from a run's per-job tables, for runs made before
the simulator reported it.

The all-jobs average counts an unfinished job as in the system until the replay's end.
A run's folder keeps its jobs (``POLICY-sSEED/jobs.csv``) but not when it stopped, so this
takes the last finish of that policy and seed as the end: earlier than the true end (the
simulator stops a few idle rounds later), so the figure is a lower bound on the
all-jobs average and flatters the policy that left jobs unfinished, never the others. Rows
filled this way are marked (``avg_jct_all_bound`` true; ``summarise.py`` prints them ``≥``).

    python experiments/results/quality/all_jobs.py SUMMARY_CSV COMPARE_RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from apportion.experiments.metrics import jct_all


def all_jobs_means(run: Path) -> dict[str, float]:
    """Per policy: the mean over seeds of the all-jobs average (end = last finish)."""
    per: dict[str, list[float]] = {}
    for d in sorted(run.glob("*-s*")):
        if not (d / "jobs.csv").exists():
            continue
        pol = d.name.rsplit("-s", 1)[0]
        df = pd.read_csv(d / "jobs.csv")
        df["finished"] = df["finished"].astype(bool)
        end = float(df.loc[df["finished"], "finish_s"].max()) if df["finished"].any() else 0.0
        per.setdefault(pol, []).append(float(jct_all(df, end).mean()))
    return {p: float(np.mean(v)) for p, v in per.items()}


def fill(summary_csv: Path, run: Path) -> pd.DataFrame:
    df = pd.read_csv(summary_csv)
    if "avg_jct_all_s" not in df.columns:
        df["avg_jct_all_s"] = np.nan
    if "avg_jct_all_bound" not in df.columns:
        df["avg_jct_all_bound"] = False
    means = all_jobs_means(run)
    for i, r in df.iterrows():
        if pd.isna(r["avg_jct_all_s"]) and r["policy"] in means:
            done = r["finished"] >= r["jobs"]
            df.loc[i, "avg_jct_all_s"] = r["avg_jct_s"] if done else means[r["policy"]]
            df.loc[i, "avg_jct_all_bound"] = not done
    df.to_csv(summary_csv, index=False)
    return df


if __name__ == "__main__":
    fill(Path(sys.argv[1]), Path(sys.argv[2]))
