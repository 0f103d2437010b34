"""What `compare` publishes: plots and the markdown table, ready for a paper or a report.

* **Titles** name the trace by its public name (:mod:`apportion.experiments.trace_names`),
  the cluster, the information mode and the seeds.
* **Lines** differ by style and marker as well as colour, so curves that coincide stay
  visible and a figure reads in grey; every figure is written as PNG (200 dpi), PDF and
  SVG (:data:`FORMATS`).
* **Hours** on every time axis and in the table (the solver's seconds stay seconds);
  numbers in plain notation, never scientific.
* **Bands**: the mean over seeds with a 95 % percentile-bootstrap band of that mean
  (:func:`bootstrap_band`: resampling the seeds, a fixed generator so a figure is
  reproducible), clipped to what is physical (queue lengths and throughput >= 0,
  utilisation in [0, 1]); the JCT CDF has its band too (JCT quantiles at each
  probability). One seed draws a line and no band, and the legend says so.
* **The table** (``summary.md``): per policy, the mean over seeds ``± the 95 %
  confidence interval`` (Student's t, as ``summary.csv``'s ``_ci95`` columns), ``± n/a``
  where one seed gives no interval, times in hours, the best value of each column in
  bold (lowest JCT, queueing and makespan; highest completion, utilisation,
  throughput, deadline and SLA shares).
* ``plots.json``: the numbers behind every plot (grids, means, band edges), to
  re-plot them elsewhere.

The harness calls :func:`write_plots` and :func:`write_summary_markdown`; nothing here
runs a replay.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apportion.experiments.trace_names import public_name

#: the files each figure is written as: a raster to look at, vectors for a paper
FORMATS = ("png", "pdf", "svg")
PNG_DPI = 200
#: each policy's line: (style, marker), in the order the policies are given
STYLES = [(ls, mk) for mk, ls in zip("osD^vPX*<>", ["-", "--", "-.", ":"] * 3)]
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
GRID = 400

# summary column -> (markdown header, scale, better: "min" | "max" | None)
TABLE = {
    "seeds": ("seeds", None, None),
    "jobs": ("jobs", None, None),
    "finished": ("finished", None, "max"),
    "avg_jct_s": ("avg JCT (h)", 1 / 3600, "min"),
    "median_jct_s": ("median JCT (h)", 1 / 3600, "min"),
    "p95_jct_s": ("p95 JCT (h)", 1 / 3600, "min"),
    "p99_jct_s": ("p99 JCT (h)", 1 / 3600, "min"),
    "avg_queue_s": ("avg queueing (h)", 1 / 3600, "min"),
    "makespan_s": ("makespan (h)", 1 / 3600, "min"),
    "utilization": ("utilisation (%)", 100.0, "max"),
    "avg_throughput_samples_s": ("avg throughput (samples/s)", 1.0, "max"),
    "peak_throughput_samples_s": ("peak throughput (samples/s)", 1.0, None),
    "avg_restarts": ("avg restarts", 1.0, "min"),
    "deadline_ratio": ("deadlines met", 1.0, "max"),
    "ftf_rho_mean": ("finish-time fairness ρ", 1.0, "min"),
    "solver_s_mean": ("solver (s)", 1.0, None),
    "fallbacks": ("fallbacks", 1.0, None),
    "avg_jct_all_s": ("avg JCT, all jobs (h)", 1 / 3600, "min"),
    "p99_jct_all_s": ("p99 JCT, all jobs (h)", 1 / 3600, "min"),
    "sla_kept": ("SLAs kept", 1.0, "max"),
    "sla_jobs": ("SLA jobs", None, None),
    "avg_jct_lower_bound_s": ("avg JCT lower bound (h)", 1 / 3600, None),
    # the bound as the all-jobs average counts (each job until min(finish, replay's end)):
    # below the one above for a policy that left jobs unfinished
    "avg_jct_all_lower_bound_s": ("lower bound, all jobs as counted (h)", 1 / 3600, None),
    "avg_jct_to_bound": ("avg JCT / lower bound", 1.0, "min"),
    "error": ("error", None, None),  # a policy whose runs failed says so (text, as written)
}


def fmt(x: float) -> str:
    """Three significant digits in plain notation (``0.000556``, ``12.3``, ``4570``)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return np.format_float_positional(x, precision=3, unique=False, fractional=False,
                                      trim="-")


