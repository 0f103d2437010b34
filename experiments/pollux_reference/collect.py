"""Turn runs of Pollux's own simulator into the reference CSVs beside this file.

Two sources, each a row per (policy, load, workload) with the average, p99 and makespan of
the jobs' completion times:

* ``--published DIR``: the raw results the Pollux artifact ships (``results-jobload/
  <policy>-<load>/summary.json``: every job's JCT per workload, from the authors' own runs);
* ``--runs DIR``: this project's reruns of the unmodified simulator, one per workload, as
  ``run_one.sh`` in the README leaves them (``<policy>-<folder>-<n>.jsonl.gz``: the
  simulator's ``--output`` log, whose last record holds every job's submission and
  completion time, and ``<policy>-<folder>-<n>.done``: ``policy,folder,n,rc,start,end``).

The makespan is the last completion, measured from time 0 (the first arrival is near 0),
as the artifact's own ``plot.py`` computes it: ``max(arrival + JCT)``. p99 is numpy's
linear-interpolated percentile, as apportion's metrics compute it.

    python -m apportion.experiments.pollux_reference.collect \\
        --published /tmp/adaptdl/simulator/results-jobload --runs /tmp/pollux-runs/out \\
        --workloads ../shared/data/pollux --out experiments/pollux_reference
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from apportion.experiments.pollux_reference import LOAD_FOLDERS, POLICIES, WORKLOADS

FIELDS = ("policy", "load", "workload", "jobs", "finished", "avg_jct_s", "p99_jct_s",
          "makespan_s")


def arrivals(workloads: Path, load: float, n: int) -> dict[str, float]:
    """Job name -> arrival second, from ``workload-<n>.csv`` of the load's folder."""
    with (workloads / LOAD_FOLDERS[load] / f"workload-{n}.csv").open(newline="") as f:
        return {r["name"]: float(r["time"]) for r in csv.DictReader(f)}


def summarise(jcts: Mapping[str, float], arrive: Mapping[str, float]) -> dict[str, object]:
    """The row's figures from each job's JCT (finished jobs only) and arrival."""
    values = np.array(list(jcts.values()), dtype=float)
    return {"jobs": len(arrive), "finished": len(jcts),
            "avg_jct_s": round(float(values.mean()), 4),
            "p99_jct_s": round(float(np.percentile(values, 99)), 4),
            "makespan_s": round(max(arrive[k] + v for k, v in jcts.items()), 4)}


def published_rows(results: Path, workloads: Path) -> Iterable[dict[str, object]]:
    for policy in POLICIES:
        for load in LOAD_FOLDERS:
            summary = json.loads((results / f"{policy}-{load}" / "summary.json").read_text())
            for n in WORKLOADS:
                jcts = summary["jcts"][f"workload-{n}"]
                yield {"policy": policy, "load": load, "workload": n,
                       **summarise(jcts, arrivals(workloads, load, n))}


def last_record(log: Path) -> dict[str, Any]:
    """The simulator's last log record (one JSON object a line)."""
    last = ""
    with gzip.open(log, "rt") as f:
        for line in f:
            if line.strip():
                last = line
    return json.loads(last)


def rerun_rows(runs: Path, workloads: Path) -> Iterable[dict[str, object]]:
    folder_load = {v: k for k, v in LOAD_FOLDERS.items()}
    for done in sorted(runs.glob("*.done")):
        policy, folder, n, rc, start, end = done.read_text().strip().split(",")
        load, n_i = folder_load[folder], int(n)
        row: dict[str, object] = {"policy": policy, "load": load, "workload": n_i,
                                  "rc": int(rc), "wall_s": round(float(end) - float(start), 1)}
        log = runs / f"{policy}-{folder}-{n}.jsonl.gz"
        if int(rc) == 0 and log.exists():
            rec = last_record(log)
            jcts = {j["name"]: j["completion_time"] - j["submission_time"]
                    for j in rec["submitted_jobs"] if j["completion_time"] is not None}
            row.update(summarise(jcts, arrivals(workloads, load, n_i)))
        yield row


def write(rows: Iterable[dict[str, object]], path: Path, fields: tuple[str, ...]) -> int:
    ordered = sorted(rows, key=lambda r: (POLICIES.index(str(r["policy"])), r["load"],
                                          r["workload"]))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(ordered)
    return len(ordered)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--published", type=Path, help="the artifact's results-jobload folder")
    p.add_argument("--runs", type=Path, help="the folder run_one.sh wrote")
    p.add_argument("--workloads", type=Path, required=True, help="Pollux's data folder")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.published:
        n = write(published_rows(a.published, a.workloads), a.out / "published.csv", FIELDS)
        print(f"published.csv: {n} rows")
    if a.runs:
        n = write(rerun_rows(a.runs, a.workloads), a.out / "rerun.csv",
                  (*FIELDS, "rc", "wall_s"))
        print(f"rerun.csv: {n} rows")


if __name__ == "__main__":
    main()
