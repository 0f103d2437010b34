"""The README's condensed tables (Crius's cluster and Morphling's setting) from
``tables.json``, so the numbers in the README are the tables' numbers, not copied by hand.

    python experiments/results/quality/condensed.py [tables.json]

Prints two markdown tables: one row per trace and information mode, apportion's (or
apportion-plans') average JCT with its 95 % confidence half-width, its p99 and the p99's
rank, its queueing, its rank by the average JCT over every job, and the best other policy.
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


def _avg(r: dict) -> float:
    """The ranking average: over every job where the run has it, else over finished jobs."""
    return r["avg_jct_all_h"] if r.get("avg_jct_all_h") is not None else r["avg_jct_h"]


def _ci(r: dict) -> str:
    return f"{r['avg_jct_h']:.3f} ± {r['avg_jct_ci95_h']:.3f}"


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
    out = [("| trace, mode | apportion avg | p99 (rank of 11) | queue | rank | best other avg "
            "(p99, queue, finished) | crius-greedy | gavel |"),
           "|---|---|---|---|---|---|---|---|"]
    for trace, mode, run, by, me, rank, first in _runs(rows, CRIUS, "apportion"):
        p99_rank = 1 + sum(r["p99_jct_h"] < me["p99_jct_h"] for r in run)
        other = min((r for r in run if r["policy"] != "apportion"), key=_avg)
        out.append(
            f"| {trace}, {mode} | {_bold(_ci(me), first)} | {me['p99_jct_h']:.1f} ± "
            f"{me['p99_jct_ci95_h']:.1f} ({p99_rank}) | {me['avg_queue_h']:.2f} | "
            f"{_bold(rank, first)} | {other['policy']} "
            f"{_ci(other)} ({other['p99_jct_h']:.1f}, {other['avg_queue_h']:.2f}, "
            f"{other['finished']:.0f}/{other['jobs']:.0f}) | {_ci(by['crius-greedy'])} | "
            f"{_ci(by['gavel'])} |")
    return "\n".join(out)


def morphling_table(rows: list[dict]) -> str:
    out = [("| workload, mode | apportion-plans (p99, queue; SLA kept) | morphling | sia | "
            "synergy | antman | apportion-plans' rank |"), "|---|---|---|---|---|---|---|"]
    for trace, mode, _, by, me, rank, first in _runs(rows, MORPHLING, "apportion-plans"):
        sla = "" if me.get("sla_kept") is None else f"; SLA kept {me['sla_kept']:.3f}"
        others = " | ".join(
            _ci(by[p]) + ("" if by[p].get("sla_kept") is None or trace != "morphling-mt"
                          else f" (SLA {by[p]['sla_kept']:.3f})")
            for p in ("morphling", "sia", "synergy", "antman"))
        out.append(f"| {trace.removeprefix('morphling-')}, {mode} | "
                   f"{_bold(_ci(me), first)} ({me['p99_jct_h']:.1f}, "
                   f"{me['avg_queue_h']:.2f}{sla}) | {others} | "
                   f"{_bold(rank, first)} |")
    return "\n".join(out)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else Path(__file__).with_name("tables.json")
    rows = json.loads(path.read_text())
    print(crius_table(rows), end="\n\n")
    print(morphling_table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
