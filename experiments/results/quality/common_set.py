"""Average JCT over the jobs every policy finished (per seed), mean ± 95 % CI over seeds.

A policy that leaves jobs unfinished is flattered by an average over its own finished jobs
(the unfinished ones are usually the long ones); this compares every policy on the same
jobs instead. Reads ``apportion compare`` output folders (each ``POLICY-sSEED/jobs.csv``):

    python experiments/results/quality/common_set.py COMPARE_RUN_DIR [...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats


def common_set(run: Path) -> tuple[float, dict[str, tuple[float, float]]]:
    seeds: dict[int, dict[str, pd.DataFrame]] = {}
    for d in sorted(run.glob("*-s*")):
        if (d / "jobs.csv").exists():
            pol, seed = d.name.rsplit("-s", 1)
            seeds.setdefault(int(seed), {})[pol] = pd.read_csv(d / "jobs.csv")
    per: dict[str, list[float]] = {}
    sizes = []
    for dfs in seeds.values():
        common = set.intersection(*[set(df.loc[df.finished, "job_id"]) for df in dfs.values()])
        sizes.append(len(common))
        for pol, df in dfs.items():
            per.setdefault(pol, []).append(float(df.loc[df.job_id.isin(common), "jct_s"].mean()))
    out = {}
    for pol, v in per.items():
        ci = float(stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / np.sqrt(len(v))) \
            if len(v) > 1 else 0.0
        out[pol] = (float(np.mean(v)) / 3600.0, ci / 3600.0)
    return float(np.mean(sizes)), out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        n, res = common_set(Path(arg))
        ranked = sorted(res.items(), key=lambda kv: kv[1][0])
        print(f"| {Path(arg).name} | {n:.0f} | " + " | ".join(
            f"{p} {m:.3f} ± {c:.3f}" for p, (m, c) in ranked) + " |")
