"""Merge a partial re-run into a run's tables: the policies ``NEW`` replayed replace
their rows in ``RUN/summary.csv`` (the others keep theirs), and ``RUN/summary.md`` is
written again the way ``apportion compare`` writes it (``experiments.harness``).

Why: a re-run of some policies (apportion after a solver change, the baselines with a
shared feedback) must not make every other row be replayed again, and must not be
pasted by hand. Both runs must have the same information mode and estimator (the
header line of each ``summary.md``: its ``information`` and ``estimator`` fields; a run
written since compare names its trace and cluster there too, which must then agree as
well): a merge of different modes exits 2.

``--same P=Q`` (repeatable) writes policy P's row as a copy of Q's, for a policy equal
to another by design that the re-run did not replay (``apportion-nh`` is ``apportion``
where jobs name no GPU type; ``apportion-deadline`` is ``apportion`` on a trace without
deadlines), so the table does not keep P's stale row beside Q's new one.

    python experiments/results/quality/merge_runs.py RUN_DIR NEW_RUN_DIR [--same P=Q ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from apportion.experiments.harness import _with_ci, to_markdown


def _fields(header: str) -> dict[str, str]:
    """``key: value`` pairs of a summary.md header line (``;``-separated)."""
    out = {}
    for part in header.split(";"):
        if ":" in part:
            k, v = part.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def merge(run: Path, new: Path, same: dict[str, str] | None = None) -> pd.DataFrame:
    head_old = (run / "summary.md").read_text().splitlines()[0]
    head_new = (new / "summary.md").read_text().splitlines()[0]
    a, b = _fields(head_old), _fields(head_new)
    keys = ["information", "estimator"] + [k for k in ("trace", "cluster") if k in a and k in b]
    if any(a.get(k) != b.get(k) for k in keys):
        raise SystemExit(f"{new / 'summary.md'}: header {head_new!r} differs from "
                         f"{run / 'summary.md'}: {head_old!r} in {', '.join(keys)}; "
                         "not merged")
    old = pd.read_csv(run / "summary.csv")
    fresh = pd.read_csv(new / "summary.csv")
    for p, q in (same or {}).items():
        if p in set(old["policy"]) and p not in set(fresh["policy"]) \
                and q in set(fresh["policy"]):
            fresh = pd.concat([fresh, fresh[fresh["policy"] == q].assign(policy=p)],
                              ignore_index=True)
    kept = old[~old["policy"].isin(fresh["policy"])]
    cols = list(dict.fromkeys([*old.columns, *fresh.columns]))
    merged = pd.concat([kept, fresh], ignore_index=True)[cols]
    merged.to_csv(run / "summary.csv", index=False)
    (run / "summary.md").write_text(head_old + "\n\n" + to_markdown(_with_ci(merged)))
    return merged


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--same", action="append", default=[], metavar="P=Q")
    args = ap.parse_args()
    pairs = dict(s.split("=", 1) for s in args.same)
    m = merge(args.run, args.new, pairs)
    print(f"{args.run}: {len(m)} policies")
