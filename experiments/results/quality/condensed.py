"""The README's condensed tables (Crius's cluster and Morphling's setting) from
``tables.json``, so the numbers in the README are the tables' numbers, not copied by hand.

    python experiments/results/quality/condensed.py [tables.json]

Prints two markdown tables: one row per trace and information mode, apportion's (or
apportion-plans') average JCT with its 95 % confidence half-width, its p99 and the p99's
rank, its queueing, its rank by the average JCT over every job, and the best other policy.
Then one table per trace of issue 41's other families (Gavel's, ElasticFlow's and a
fine-tuning trace, :data:`FAMILIES`): every policy, both information modes side by side.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

CRIUS = ["crius-venus", "crius-pai", "philly-d1", "philly-d4", "philly-d7", "philly-d10",
         "philly-d13"]
MORPHLING = ["morphling-base", "morphling-bp", "morphling-mt"]
MODES = ["estimated", "oracle"]
#: issue 41's other trace families: run name prefix -> the README's label
FAMILIES = {"gavel-mmf": "Gavel's max_min_fairness.trace (96 jobs), 8:8:8, gavel profile",
            "elasticflow-philly": "ElasticFlow's philly_103959 (first 100 of 876 jobs), "
                                  "32 x 8 A100",
            "fm-1-roberta-base": "Fine-tuning FM-1 RoBERTa-base (120 jobs), 32 V100, "
                                 "ymir profile"}


def _avg(r: dict) -> float:
    """The ranking average: over every job where the run has it, else over finished jobs."""
    return r["avg_jct_all_h"] if r.get("avg_jct_all_h") is not None else r["avg_jct_h"]


def _ci(r: dict) -> str:
    return f"{r['avg_jct_h']:.3f} ± {r['avg_jct_ci95_h']:.3f}"


def _ratio(r: dict) -> str:
    """The average JCT over the run's lower bound (``≈``: the run's bound, see summarise.py)."""
    if r.get("avg_jct_to_bound") is None:
        return "n/a"
    return f"{'≈' if r.get('bound_from_another_policy') else ''}{r['avg_jct_to_bound']:.2f}"


def _bold(text: str, first: bool) -> str:
    return f"**{text}**" if first else text


def _runs(rows: list[dict], traces: list[str], mine: str
          ) -> Iterator[tuple[str, str, list[dict], dict[str, dict], dict, str, bool]]:
    """Each (trace, mode) run present in ``rows``: its rows, them by policy, ``mine``'s row,
    its rank as text and whether it is first."""
    for trace in traces:
        for mode in MODES:
            run = [r for r in rows if r["run"] == f"{trace}-{mode}"]
            if run:
                by = {r["policy"]: r for r in run}
                me = by[mine]
                yield trace, mode, run, by, me, f"{me['rank']} of {len(run)}", me["rank"] == 1


def crius_table(rows: list[dict]) -> str:
    out = [("| trace, mode | apportion avg | p99 (rank of 11) | queue | avg / bound | rank "
            "| best other avg (p99, queue, finished; avg / bound) | crius-greedy | gavel |"),
           "|---|---|---|---|---|---|---|---|---|"]
    for trace, mode, run, by, me, rank, first in _runs(rows, CRIUS, "apportion"):
        p99_rank = 1 + sum(r["p99_jct_h"] < me["p99_jct_h"] for r in run)
        other = min((r for r in run if r["policy"] != "apportion"), key=_avg)
        out.append(
            f"| {trace}, {mode} | {_bold(_ci(me), first)} | {me['p99_jct_h']:.1f} ± "
            f"{me['p99_jct_ci95_h']:.1f} ({p99_rank}) | {me['avg_queue_h']:.2f} | "
            f"{_ratio(me)} | {_bold(rank, first)} | {other['policy']} "
            f"{_ci(other)} ({other['p99_jct_h']:.1f}, {other['avg_queue_h']:.2f}, "
            f"{other['finished']:.0f}/{other['jobs']:.0f}; {_ratio(other)}) | "
            f"{_ci(by['crius-greedy'])} | "
            f"{_ci(by['gavel'])} |")
    return "\n".join(out)


def morphling_table(rows: list[dict]) -> str:
    out = [("| workload, mode | apportion-plans (p99, queue; SLA kept) | avg / bound | "
            "morphling | sia | synergy | antman | apportion-plans' rank |"),
           "|---|---|---|---|---|---|---|---|"]
    for trace, mode, _, by, me, rank, first in _runs(rows, MORPHLING, "apportion-plans"):
        sla = "" if me.get("sla_kept") is None else f"; SLA kept {me['sla_kept']:.3f}"
        others = " | ".join(
            _ci(by[p]) + ("" if by[p].get("sla_kept") is None or trace != "morphling-mt"
                          else f" (SLA {by[p]['sla_kept']:.3f})")
            for p in ("morphling", "sia", "synergy", "antman"))
        out.append(f"| {trace.removeprefix('morphling-')}, {mode} | "
                   f"{_bold(_ci(me), first)} ({me['p99_jct_h']:.1f}, "
                   f"{me['avg_queue_h']:.2f}{sla}) | {_ratio(me)} | {others} | "
                   f"{_bold(rank, first)} |")
    return "\n".join(out)


def _mode_cells(r: dict | None, rank: int | None) -> str:
    """One mode's cells: avg over finished jobs (with finished/jobs and the average over
    every job where some did not finish), p99, makespan, utilisation, avg / lower bound,
    rank (ties share it)."""
    if r is None or rank is None:
        return "n/a | | | | | "
    first = rank == 1
    part = "" if r["finished"] >= r["jobs"] else \
        f" ({r['finished']:.0f}/{r['jobs']:.0f}; all jobs {_avg(r):.3f})"
    ratio = _ratio(r)
    util = "n/a" if r.get("utilization") is None else f"{100 * r['utilization']:.1f} %"
    span = "n/a" if r.get("makespan_h") is None else f"{r['makespan_h']:.1f}"
    return (f"{_bold(_ci(r), first)}{part} | {r['p99_jct_h']:.2f} | {span} | {util} | "
            f"{ratio} | {_bold(str(rank), first)}")


def _tied_ranks(run: dict[str, dict]) -> dict[str, int]:
    """Rank by the average over every job, to the second: equal averages share a rank."""
    sec = {p: round(_avg(r) * 3600) for p, r in run.items()}
    return {p: 1 + sum(v < sec[p] for v in sec.values()) for p in run}


def family_table(rows: list[dict], prefix: str) -> str:
    """Every policy of one trace, estimated and oracle side by side, in the estimated
    run's rank order (the average JCT over every job; ties share a rank)."""
    by_mode = {m: {r["policy"]: r for r in rows if r["run"] == f"{prefix}-{m}"} for m in MODES}
    ranks = {m: _tied_ranks(by_mode[m]) for m in MODES}
    order = sorted(set(by_mode["estimated"]) | set(by_mode["oracle"]),
                   key=lambda p: (ranks["estimated"].get(p, 999), ranks["oracle"].get(p, 999),
                                  p))
    head = ("| policy | estimated: avg JCT (h) | p99 (h) | makespan (h) | util. | avg / bound "
            "| rank | oracle: avg JCT (h) | p99 (h) | makespan (h) | util. | avg / bound | rank |")
    out = [head, "|---|" + "---|" * 12]
    for pol in order:
        name = f"**{pol}**" if pol.startswith("apportion") else pol
        cells = [_mode_cells(by_mode[m].get(pol), ranks[m].get(pol)) for m in MODES]
        out.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else Path(__file__).with_name("tables.json")
    rows = json.loads(path.read_text())
    print(crius_table(rows), end="\n\n")
    print(morphling_table(rows))
    for prefix, label in FAMILIES.items():
        if any(r["run"].startswith(prefix + "-") for r in rows):
            print(f"\n{label}:\n\n{family_table(rows, prefix)}")


if __name__ == "__main__":
    main(sys.argv[1:])
