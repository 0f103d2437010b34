"""Merge a partial re-run into a run's tables: the policies ``NEW`` replayed replace
their rows in ``RUN/summary.csv`` (the others keep theirs), and ``RUN/summary.md`` is
written again the way ``apportion compare`` writes it (``experiments.harness``).

Why: a re-run of some policies (apportion after a solver change, the baselines with a
shared feedback) must not make every other row be replayed again, and must not be
pasted by hand. Both runs must have the same information mode and estimator (the
header line of each ``summary.md``): a merge of different modes exits 2.

    python experiments/results/quality/merge_runs.py RUN_DIR NEW_RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from apportion.experiments.harness import _with_ci, to_markdown


def merge(run: Path, new: Path) -> pd.DataFrame:
    head_old = (run / "summary.md").read_text().splitlines()[0]
    head_new = (new / "summary.md").read_text().splitlines()[0]
    if head_old != head_new:
        raise SystemExit(f"{new / 'summary.md'}: header {head_new!r} differs from "
                         f"{run / 'summary.md'}: {head_old!r}; not merged")
    old = pd.read_csv(run / "summary.csv")
    fresh = pd.read_csv(new / "summary.csv")
    kept = old[~old["policy"].isin(fresh["policy"])]
    cols = list(dict.fromkeys([*old.columns, *fresh.columns]))
    merged = pd.concat([kept, fresh], ignore_index=True)[cols]
    merged.to_csv(run / "summary.csv", index=False)
    (run / "summary.md").write_text(head_old + "\n\n" + to_markdown(_with_ci(merged)))
    return merged


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    m = merge(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[1]}: {len(m)} policies")
