"""Pollux's own simulator's figures on its 8 workloads at 4 loads (the references).

Two tables beside this file (``README.md`` says how each was produced):

* ``published.csv``: the raw results the Pollux artifact ships (petuum/adaptdl @ c793c70,
  ``simulator/results-jobload``), every policy x load x workload: the authors' own runs;
* ``rerun.csv``: this project's runs of the same simulator, unmodified, on this machine
  (Pollux's policy draws random numbers without a seed, so its reruns differ a little).

:func:`reference` gives one row; apportion's replays of a workload are held to the
``pollux`` rows (issue 60: apportion's average JCT below Pollux's at every load).
"""

from __future__ import annotations

import csv
from importlib import resources

#: relative job load -> the workload folder Pollux names it by
LOAD_FOLDERS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5",
                2.0: "workloads-2.0"}
POLICIES = ("pollux", "optimus", "tiresias")
WORKLOADS = tuple(range(1, 9))

#: Pollux's round rules, as its simulator keeps them (README.md): a round every 60 s, and 30 s
#: without progress whenever a job gets a new allocation, its first one included. The
#: ``pollux`` replay profile is these: ``SimConfig(**ROUND_RULES, profile="pollux")``.
ROUND_RULES = {"interval_s": 60.0, "restart_cost_s": 30.0, "start_cost_s": 30.0}
#: Pollux's cluster, as the bundled name (16 nodes x 4 NVIDIA T4)
CLUSTER = "pollux-64"

SOURCES = ("published", "rerun")
_NUMBERS = ("avg_jct_s", "p99_jct_s", "makespan_s", "wall_s")


def table(source: str = "published") -> list[dict[str, object]]:
    """Every row of ``<source>.csv``, numbers as numbers (empty cells as None)."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r}: one of {', '.join(SOURCES)}")
    text = resources.files(__name__).joinpath(f"{source}.csv").read_text()
    rows: list[dict[str, object]] = []
    for r in csv.DictReader(text.splitlines()):
        row: dict[str, object] = {"policy": r["policy"], "load": float(r["load"]),
                                  "workload": int(r["workload"])}
        for k, v in r.items():
            if k in row:
                continue
            if v in ("", None):
                row[k] = None
            elif k in _NUMBERS:
                row[k] = float(v)
            else:
                row[k] = int(v)
        rows.append(row)
    return rows


def reference(load: float, workload: int, policy: str = "pollux",
              source: str = "published") -> dict[str, object]:
    """The row of ``policy`` on ``workload-<workload>.csv`` at relative ``load``."""
    for row in table(source):
        if (row["policy"], row["load"], row["workload"]) == (policy, float(load), workload):
            return row
    raise KeyError(f"no {source} reference for {policy} on workload {workload} at load {load}")


__all__ = ["CLUSTER", "LOAD_FOLDERS", "POLICIES", "ROUND_RULES", "SOURCES", "WORKLOADS",
           "reference", "table"]
