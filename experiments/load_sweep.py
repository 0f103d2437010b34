"""``compare --load 0.5,1,1.5,2``: one comparison per arrival rate and the average JCT
against load, the way Gavel and Pollux present results.

Each load is a whole :func:`~apportion.experiments.harness.compare_main` run in
``RUN/load-<x>/`` (its tables, plots and per-seed runs as any comparison's; a rerun
resumes finished runs), on the same trace with its submit times divided by the load
(:meth:`~apportion.experiments.traces.Trace.at_load`: at 2x, jobs arrive twice as fast;
each deadline stays as far after its job's submission). Beside them:

* ``load_sweep.csv``: per load and policy, the seeds and every summary column of that
  load's ``summary.csv`` (means over seeds and their ``_ci95`` half-widths, in seconds);
* ``load_sweep.md``: average JCT (h) ± its 95 % interval, a row per policy, a column per
  load, the best of each load in bold;
* ``jct_vs_load.png`` / ``.pdf`` / ``.svg``: average JCT against load, each policy's
  line with its own style and marker, the 95 % interval as error bars.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from apportion.errors import InputError
from apportion.experiments.harness import CompareFailed, check_run_name, compare_main
from apportion.experiments.plots import fmt, line_style, save_figure, title
from apportion.tables import markdown_table

#: the most loads one sweep runs (each is a whole comparison)
MAX_LOADS = 16
#: the loads a sweep may ask for: arrivals from a hundredth to a hundred times the trace's
LOAD_RANGE = (0.01, 100.0)


def parse_loads(text: str) -> list[float]:
    """``0.5,1,1.5,2`` -> [0.5, 1.0, 1.5, 2.0]; refused by name (``--load``) when a value
    is no number, outside :data:`LOAD_RANGE`, repeated, or more than :data:`MAX_LOADS`."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InputError(text, "--load", "give loads separated by commas, e.g. 0.5,1,1.5,2")
    loads = []
    for p in parts:
        try:
            x = float(p)
        except ValueError:
            raise InputError(text, "--load", f"{p!r} is not a number") from None
        if not (math.isfinite(x) and LOAD_RANGE[0] <= x <= LOAD_RANGE[1]):
            raise InputError(text, "--load", f"{p} is outside {LOAD_RANGE[0]:g}-"
                             f"{LOAD_RANGE[1]:g} (times the trace's arrival rate)")
        loads.append(x)
    if len(set(loads)) != len(loads):
        raise InputError(text, "--load", "a load is given twice")
    if len(loads) > MAX_LOADS:
        raise InputError(text, "--load", f"at most {MAX_LOADS} loads (each is a whole "
                         f"comparison), got {len(loads)}")
    return sorted(loads)


def load_dir(load: float) -> str:
    """The folder of one load's comparison (``load-0.5``, ``load-2``)."""
    return f"load-{load:g}"


def compare_loads(trace: str, cluster: str, policies: str, seeds: int, profile: str,
                  out: Path, run: str | None, loads: list[float], **options: Any) -> Path:
    """Every load's comparison (``options``: :func:`compare_main`'s), then the sweep's
    table and plot under ``out/run``. A load whose runs failed still gets its rows (with
    their ``error``); :class:`CompareFailed` is raised after the sweep is written."""
    check_run_name(run)
    mode = options.get("information", "estimated")
    name = run or "".join(c if c.isalnum() or c in "_.-" else "_"
                          for c in f"{Path(trace).stem}-{cluster}-{mode}-loads")
    root = Path(out) / name
    root.mkdir(parents=True, exist_ok=True)
    failed: CompareFailed | None = None
    frames = []
    for load in loads:
        try:
            sub = compare_main(trace, cluster, policies, seeds, profile, root, load_dir(load),
                               load=load, **options)
        except CompareFailed as exc:
            failed, sub = exc, exc.root
        frame = pd.read_csv(sub / "summary.csv")
        frame.insert(0, "load", load)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    table.to_csv(root / "load_sweep.csv", index=False)
    order = list(dict.fromkeys(table["policy"]))
    info = _info(root / load_dir(loads[0]))
    (root / "load_sweep.md").write_text(sweep_markdown(table, order, info))
    save_figure(jct_figure(table, order, info), root / "jct_vs_load")
    if failed is not None:
        raise CompareFailed(root, failed.failures, len(failed.failures))
    return root


def _info(first: Path) -> dict[str, Any]:
    """What the first load's plots say of the trace, cluster, mode and seeds (for titles)."""
    import json

    data = json.loads((first / "plots.json").read_text())
    return {k: data[k] for k in ("trace", "cluster", "information", "estimator", "seeds")}


def sweep_markdown(table: pd.DataFrame, order: list[str], info: dict[str, Any]) -> str:
    """Average JCT (h) ± its 95 % interval per policy (rows) and load (columns)."""
    loads = sorted(table["load"].unique())
    rows = []
    best = {}
    for load in loads:
        at = table[table["load"] == load]
        vals = pd.to_numeric(at["avg_jct_s"], errors="coerce")
        if vals.notna().any():
            best[load] = str(at.loc[vals.idxmin(), "policy"])
    for p in order:
        row = [p]
        for load in loads:
            r = table[(table["load"] == load) & (table["policy"] == p)]
            v = r["avg_jct_s"].iloc[0] if len(r) else float("nan")
            if pd.isna(v):
                row.append("")
                continue
            ci = r["avg_jct_s_ci95"].iloc[0] if "avg_jct_s_ci95" in r else float("nan")
            cell = fmt(v / 3600) + (" ± n/a" if pd.isna(ci) else f" ± {fmt(ci / 3600)}")
            row.append(f"**{cell}**" if best.get(load) == p else cell)
        rows.append(row)
    head = (f"{title(info)}\n\nAverage JCT (h) against load (arrivals at that many times "
            "the trace's rate): mean over seeds ± the 95 % confidence interval (n/a for one "
            "seed); the best at each load in **bold**.\n\n")
    return head + markdown_table(["policy"] + [f"{x:g}x" for x in loads], rows,
                                 ["l"] + ["r"] * len(loads))


def jct_figure(table: pd.DataFrame, order: list[str], info: dict[str, Any]) -> Any:
    """Average JCT (h) against load, one styled line per policy with 95 % error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, p in enumerate(order):
        r = table[table["policy"] == p].sort_values("load")
        y = pd.to_numeric(r["avg_jct_s"], errors="coerce") / 3600
        if not y.notna().any():
            continue
        err = (pd.to_numeric(r["avg_jct_s_ci95"], errors="coerce") / 3600
               if "avg_jct_s_ci95" in r else None)
        style = {**line_style(k), "markevery": 1}
        ax.errorbar(r["load"], y, yerr=None if err is None or not err.notna().any() else err,
                    label=p, lw=1.0, capsize=2, **style)
    ax.set_xlabel("load (times the trace's arrival rate)")
    ax.set_ylabel("average JCT (h)")
    ax.set_title(title(info), fontsize=9)
    ax.set_ylim(bottom=0)
    ax.ticklabel_format(axis="both", style="plain", useOffset=False)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
