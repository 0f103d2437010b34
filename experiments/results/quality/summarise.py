"""Condense ``apportion compare`` runs (their ``summary.csv``) into one markdown table per
run and one JSON: avg and p99 JCT (mean ± 95 % CI over seeds, Student's t, hours),
average queueing, restarts per job, makespan (h), GPU utilisation, the average JCT over
the run's lower bound (``avg_jct_to_bound``), finished jobs, the share of jobs that met
their deadline where the trace has deadlines (``deadline_ratio``), each policy's rank, and
where the trace has guaranteed jobs (Morphling's MT) the share that kept their SLA
(``sla_kept``).

The rank is by the average JCT over *every* job (``avg_jct_all_s``: an unfinished job
counted until the replay's end, a lower bound), so leaving long jobs unstarted does not
win; where a run predates that column, by the average over finished jobs (the same
number when every job finished).

The bound is the trace's and the cluster's, not the policy's: a policy whose row was
replayed before compare reported it (most baselines' rows) gets the bound of a policy
replayed since on the same run, the same seeds (or any seeds where its own seeds repeat
one replay: a fixed trace in oracle mode), shown ``≈`` without an interval: the average
JCT over the seeds' average bound, not the mean of per-seed ratios. Only where that policy
finished every job: a policy that left jobs unfinished is compared with the bound counting
each job until its replay's end (``avg_jct_all_lower_bound_s``, experiments/lower_bound.py),
which only its own replay knows, so its ratio stays n/a. A run whose bound ``rebound.py``
computed again after it was replayed is shown ``≈`` the same way.

    python experiments/results/quality/summarise.py OUT.md RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

H = 3600.0


def _num(r: pd.Series, col: str, scale: float = 1.0) -> float | None:
    """``r[col] / scale``, or None where the run has no such column (older runs)."""
    v = r.get(col)
    return None if v is None or pd.isna(v) else float(v) / scale


def _pm(v: float | None, ci: float | None, digits: int) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}" + ("" if ci is None else f" ± {ci:.{digits}f}")


def _fill_bound(df: pd.DataFrame) -> pd.Series:
    """Which rows had their bound filled from another policy's (see the module's doc)."""
    for col in ("avg_jct_lower_bound_s", "avg_jct_to_bound", "avg_jct_to_bound_ci95"):
        if col not in df.columns:
            df[col] = float("nan")
    known = df[df["avg_jct_lower_bound_s"].notna()]
    filled = pd.Series(False, index=df.index)
    for i, r in df[df["avg_jct_lower_bound_s"].isna()].iterrows():
        if "finished" in df.columns and "jobs" in df.columns and r["finished"] < r["jobs"]:
            continue  # the job sets differ (the module's doc)
        same = known[known["seeds"] == r["seeds"]]
        if same.empty and r["seeds"] > 1 and r["avg_jct_s_ci95"] == 0:
            same = known  # its seeds repeat one replay, as a 1-seed row does
        if same.empty:
            continue
        bound = float(same["avg_jct_lower_bound_s"].iloc[0])
        df.loc[i, "avg_jct_lower_bound_s"] = bound
        df.loc[i, "avg_jct_to_bound"] = r["avg_jct_s"] / bound
        filled[i] = True
    if "bound_of_means" in df.columns:  # rebound.py's: the mean JCT over the mean bound
        filled |= df["bound_of_means"].fillna(False).astype(bool)
    return filled


def table(run: Path) -> tuple[str, list[dict]]:
    df = pd.read_csv(run / "summary.csv")
    df["bound_filled"] = _fill_bound(df)
    if "avg_jct_all_s" not in df.columns:
        df["avg_jct_all_s"] = float("nan")
    done = df["finished"] >= df["jobs"]  # every job finished: the two averages agree
    df.loc[done & df["avg_jct_all_s"].isna(), "avg_jct_all_s"] = df["avg_jct_s"]
    df = df.sort_values(["avg_jct_all_s", "avg_jct_s"], na_position="last").reset_index(drop=True)
    head = (run / "summary.md").read_text().splitlines()[0]
    sla = "sla_jobs" in df.columns and bool((df["sla_jobs"].fillna(0) > 0).any())
    # a trace whose jobs carry deadlines: ElasticFlow's deadline satisfactory ratio beside
    # the JCTs (jobs finished by their deadline over jobs with one)
    ddl = "deadline_ratio" in df.columns and bool(df["deadline_ratio"].notna().any())
    rows, out = [], []
    out.append(f"### {run.name}\n\n{head}\n")
    out.append("| rank | policy | seeds | finished/jobs | avg JCT, all jobs (h) | avg JCT (h) "
               "| p99 JCT (h) | avg queue (h) | restarts/job | makespan (h) | utilisation "
               "| avg JCT / bound |" + (" SLA kept |" if sla else "")
               + (" deadlines met |" if ddl else ""))
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if sla else "")
               + ("---|" if ddl else ""))
    for i, r in df.iterrows():
        rec = {"run": run.name, "rank": i + 1, "policy": r["policy"], "seeds": int(r["seeds"]),
               "finished": r["finished"], "jobs": r["jobs"],
               "avg_jct_all_h": None if pd.isna(r["avg_jct_all_s"]) else r["avg_jct_all_s"] / H,
               "avg_jct_h": r["avg_jct_s"] / H, "avg_jct_ci95_h": r["avg_jct_s_ci95"] / H,
               "p99_jct_h": r["p99_jct_s"] / H, "p99_jct_ci95_h": r["p99_jct_s_ci95"] / H,
               "avg_queue_h": r["avg_queue_s"] / H, "avg_restarts": r["avg_restarts"],
               "makespan_h": _num(r, "makespan_s", H),
               "makespan_ci95_h": _num(r, "makespan_s_ci95", H),
               "utilization": _num(r, "utilization"),
               "utilization_ci95": _num(r, "utilization_ci95"),
               "avg_jct_lower_bound_h": _num(r, "avg_jct_lower_bound_s", H),
               "avg_jct_to_bound": _num(r, "avg_jct_to_bound"),
               "avg_jct_to_bound_ci95": _num(r, "avg_jct_to_bound_ci95"),
               "bound_from_another_policy": bool(r["bound_filled"])}
        kept = ""
        if sla:
            rec["sla_kept"] = None if pd.isna(r.get("sla_kept")) else float(r["sla_kept"])
            ci = r.get("sla_kept_ci95")
            kept = " n/a |" if rec["sla_kept"] is None else \
                f" {rec['sla_kept']:.3f}{'' if pd.isna(ci) else f' ± {ci:.3f}'} |"
        if ddl:
            rec["deadline_ratio"] = None if pd.isna(r.get("deadline_ratio")) \
                else float(r["deadline_ratio"])
            kept += " n/a |" if rec["deadline_ratio"] is None else \
                f" {rec['deadline_ratio']:.3f} |"
        rows.append(rec)
        name = f"**{r['policy']}**" if str(r["policy"]).startswith("apportion") else r["policy"]
        flag = r.get("avg_jct_all_bound", False)
        bound = "≥" if (not pd.isna(flag) and bool(flag)) else ""  # see all_jobs.py
        every = "n/a" if rec["avg_jct_all_h"] is None else f"{bound}{rec['avg_jct_all_h']:.3f}"
        out.append(f"| {i + 1} | {name} | {rec['seeds']} | {r['finished']:.0f}/{r['jobs']:.0f} | "
                   f"{every} | {rec['avg_jct_h']:.3f} ± {rec['avg_jct_ci95_h']:.3f} | "
                   f"{rec['p99_jct_h']:.2f} ± {rec['p99_jct_ci95_h']:.2f} | "
                   f"{rec['avg_queue_h']:.3f} | {rec['avg_restarts']:.2f} | "
                   f"{_pm(rec['makespan_h'], rec['makespan_ci95_h'], 1)} | "
                   f"{_pm(rec['utilization'], rec['utilization_ci95'], 3)} | "
                   f"{'≈' if rec['bound_from_another_policy'] else ''}"
                   f"{_pm(rec['avg_jct_to_bound'], rec['avg_jct_to_bound_ci95'], 2)} |{kept}")
    return "\n".join(out) + "\n", rows


def main(out: str, runs: list[str]) -> None:
    parts, rows = [], []
    for r in runs:
        md, rs = table(Path(r))
        parts.append(md)
        rows.extend(rs)
    Path(out).write_text("\n".join(parts))
    Path(out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
