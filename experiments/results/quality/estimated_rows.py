"""The estimated rows replayed with another ``--estimator`` set beside the quality tables' rows
(``--estimator analytic``): for each row, apportion's policy (``apportion`` on Crius's and
the other families' rows, ``apportion-plans`` on Morphling's) with its average JCT, the
95 % half-width and its rank in both, and the best other policy of each.

    python experiments/results/quality/estimated_rows.py RUNS_DIR > table.md

Rows are those ``estimated_rows.sh`` has written (``RUNS_DIR/NAME/summary.csv``); the
analytic rows are ``runs/NAME/summary.csv``. The rank is by the average JCT over every job
(an unfinished job counted until the replay's end), as in ``summarise.py``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
H = 3600.0


def _load(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {r["policy"]: r for r in csv.DictReader(f)}


def _avg(r: dict[str, str]) -> float:
    v = r.get("avg_jct_all_s")
    return float(v) if v not in (None, "") else float(r["avg_jct_s"])


def _ranked(rows: dict[str, dict[str, str]]) -> list[str]:
    return sorted(rows, key=lambda p: _avg(rows[p]))


def _ours(rows: dict[str, dict[str, str]]) -> str:
    """apportion's policy a row ranks: ``apportion`` where it ran, else ``apportion-plans``."""
    return "apportion" if "apportion" in rows else "apportion-plans"


def _cell(rows: dict[str, dict[str, str]], p: str) -> str:
    r = rows[p]
    return (f"{_avg(r) / H:.3f} ± {float(r['avg_jct_s_ci95'] or 0) / H:.3f} "
            f"({_ranked(rows).index(p) + 1} of {len(rows)})")


def _best_other(rows: dict[str, dict[str, str]], ours: str) -> str:
    p = next(x for x in _ranked(rows) if not x.startswith("apportion"))
    return f"{p} {_avg(rows[p]) / H:.3f} ± {float(rows[p]['avg_jct_s_ci95'] or 0) / H:.3f}"


def table(auto_dir: Path) -> str:
    est = auto_dir.name.removeprefix("runs_")
    lines = ["| row | policy | analytic: avg JCT h (rank) | best other, analytic | "
             f"{est}: avg JCT h (rank) | best other, {est} | change |",
             "|---|---|---|---|---|---|---|"]
    for run in sorted(p.parent for p in auto_dir.glob("*/summary.csv")):
        auto = _load(run / "summary.csv")
        base_path = HERE / "runs" / run.name / "summary.csv"
        base = _load(base_path) if base_path.exists() else {}
        ours = _ours(auto)
        change = (f"{100 * (_avg(auto[ours]) / _avg(base[ours]) - 1):+.1f} %"
                  if ours in base else "-")
        lines.append(f"| {run.name} | {ours} | "
                     f"{_cell(base, ours) if ours in base else '-'} | "
                     f"{_best_other(base, ours) if base else '-'} | {_cell(auto, ours)} | "
                     f"{_best_other(auto, ours)} | {change} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "runs_auto"))