# -- statistics ---------------------------------------------------------------------------------
def bootstrap_band(ys: np.ndarray, lo: float | None = 0.0, hi: float | None = None,
                   samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
                   ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Mean over rows (seeds) and the 95 % percentile-bootstrap band of that mean, clipped
    to ``[lo, hi]``; no band (``None``) for one row."""
    ys = np.asarray(ys, dtype=float)
    mean = ys.mean(axis=0)
    if ys.shape[0] < 2:
        return _clip(mean, lo, hi), None, None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ys.shape[0], size=(samples, ys.shape[0]))
    boot = ys[idx].mean(axis=1)  # samples x grid
    low, high = np.percentile(boot, [2.5, 97.5], axis=0)
    return _clip(mean, lo, hi), _clip(low, lo, hi), _clip(high, lo, hi)


def _clip(a: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    return np.clip(a, -np.inf if lo is None else lo, np.inf if hi is None else hi)


# -- what the runs say about themselves --------------------------------------------------------------
def _runs(root: Path, policies: list[str], seeds: int) -> dict[str, list[Path]]:
    return {p: [root / f"{p}-s{s}" for s in range(seeds)
                if (root / f"{p}-s{s}" / "jobs.csv").exists()] for p in policies}


def describe(root: Path, policies: list[str], seeds: int) -> dict[str, Any]:
    """Trace, cluster, information mode, estimator and seeds, from the runs' summaries."""
    seen: dict[str, set[str]] = {k: set() for k in ("trace", "cluster", "information",
                                                    "estimator")}
    n = 0
    for p in policies:
        k = 0
        for s in range(seeds):
            f = root / f"{p}-s{s}" / "summary.json"
            if f.exists():
                summ = json.loads(f.read_text())
                for key, values in seen.items():
                    if summ.get(key) is not None:
                        values.add(str(summ[key]))
                k += 1
        n = max(n, k)
    # a generated trace is named per seed (synthetic-n20-s0, -s1, ...): one name for all
    seen["trace"] = {re.sub(r"-s\d+$", "", t) for t in seen["trace"]}
    return {**{k: ", ".join(sorted(v)) or "?" for k, v in seen.items()}, "seeds": n}


def title(info: dict[str, Any]) -> str:
    seeds = info["seeds"]
    trace = ", ".join(public_name(t) for t in str(info["trace"]).split(", "))
    return (f"{trace} on {info['cluster']} — {info['information']} information, "
            f"{seeds} seed{'s' if seeds != 1 else ''}")


def line_style(k: int) -> dict[str, Any]:
    """The ``k``-th policy's line: a style and a marker every tenth of the axis (colour
    comes from matplotlib's cycle)."""
    ls, mk = STYLES[k % len(STYLES)]
    return {"ls": ls, "marker": mk, "markevery": 0.1, "ms": 4}


# -- plots -----------------------------------------------------------------------------------------
def _series(curves: list[tuple[np.ndarray, np.ndarray]], lo: float | None, hi: float | None
            ) -> dict[str, Any] | None:
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return None
    grid = np.linspace(0.0, max(float(x[-1]) for x, _ in curves), GRID)
    ys = np.array([np.interp(grid, x, y) for x, y in curves])
    mean, low, high = bootstrap_band(ys, lo, hi)
    return {"x": grid, "mean": mean, "lo": low, "hi": high, "seeds": len(curves)}


def series(root: Path, policies: list[str], seeds: int) -> dict[str, dict[str, Any]]:
    """Per plot and policy: the grid, the mean over seeds and the band (None for one seed)."""
    from apportion.experiments.metrics import jct_cdf

    out: dict[str, dict[str, Any]] = {k: {} for k in ("jct_cdf", "throughput", "queue",
                                                      "utilization")}
    for p, dirs in _runs(root, policies, seeds).items():
        cdfs, thr, queue, util = [], [], [], []
        for d in dirs:
            jobs = pd.read_csv(d / "jobs.csv")
            x, y = jct_cdf(jobs)
            if len(x):
                cdfs.append((y, x / 3600))  # JCT quantiles: the probability is the grid
            tl = pd.read_csv(d / "timeline.csv")
            if len(tl):
                h = ((tl["t"] - tl["t"].iloc[0]) / 3600).to_numpy()
                thr.append((h, tl["throughput_samples_s"].to_numpy()))
                queue.append((h, tl["queued"].to_numpy()))
                cols = [c for c in tl.columns if c.startswith("util_")]
                if cols:
                    util.append((h, tl[cols].mean(axis=1).to_numpy()))
        if cdfs:
            grid = np.linspace(0.0, 1.0, GRID // 2)
            qs = np.array([np.interp(grid, pr, jct) for pr, jct in cdfs])
            mean, low, high = bootstrap_band(qs, 0.0, None)
            out["jct_cdf"][p] = {"x": grid, "mean": mean, "lo": low, "hi": high,
                                 "seeds": len(cdfs)}
        for name, curves, lo, hi in (("throughput", thr, 0.0, None), ("queue", queue, 0.0, None),
                                     ("utilization", util, 0.0, 1.0)):
            s = _series(curves, lo, hi)
            if s is not None:
                out[name][p] = s
    return out


LABELS = {"jct_cdf": ("JCT (h)", "fraction of finished jobs"),
          "throughput": ("time (h)", "throughput (samples/s)"),
          "queue": ("time (h)", "queued jobs"),
          "utilization": ("time (h)", "mean GPU utilisation")}


def figures(root: Path, policies: list[str], seeds: int) -> dict[str, Any]:
    """The matplotlib figures (not saved): name -> Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = describe(root, policies, seeds)
    data = series(root, policies, seeds)
    figs: dict[str, Any] = {}
    for name, per_policy in data.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for k, (p, s) in enumerate(per_policy.items()):
            style = line_style(policies.index(p) if p in policies else k)
            label = f"{p} ({s['seeds']} seed{'s' if s['seeds'] != 1 else ''}" + (
                ", 95 % bootstrap band)" if s["lo"] is not None else ", no band)")
            if name == "jct_cdf":
                line = ax.plot(s["mean"], s["x"], label=label, lw=1.0, **style)[0]
                if s["lo"] is not None:
                    ax.fill_betweenx(s["x"], s["lo"], s["hi"], color=line.get_color(),
                                     alpha=0.2, lw=0)
            else:
                line = ax.plot(s["x"], s["mean"], label=label, lw=0.9, **style)[0]
                if s["lo"] is not None:
                    ax.fill_between(s["x"], s["lo"], s["hi"], color=line.get_color(),
                                    alpha=0.2, lw=0)
        ax.set_xlabel(LABELS[name][0])
        ax.set_ylabel(LABELS[name][1])
        ax.set_title(title(info), fontsize=9)
        ax.set_xlim(left=0)
        if name == "utilization":
            ax.set_ylim(0, 1.02)
        elif name == "jct_cdf":
            ax.set_ylim(0, 1.0)
        else:
            ax.set_ylim(bottom=0)
        ax.ticklabel_format(axis="both", style="plain", useOffset=False)
        if per_policy:
            ax.legend(fontsize=7)
        fig.tight_layout()
        figs[name] = fig
    by_type = _util_by_type(root, policies, seeds, plt)
    if by_type is not None:
        by_type.axes[0].set_title(title(info), fontsize=9)
        figs["utilization_by_type"] = by_type
    return figs


def _util_by_type(root: Path, policies: list[str], seeds: int, plt: Any) -> Any:
    rows = {}
    for p in policies:
        per_seed = [json.loads(f.read_text()).get("utilization_by_type", {})
                    for f in (root / f"{p}-s{s}" / "summary.json" for s in range(seeds))
                    if f.exists()]
        if per_seed:
            rows[p] = pd.DataFrame(per_seed).mean().to_dict()
    if not rows:
        return None
    df = pd.DataFrame(rows).T.fillna(0.0).clip(0.0, 1.0)
    ax = df.plot.bar(figsize=(7, 4.2), edgecolor="black", lw=0.5)
    for bars, hatch in zip(ax.containers, ["", "//", "..", "xx", "\\\\", "oo", "--", "++"] * 2):
        for bar in bars:
            bar.set_hatch(hatch)  # a type's bars read apart in grey too
    ax.set_ylabel("utilisation by GPU type (mean over seeds)")
    ax.set_ylim(0, 1.02)
    ax.figure.tight_layout()
    return ax.figure


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [round(float(x), 6) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def save_figure(fig: Any, stem: Path) -> None:
    """``fig`` as ``stem``.png, .pdf and .svg (:data:`FORMATS`), then closed."""
    import matplotlib.pyplot as plt

    for ext in FORMATS:
        fig.savefig(stem.with_name(f"{stem.name}.{ext}"), dpi=PNG_DPI if ext == "png" else None,
                    metadata={"Date": None} if ext == "svg" else None)
    plt.close(fig)


def write_plots(root: Path, policies: list[str], seeds: int) -> None:
    """JCT CDF, throughput, queue, utilisation (and by GPU type), each as PNG, PDF and SVG,
    and plots.json."""
    for name, fig in figures(root, policies, seeds).items():
        save_figure(fig, root / name)
    info = describe(root, policies, seeds)
    data = {"title": title(info), **info,
            "band": "95 % percentile bootstrap of the mean over seeds, clipped to what is "
                    "physical; none for one seed",
            "units": {"x": {"jct_cdf": "probability", "else": "hours"},
                      "jct_cdf": "hours", "throughput": "samples/s", "queue": "jobs",
                      "utilization": "fraction"},
            **_jsonable(series(root, policies, seeds))}
    (root / "plots.json").write_text(json.dumps(data, indent=1) + "\n")


# -- the table ------------------------------------------------------------------------------------
def summary_markdown(mean: pd.DataFrame, header: str) -> str:
    """``summary.md``: hours, ``mean ± ci`` (``± n/a`` for one seed), the best in bold."""
    from apportion.tables import markdown_table

    cols = [c for c in TABLE if c in mean.columns]
    best: dict[str, set[int]] = {}
    for c in cols:
        better = TABLE[c][2]
        vals = pd.to_numeric(mean[c], errors="coerce")
        if better is None or vals.notna().sum() < 2 or vals.nunique(dropna=True) < 2:
            continue
        target = vals.min() if better == "min" else vals.max()
        best[c] = {i for i, v in enumerate(vals) if pd.notna(v) and np.isclose(v, target)}
    rows = []
    for i, (_, r) in enumerate(mean.iterrows()):
        row: list[Any] = [str(r["policy"])]
        for c in cols:
            scale = TABLE[c][1]
            v = r[c]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                row.append("")
                continue
            if isinstance(v, str):
                row.append(v)
                continue
            if scale is None:
                row.append(str(int(v)) if float(v).is_integer() else fmt(v))
                continue
            cell = fmt(float(v) * scale)
            ci = r.get(f"{c}_ci95")
            if f"{c}_ci95" in mean.columns:
                seeds = int(r.get("seeds") or 1)
                cell += (" ± n/a" if seeds < 2 or ci is None or pd.isna(ci)
                         else f" ± {fmt(float(ci) * scale)}")
            if i in best.get(c, set()):
                cell = f"**{cell}**"
            row.append(cell)
        rows.append(row)
    headers = ["policy"] + [TABLE[c][0] for c in cols]
    return header + markdown_table(headers, rows, ["l"] + ["r"] * len(cols))


def write_summary_markdown(root: Path, mean: pd.DataFrame,
                           results: list[tuple[str, int, dict[str, Any]]]) -> None:
    """``summary.md`` under ``root`` for ``mean`` (the harness's per-policy frame)."""
    def one(key: str) -> str:
        values = {str(s.get(key, "?")) for _, _, s in results}
        if key == "trace":
            values = {re.sub(r"-s\d+$", "", v) for v in values}
        return ", ".join(sorted(values)) or "?"

    seeds = int(mean["seeds"].max()) if "seeds" in mean.columns and len(mean) else 0
    header = (f"information: {one('information')}; estimator: {one('estimator')}; "
              f"trace: {one('trace')}; cluster: {one('cluster')}; seeds: {seeds}\n\n"
              "Mean over seeds ± the 95 % confidence interval (Student's t; n/a for one "
              "seed); times in hours; the best of each column in **bold**.\n\n")
    (root / "summary.md").write_text(summary_markdown(mean, header))
