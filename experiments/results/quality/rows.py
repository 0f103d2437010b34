"""Replay the quality tables' rows through the door an evaluator uses: one
``apportion compare`` per row, every policy the row ranks, 3 seeds, deterministic budgets.

The rows (trace, cluster, profile, information mode) are ``experiments/objective_default.py``'s
``ROWS``, so the tables, the default's paired check and this script replay the same rows;
the policies are each family's whole field (Crius's cluster: the 11 of Crius's comparison;
Morphling's: the 5 of Morphling's; Gavel's, ElasticFlow's and the fine-tuning trace: every
registered policy that schedules them, YMIR's on the fine-tuning trace). A row whose
``summary.csv`` exists is skipped, so the script resumes.

    python experiments/results/quality/philly_days.py traces 1 4 7 10 13
    python experiments/results/quality/rows.py [--rows crius-pai-oracle,...] \
        [--policies apportion] [--out experiments/results/quality/runs] [--dry-run]
    python experiments/results/quality/summarise.py experiments/results/quality/tables.md \
        experiments/results/quality/runs/*
    python experiments/results/quality/condensed.py

``--policies`` replays a subset (apportion's own after an objective change); merge such a
run into the full one with ``merge_runs.py``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from apportion.experiments.objective_default import ROWS, Row

CRIUS = ("fcfs,fcfs-backfill,srtf,tiresias,gandiva,gavel,gavel-max-min-fairness,sia,"
         "elasticflow-ls,crius-greedy,apportion")
MORPHLING = "morphling,sia,synergy,antman,apportion-plans"
EVERY = ("fcfs,fcfs-backfill,srtf,tiresias,fifo,gandiva,gandiva-migrate,"
         "gavel-max-min-fairness,gavel-max-sum-throughput,sia,elasticflow,elasticflow-ls,"
         "crius-greedy,morphling,synergy,antman,apportion,apportion-plans,apportion-deadline,"
         "apportion-na,apportion-nh,ymir-normal")
YMIR = "ymir,ymir-spatial,ymir-temporal"


def field(name: str) -> str:
    """The policies a row ranks (comma-separated), by its trace family."""
    if name.startswith("morphling-"):
        return MORPHLING
    if name.startswith(("crius-", "philly-d")):
        return CRIUS
    if name.startswith("fm-"):
        return f"{EVERY},{YMIR}"
    return EVERY


def command(name: str, row: Row, policies: str, out: Path, seeds: int) -> list[str]:
    """The ``apportion compare`` command line of one row."""
    cmd = ["apportion", "compare", "--trace", row.trace, "--cluster", row.cluster,
           "--policies", policies, "--information", row.information, "--seeds", str(seeds),
           "--deterministic", "--workers", "1", "--out", str(out), "--run", name]
    if row.profile != "default":
        cmd += ["--profile", row.profile]
    if row.max_jobs is not None:
        cmd += ["--max-jobs", str(row.max_jobs)]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    ap.add_argument("--policies", default=None, help="a subset of each row's field")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/quality/runs"))
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args(argv)
    names = [r for r in a.rows.split(",") if r]
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        print(f"rows.py: unknown row(s) {', '.join(unknown)}; known: {', '.join(ROWS)}",
              file=sys.stderr)
        return 2
    for name in names:
        if (a.out / name / "summary.csv").exists():
            continue
        policies = field(name)
        if a.policies:
            policies = ",".join(p for p in a.policies.split(",") if p in policies.split(","))
            if not policies:
                continue
        cmd = command(name, ROWS[name], policies, a.out, a.seeds)
        print(shlex.join(cmd), flush=True)
        if not a.dry_run:
            done = subprocess.run(cmd, check=False)
            if done.returncode:
                return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
