"""apportion's replays of Pollux's 8 workloads at 4 loads, beside Pollux's own figures.

Each replay is what a user types (the harness's door, :func:`apportion.experiments.
harness.run_one`): ``simulate --trace <data>/pollux/<folder>/workload-N.csv --cluster
pollux-64 --profile pollux --policy P --information I --deterministic``, seed 0. Rows are
appended to ``<out>/replays.csv`` as each run ends (a row already there is skipped: the
grid resumes), and ``<out>/replays.md`` puts every policy's average JCT beside Pollux's
published figure for the same workload and load (``published.csv``):

    python -m apportion.experiments.pollux_reference.grid --policies apportion,tiresias \\
        --information oracle --loads 0.5,1.0,1.5,2.0 --workloads 1-8 \\
        --out experiments/pollux_reference/replays

The lower bound is not computed (``jct_bound`` off): it is a separate LP per replay.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Sequence
from pathlib import Path

from apportion.experiments.pollux_reference import (
    CLUSTER,
    LOAD_FOLDERS,
    WORKLOADS,
    reference,
)

from apportion.env import data_root

FIELDS = ("policy", "information", "load", "workload", "jobs", "finished", "avg_jct_s",
          "p99_jct_s", "makespan_s", "avg_restarts", "sim_wall_s", "wall_s")


def trace_path(load: float, workload: int, root: Path | None = None) -> Path:
    """``<data>/pollux/<folder of the load>/workload-<n>.csv``."""
    base = root if root is not None else data_root() / "pollux"
    return base / LOAD_FOLDERS[load] / f"workload-{workload}.csv"


def replay(policy: str, information: str, load: float, workload: int) -> dict[str, object]:
    """One deterministic replay's row."""
    from apportion.experiments.harness import run_one

    t0 = time.perf_counter()
    res = run_one(str(trace_path(load, workload)), CLUSTER, policy, "pollux", 0,
                  sim_options={"information": information, "deterministic": True,
                               "jct_bound": False})
    s = res.summary
    return {"policy": policy, "information": information, "load": load, "workload": workload,
            "jobs": s["jobs"], "finished": s["finished"],
            "avg_jct_s": round(float(s["avg_jct_s"]), 4),
            "p99_jct_s": round(float(s["p99_jct_s"]), 4),
            "makespan_s": round(float(s["makespan_s"]), 4),
            "avg_restarts": round(float(s.get("avg_restarts") or 0.0), 3),
            "sim_wall_s": s.get("sim_wall_s"), "wall_s": round(time.perf_counter() - t0, 1)}


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def table(rows: Sequence[dict[str, str]]) -> str:
    """Markdown: each replay beside Pollux's published Pollux, Tiresias and Optimus."""
    out = ["| policy | information | load | workload | avg JCT (s) | Pollux | Tiresias | "
           "Optimus | vs Pollux |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["policy"], r["information"], float(r["load"]),
                                         int(r["workload"]))):
        load, n = float(r["load"]), int(r["workload"])
        ref = {p: float(reference(load, n, p)["avg_jct_s"])  # type: ignore[arg-type]
               for p in ("pollux", "tiresias", "optimus")}
        avg = float(r["avg_jct_s"])
        out.append(f"| {r['policy']} | {r['information']} | {load:g} | {n} | {avg:,.1f} | "
                   f"{ref['pollux']:,.1f} | {ref['tiresias']:,.1f} | {ref['optimus']:,.1f} | "
                   f"{avg / ref['pollux'] - 1:+.1%} |")
    return "\n".join(out) + "\n"


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="apportion")
    ap.add_argument("--information", default="oracle")
    ap.add_argument("--loads", default="1.0")
    ap.add_argument("--workloads", default="1-8")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "replays.csv"
    done = {(r["policy"], r["information"], float(r["load"]), int(r["workload"]))
            for r in read_rows(path)}
    for info in a.information.split(","):
        for load in (float(x) for x in a.loads.split(",")):
            for n in _ints(a.workloads):
                if n not in WORKLOADS:
                    raise SystemExit(f"workload {n}: one of 1-8")
                for policy in a.policies.split(","):
                    if (policy, info, load, n) in done:
                        continue
                    row = replay(policy, info, load, n)
                    new = not path.exists()
                    with path.open("a", newline="") as f:
                        w = csv.DictWriter(f, FIELDS)
                        if new:
                            w.writeheader()
                        w.writerow(row)
                    print(",".join(str(row[k]) for k in FIELDS), flush=True)
    (a.out / "replays.md").write_text(table(read_rows(path)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
