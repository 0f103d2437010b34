"""Leave-one-out ablation of apportion's objective, on rows not used to choose its terms.

The tuned objective (``ObjectiveOptions.preset("jct-aware")``, apportion's default before
the objective in seconds, called ``apportion`` in these tables) is JCT-aware weighted
throughput with further terms on top, each chosen on some trace and seed
(experiments/results/quality/HISTORY.md). ``seconds`` states the objective as one
quantity (the JCT seconds a job saves on a cell this round, net of a move's restart, one
fairness exponent). This script replays apportion with the full objective, with
``seconds``, and with the full objective less one term at a time, on rows none of the
terms was chosen on (Gavel's two traces on Gavel's cluster and profile, Philly day 3's
busiest 0.1 day on Crius's cluster), both information modes, deterministic budgets, and
writes the table: each variant's average and p99 JCT against the full objective's,
with a paired 95 % interval over seeds.

    python experiments/objective_ablation.py run --out DIR [--variants a,b] [--rows r,s]
    python experiments/objective_ablation.py table --out DIR > ablation.md

``run`` skips a (variant, row) whose summary is already written, so it resumes; several
``run`` processes with disjoint ``--variants`` share the work on several cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from apportion.experiments.harness import compare
from apportion.formulations.objectives import ObjectiveOptions
from scipy import stats

#: the full objective less one term: (what the term is, the knob values that remove it)
LEAVE_OUT: dict[str, tuple[str, dict[str, Any]]] = {
    "no-srtf-weight": ("SRTF's weight (the fairness exponent 0.5 -> 0)",
                       {"remaining_exponent": 0.0}),
    "no-weight-bounds": ("the weight's bounds [1/4, 4]", {"weight_bounds": (1e-3, 1e3)}),
    "no-speed-bounds": ("a second, narrower weight on speed beyond the reference [0.7, 1.4]",
                        {"speed_bounds": None}),
    "no-tail-share": ("the round's tail (10 % longest jobs) at the top speed weight",
                      {"tail_share": None}),
    "no-tail-quantile": ("the trace-memory tail (2 % quantile)", {"tail_quantile": None}),
    "no-pin": ("the pinned band (1.5 %-0.75 % quantiles)",
               {"tail_pin": None, "tail_pin_top": None}),
    "no-round-cap": ("credit capped at the work left this round (excess at 1/4)",
                     {"round_excess": None}),
    "no-speed-unit": ("speed in shares of the job's best cell (outside the tail)",
                      {"speed_unit": "reference"}),
    "no-amortize": ("a move's restart spread over up to 1,800 s (one round instead)",
                    {"amortize_s": None}),
    "no-keep-bonus": ("the keep bonus 0.2", {"keep_bonus": 0.0}),
    "no-place-bonus": ("one unit per placed job", {"place_bonus": 0.0}),
    "no-queue-bonus": ("the queue bonus 0.25 (starvation at 4 h)", {"queue_weight": 0.0}),
    "no-least-efficient": ("Sia's least-efficient normalisation (requested instead)",
                           {"normalize": "requested"}),
}


#: ``seconds`` plus one further term: (what the term is, the knob values that add it)
ADD_ONE: dict[str, tuple[str, dict[str, Any]]] = {
    "plus-weight-bounds": ("the weight's bounds [1/4, 4]", {"weight_bounds": (0.25, 4.0)}),
    "plus-speed-bounds": (("speed beyond the reference rate's share at a narrower weight "
                           "[0.7, 1.4] (who runs keeps the fairness weight)"),
                          {"speed_bounds": (0.7, 1.4)}),
    "plus-tail": (("the round's tail (10 %) and the trace-memory tail (2 %) at the top "
                   "weight, within bounds [1/4, 4]"),
                  {"weight_bounds": (0.25, 4.0), "tail_share": 0.1, "tail_quantile": 0.02}),
    "plus-pin": ("the pinned band (1.5 %-0.75 % quantiles)",
                {"tail_pin": 0.015, "tail_pin_top": 0.0075}),
    "plus-round-excess": ("speed beyond the work left this round counted at 1/4 (0 in seconds)",
                         {"round_excess": 0.25}),
    "plus-amortize": ("a move's restart spread over up to 1,800 s", {"amortize_s": 1800.0}),
    "plus-keep-bonus": ("a keep bonus of 0.2 rounds", {"keep_bonus": 0.2}),
    "plus-place-bonus": ("one round per placed job", {"place_bonus": 1.0}),
    "plus-queue-bonus": ("the queue bonus 0.25 rounds (starvation at 4 h)", {"queue_weight": 0.25}),
}


#: apportion's default (``preset("apportion")``, the tables' ``candidate``) less one term: (what the term is, the knob values that remove it)
CANDIDATE_OUT: dict[str, tuple[str, dict[str, Any]]] = {
    "candidate-no-wait": (("the wait credit (a job ending within the round credited its "
                           "work only)"), {"finish_credit": "progress"}),
    "candidate-no-amortize": ("a move's restart against up to 1,800 s (one round instead)",
                              {"amortize_s": None}),
    "candidate-no-speed-bounds": ("speed beyond the reference share at the narrower weight",
                                  {"speed_bounds": None}),
    "candidate-no-srtf-weight": ("the fairness exponent (0.5 -> 0)",
                                 {"remaining_exponent": 0.0}),
}


def variants() -> dict[str, ObjectiveOptions]:
    """Every variant replayed: the full objective, ``seconds``, each leave-one-out of the
    full objective, ``seconds`` with each further term, and the candidate default with
    each of its terms left out."""
    out = {"apportion": ObjectiveOptions.preset("jct-aware"),
           "seconds": ObjectiveOptions.preset("seconds"),
           "candidate": ObjectiveOptions.preset("apportion")}
    for name, (_, knobs) in LEAVE_OUT.items():
        out[name] = ObjectiveOptions.preset("jct-aware", **knobs)
    for name, (_, knobs) in ADD_ONE.items():
        out[name] = ObjectiveOptions.preset("seconds", **knobs)
    for name, (_, knobs) in CANDIDATE_OUT.items():
        out[name] = ObjectiveOptions.preset("apportion", **knobs)
    return out


@dataclass(frozen=True)
class Row:
    """One held-out row: a trace slice on a cluster and profile, in one information mode."""

    trace: str
    cluster: str
    profile: str
    information: str
    seeds: int
    window_days: float | None = None
    what: str = ""


ROWS: dict[str, Row] = {}
for mode, seeds in (("estimated", 3), ("oracle", 1)):  # Gavel's oracle: the same every seed
    ROWS[f"gavel-mmf-{mode}"] = Row("gavel-max-min-fairness", "8:8:8", "gavel", mode, seeds,
                                    what="Gavel's max_min_fairness.trace, 96 jobs")
    ROWS[f"gavel-mk-{mode}"] = Row("gavel-minimize-makespan", "8:8:8", "gavel", mode,
                                   seeds, what="Gavel's minimize_makespan.trace, 100 jobs")
    # a Philly-derived trace draws each job's model from the seed: every mode needs 3
    ROWS[f"philly-d3w-{mode}"] = Row("traces/philly-d3.csv", "crius-1280", "default", mode,
                                     3, window_days=0.1,
                                     what="Philly day 3's busiest 0.1 day, 508 jobs")
    # two more days no objective was ever replayed on: the candidate's leave-one-out
    for day in (5, 12):
        ROWS[f"philly-d{day}w-{mode}"] = Row(f"traces/philly-d{day}.csv", "crius-1280",
                                             "default", mode, 3, window_days=0.1,
                                             what=f"Philly day {day}'s busiest 0.1 day")


def run(out: Path, names: list[str], rows: list[str]) -> None:
    table = variants()
    for row_name in rows:
        row = ROWS[row_name]
        for name in names:
            root = out / row_name / name
            if (root / "summary.csv").exists():
                continue
            print(f"{row_name} {name}", file=sys.stderr, flush=True)
            compare(row.trace, row.cluster, ["apportion"], row.seeds,
                    out=out / row_name, run=name, profile=row.profile, workers=1,
                    policy_options={"apportion": {"objective": table[name]}},
                    sim_options={"information": row.information, "deterministic": True},
                    window_days=row.window_days, show_progress=False, plots=False)


def _per_seed(root: Path, policy: str = "apportion") -> dict[int, dict[str, float]]:
    """Each seed's summary of ``policy``'s replays under ``root`` (one compare run)."""
    out = {}
    for d in sorted(root.glob(f"{policy}-s*")):
        if not d.name[len(policy) + 2:].isdigit():
            continue
        s = json.loads((d / "summary.json").read_text())
        out[int(d.name.rsplit("-s", 1)[1])] = s
    return out


def _paired(base: dict[int, dict[str, float]], other: dict[int, dict[str, float]],
            key: str) -> tuple[float, float]:
    """Mean relative change of ``key`` (other / base - 1, per seed) and its 95 % half-width
    (Student's t over the paired seeds; 0 for one seed)."""
    seeds = sorted(set(base) & set(other))
    rel = [other[s][key] / base[s][key] - 1.0 for s in seeds]
    if len(rel) < 2:
        return rel[0], 0.0
    return mean(rel), stats.t.ppf(0.975, len(rel) - 1) * stdev(rel) / math.sqrt(len(rel))


def _cell(out: Path, row: str, name: str, base: dict[int, dict[str, float]]) -> str:
    root = out / row / name
    if not (root / "summary.csv").exists():
        return "-"
    other = _per_seed(root)
    m, h = _paired(base, other, "avg_jct_s")
    p99, _ = _paired(base, other, "p99_jct_s")
    if len(set(base) & set(other)) < 2:  # one seed: exact for this replay, no interval
        return f"{100 * m:+.1f} % (p99 {100 * p99:+.1f} %)"
    mark = "**" if abs(m) > h else ""
    return f"{mark}{100 * m:+.1f} ± {100 * h:.1f} %{mark} (p99 {100 * p99:+.1f} %)"


def _section(out: Path, rows: list[str], base_name: str,
             terms: dict[str, tuple[str, dict[str, Any]]], what: str) -> list[str]:
    base = {r: _per_seed(out / r / base_name) for r in rows}
    lines = [f"| variant | {what} | " + " | ".join(rows) + " |",
             "|---|---|" + "---|" * len(rows),
             f"| {base_name} | - | " + " | ".join(
                 f"{mean(s['avg_jct_s'] for s in base[r].values()) / 3600:.3f} h "
                 f"(p99 {mean(s['p99_jct_s'] for s in base[r].values()) / 3600:.2f} h)"
                 for r in rows) + " |"]
    for name, (text, _) in terms.items():
        lines.append(f"| {name} | {text} | "
                     + " | ".join(_cell(out, r, name, base[r]) for r in rows) + " |")
    return lines


def table(out: Path) -> str:
    """Both tables in markdown: each leave-one-out against the full objective, and
    ``seconds`` and each of its additions against ``seconds`` (the change of the average
    JCT, mean over seeds of the paired relative change ± its 95 % half-width, in bold
    where the interval excludes 0; the p99's change beside it)."""
    rows = [r for r in ROWS if (out / r / "apportion" / "summary.csv").exists()]
    full = _section(out, rows, "apportion",
                    {"seconds": ("every further term (the one quantity alone)", {}),
                     **LEAVE_OUT}, "left out of the full objective")
    sec = [r for r in rows if (out / r / "seconds" / "summary.csv").exists()]
    added = _section(out, sec, "seconds", ADD_ONE, "added to seconds")
    cand = [r for r in rows if (out / r / "candidate" / "summary.csv").exists()]
    less = _section(out, cand, "candidate",
                    {"apportion": ("the tuned jct-aware objective instead", {}),
                     **CANDIDATE_OUT},
                    "left out of the candidate") if cand else []
    return "\n".join(full + [""] + added + ([""] + less if less else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--variants", default=",".join(variants()))
    r.add_argument("--rows", default=",".join(ROWS))
    t = sub.add_parser("table")
    t.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run(a.out, a.variants.split(","), a.rows.split(","))
    else:
        sys.stdout.write(table(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
