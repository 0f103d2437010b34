"""``apportion bench estimate``: estimator accuracy against measured iteration times.

* ``--against morphling``: fit :class:`MorphlingEstimator` on the artifact's own
  fitting samples (``profile/<model>``) and predict every measured trace row
  (``traces/<model>/placements.csv``); a second, clearly separate variant also
  fits on ``augment`` trace rows and scores only the rows it did not see.
* ``--against crius``: calibrate the cell and analytic estimators' per-GPU-type
  efficiency on half of Crius's jobs, score the other half (error, and the
  Spearman rank agreement of each job's cells).
* ``--against local``: real training iterations of small catalog models on
  this machine (torch gloo, up to 4 processes) under several plans; Morphling
  fitted on 7 of them predicts the rest; plus the profiling cost of a cell.

Every result has, per model and plan family, ``n``, ``mean_error`` and
``max_error`` (fractions, ``|predicted - measured| / measured``) and an
``overall`` entry with the same keys.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from apportion.estimation.base import Sample
from apportion.experiments.bench.accuracy import rel_err, spearman, summarize
from apportion.experiments.bench.estimate_local import bench_local

from apportion.jobs import JobSpec
from apportion.plans import Cell

log = logging.getLogger(__name__)

def _data() -> Path:
    """``$APPORTION_DATA`` (or ../shared/data), read when a benchmark runs."""
    from apportion.env import data_root

    return data_root()

# Morphling table 2 (mean / max error, %), for the side-by-side
PAPER_TABLE2 = {
    "vit": {"DP": (3.63, 6.83), "GC": (2.59, 6.19), "ZeRO-DP+GA": (4.23, 6.67),
            "ZeRO-Offload": (3.00, 8.32)},
    "roberta": {"DP": (2.21, 4.37), "GC": (3.36, 4.29), "ZeRO-DP+GA": (3.59, 6.71),
                "ZeRO-Offload": (7.42, 10.44)},
    "bert": {"DP": (5.27, 8.32), "GC": (4.90, 7.27), "ZeRO-DP+GA": (3.7, 6.90),
             "ZeRO-Offload": (6.37, 8.62)},
    "t5": {"TP+PP": (3.18, 8.24), "DP+TP+PP": (2.41, 9.55), "ZeRO-DP+GA": (6.71, 9.55),
           "ZeRO-Offload+GC": (4.37, 6.34)},
    "gpt2": {"TP+PP": (2.39, 3.08), "DP+TP+PP": (2.80, 4.15), "ZeRO-DP+GA": (2.52, 3.86),
             "ZeRO-Offload+GC": (5.52, 8.90)},
    "llama7": {"TP+PP": (1.90, 2.90), "DP+TP+PP": (4.70, 9.45),
               "ZeRO-Offload+GC": (4.09, 6.38)},
    "llama30": {"TP+PP": (4.29, 8.52), "DP+TP+PP": (6.15, 9.69)},
}


# ---------------------------------------------------------------------------
# Morphling
# ---------------------------------------------------------------------------
def bench_morphling(root: Path | None = None, protocols: tuple[str, ...] | None = None
                    ) -> dict[str, Any]:
    """Morphling's model under every protocol of
    :mod:`~apportion.experiments.bench.estimate_morphling` (held-out rows only)."""
    from apportion.experiments.bench import estimate_morphling as em
    from apportion.experiments.bench import morphling_data as md

    root = root or _data() / "morphling"
    res = {p: em.run_protocol(p, root) for p in (protocols or em.PROTOCOLS)}
    main = res.get("covering") or next(iter(res.values()))
    return {
        "against": "morphling",
        "protocols": {p: {k: v for k, v in r.items() if k != "rows"} for p, r in res.items()},
        "rows": {p: r["rows"] for p, r in res.items()},
        "models": {m: {t["family"]: {k: t[k] for k in ("n", "mean_error", "max_error")}
                       for t in main["tables"]["model_family"] if t["model"] == m}
                   for m in md.MODELS},
        "overall": main["overall"],
        "targets": em.TARGETS,
        "paper_table2": PAPER_TABLE2,
        "skipped": md.SKIPPED,
        "notes": [(em.__doc__ or "").strip(), (md.__doc__ or "").strip()],
    }


# ---------------------------------------------------------------------------
# Crius
# ---------------------------------------------------------------------------
def _best_over_stages(est: Any, r: Any, cluster: Any) -> Any:
    job = JobSpec(id=r.job, model=r.model, global_batch_size=r.batch, iterations=1,
                  requested_gpus=r.gpus, requested_gpu_type=r.gpu_type)
    best = None
    s = 1
    while s <= r.gpus:
        e = est.best_in_cell(job, Cell(job.id, r.gpu_type, r.gpus, s), cluster)
        if e is not None and e.feasible and (best is None or e.iter_time_s < best.iter_time_s):
            best = e
        s *= 2
    return job, best


def bench_crius(root: Path | None = None) -> dict[str, Any]:
    from apportion.estimation.models.analytic import AnalyticEstimator, nominal_placement
    from apportion.estimation.models.crius import CellEstimator
    from apportion.experiments.bench import crius_data as cd

    root = root or _data() / "crius"
    rows = cd.load(root)
    jobs = sorted({r.job for r in rows})
    train_jobs = set(jobs[::2])
    out: dict[str, Any] = {"against": "crius", "split": {"train_jobs": sorted(train_jobs),
                                                         "test_jobs": sorted(set(jobs) -
                                                                             train_jobs)}}
    for name, make in (("cell", CellEstimator), ("analytic", AnalyticEstimator),
                       ("cell_per_family", CellEstimator)):
        # an uncalibrated start: the shipped calibration was fitted on this very data
        base = AnalyticEstimator(efficiency=0.45) if make is AnalyticEstimator else make()
        ratios: dict[str, list[float]] = {}
        for r in rows:
            if r.job not in train_jobs or r.iter_time_s <= 0:
                continue
            cl = cd.cluster_for(r)
            job, e = _best_over_stages(base, r, cl)
            if e is None:
                continue
            if name.startswith("cell"):
                # time scales as 1/efficiency: efficiency = base x predicted / measured
                key = r.gpu_type if name == "cell" else f"{r.gpu_type}|{r.family}"
                ratios.setdefault(key, []).append(
                    base.efficiency * e.iter_time_s / r.iter_time_s)
            else:
                placement = nominal_placement(cl, r.gpu_type, r.gpus) or {}
                one = AnalyticEstimator().fit(
                    [Sample(job, e.plan, placement, r.gpu_type, r.iter_time_s)], cl)
                ratios.setdefault(r.gpu_type, []).extend(one.efficiency_.values())
        fitted = make()
        fitted.efficiency_ = {g: statistics.median(v) for g, v in ratios.items()}
        fam_err: dict[str, list[float]] = {}
        by_job: dict[str, tuple[list[float], list[float]]] = {}
        oom = {"measured_oom": 0, "predicted_oom_too": 0}
        for r in rows:
            if r.job in train_jobs:
                continue
            cl = cd.cluster_for(r)
            _, e = _best_over_stages(fitted, r, cl)
            if r.iter_time_s <= 0:
                oom["measured_oom"] += 1
                oom["predicted_oom_too"] += int(e is None)
                continue
            if e is None:
                fam_err.setdefault(f"{r.family}|{r.gpu}|predicted-oom", []).append(1.0)
                continue
            err = rel_err(e.iter_time_s, r.iter_time_s)
            fam_err.setdefault(f"{r.family}|{r.gpu}", []).append(err)
            a, b = by_job.setdefault(r.job, ([], []))
            a.append(e.iter_time_s)
            b.append(r.iter_time_s)
        rhos = {j: spearman(a, b) for j, (a, b) in by_job.items() if len(a) >= 3}
        models: dict[str, Any] = {}
        for key, errs in sorted(fam_err.items()):
            fam, rest = key.split("|", 1)
            models.setdefault(fam, {})[rest] = summarize(errs)
        valid = [v for v in rhos.values() if not math.isnan(v)]
        allerr = [x for k, v in fam_err.items() for x in v]
        out[name] = {"models": models, "overall": {**summarize(allerr),
                                                   "spearman": statistics.fmean(valid)
                                                   if valid else float("nan")},
                     "spearman_per_job": rhos, "efficiency": fitted.efficiency_, "oom": oom}
    out["models"] = out["cell"]["models"]
    out["overall"] = out["cell"]["overall"]
    out["spearman"] = out["cell"]["overall"]["spearman"]
    out["crius_own_estimates"] = crius_own_accuracy(root, test_jobs=set(jobs) - train_jobs)
    return out


def crius_own_accuracy(root: Path, test_jobs: set[str] | None = None) -> dict[str, Any]:
    """The reference: Crius's own estimates (``prof_database_est.json``: its profiler run on
    the real GPUs, best (pp, dp, mp) per configuration) against the same measurements."""
    est = json.loads((root / "converted" / "prof_database_est.json").read_text())
    meas = json.loads((root / "converted" / "prof_database.json").read_text())["optimal"]
    errs: list[float] = []
    fams: dict[str, list[float]] = {}
    by_job: dict[str, tuple[list[float], list[float]]] = {}
    for job, cfgs in est.items():
        if job not in meas or (test_jobs is not None and job not in test_jobs):
            continue
        for cfg, plans in cfgs.items():
            m = meas[job].get(cfg, -1.0)
            if not isinstance(plans, list):
                continue
            vals = [p[4] for p in plans if isinstance(p, list) and len(p) >= 5 and p[4]
                    and p[4] > 0 and math.isfinite(p[4])]
            if m <= 0 or not vals:
                continue
            e = rel_err(min(vals), m)
            errs.append(e)
            fams.setdefault(job.split("_")[0], []).append(e)
            a, b = by_job.setdefault(job, ([], []))
            a.append(min(vals))
            b.append(m)
    rhos = [r for r in (spearman(a, b) for a, b in by_job.values() if len(a) >= 3)
            if not math.isnan(r)]
    return {"overall": {**summarize(errs), "median_error": statistics.median(errs) if errs
                        else float("nan"),
                        "spearman": statistics.fmean(rhos) if rhos else float("nan")},
            "families": {f: summarize(v) for f, v in fams.items()},
            "note": "jobs of the test half only where the est file has them; Crius's own "
                    "estimator needs its profiler on the real GPUs, which apportion lacks here"}


def run(against: str, **kw: Any) -> dict[str, Any]:
    if against == "morphling":
        return bench_morphling(**kw)
    if against == "crius":
        return bench_crius(**kw)
    if against == "local":
        return bench_local(**kw)
    raise ValueError(f"unknown benchmark {against!r}; choose morphling, crius or local")


def _family_table(models: dict[str, Any], overall: dict[str, Any],
                  paper: dict[str, Any]) -> list[str]:
    """Rows per model and plan family, then the overall row (markdown)."""
    from apportion.tables import markdown_table

    rows = []
    for model, fams in models.items():
        for fam, v in fams.items():
            if not isinstance(v, dict) or "mean_error" not in v:
                continue
            ref = paper.get(model, {}).get(fam)
            rows.append([model, fam, str(v["n"]), f"{100 * v['mean_error']:.1f}%",
                         f"{100 * v['max_error']:.1f}%",
                         f"{ref[0]:.2f}% / {ref[1]:.2f}%" if ref else ""])
    rows.append(["**overall**", "", str(overall["n"]), f"{100 * overall['mean_error']:.1f}%",
                 f"{100 * overall['max_error']:.1f}%", ""])
    return markdown_table(["model", "plan family", "n", "mean error", "max error",
                           "paper mean / max"], rows,
                          align=["", "", "r", "r", "r", ""]).rstrip("\n").split("\n")


def morphling_markdown(result: dict[str, Any], full: bool = False) -> str:
    """Per protocol: the summary against the targets, the per-family table and the worst rows
    with where their error lives (``full``: also by placement kind and GPU count)."""
    from apportion.experiments.bench.estimate_morphling import protocol_markdown
    from apportion.tables import markdown_table

    lines = ["# Estimator accuracy against morphling", "",
             "Held-out rows only (see the protocols below); errors are |predicted - measured| / "
             "measured.", ""]
    rows = []
    for name, r in result["protocols"].items():
        o = r["overall"]
        target = result.get("targets", {}).get(name)
        rows.append([f"`{name}`", str(o["n"]), f"{100 * o['mean_error']:.1f}%",
                     f"{100 * o['max_error']:.1f}%",
                     "" if not target else " / ".join("-" if t is None else f"{t:g}%"
                                                      for t in target)])
    lines += markdown_table(["protocol", "rows scored", "mean error", "max error",
                             "target mean / max"], rows,
                            align=["", "r", "r", "r", ""]).rstrip("\n").split("\n")
    for name, r in result["protocols"].items():
        lines += ["", f"## Protocol `{name}`", ""]
        lines += protocol_markdown({**r, "rows": result["rows"][name]}, full=full)
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    """A markdown table of a result (per model and family, then overall)."""
    if result.get("against") == "morphling" and "protocols" in result:
        return morphling_markdown(result)
    paper = result.get("paper_table2", {})
    lines = [f"# Estimator accuracy against {result['against']}", ""]
    lines += _family_table(result.get("models", {}), result["overall"], paper)
    if "spearman" in result:
        lines += ["", f"Mean Spearman rank agreement of cells per job: {result['spearman']:.3f}"]
    own = result.get("crius_own_estimates")
    if own:
        o = own["overall"]
        lines += ["", f"Reference, Crius's own profiler-based estimates on the same test jobs: "
                  f"n={o['n']}, mean {100 * o['mean_error']:.1f}%, median "
                  f"{100 * o['median_error']:.1f}%, max {100 * o['max_error']:.1f}%, "
                  f"Spearman {o['spearman']:.3f}"]
    for est_name, v in result.get("estimators", {}).items():
        lines.append(f"\n{est_name}: n={v['n']}, mean {100 * v['mean_error']:.1f}%, "
                     f"max {100 * v['max_error']:.1f}%")
    for section in ("single_node", "covering"):
        sec = result.get(section)
        if not sec:
            continue
        lines += ["", f"## Protocol `{section}`", "", sec.get("note", ""), ""]
        lines += _family_table(sec["models"], sec["overall"], paper)
    for label, by in (("all rows, profile-only fit", result.get("by_placement")),
                      ("covering fit", (result.get("covering") or {}).get("by_placement"))):
        if by:
            lines += ["", f"By placement ({label}): " + "; ".join(
                f"{k} n={v['n']} mean {100 * v['mean_error']:.1f}% max "
                f"{100 * v['max_error']:.1f}%" for k, v in by.items())]
    return "\n".join(lines) + "\n"


def fit_analytic_from_crius(root: Path | None = None) -> Any:
    """An :class:`AnalyticEstimator` whose per-GPU-type efficiency is fitted on all of Crius's
    measured iteration times (the spine's default 0.45 is optimistic by 2-3x on that data)."""
    from apportion.estimation.models.analytic import AnalyticEstimator, nominal_placement
    from apportion.experiments.bench import crius_data as cd

    rows = cd.load(root or _data() / "crius")
    base = AnalyticEstimator(efficiency=0.45)
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r.iter_time_s <= 0:
            continue
        cl = cd.cluster_for(r)
        job, e = _best_over_stages(base, r, cl)
        if e is None:
            continue
        placement = nominal_placement(cl, r.gpu_type, r.gpus) or {}
        one = AnalyticEstimator().fit([Sample(job, e.plan, placement, r.gpu_type,
                                              r.iter_time_s)], cl)
        ratios.setdefault(r.gpu_type, []).extend(one.efficiency_.values())
    fitted = AnalyticEstimator()
    fitted.efficiency_ = {g: statistics.median(v) for g, v in ratios.items()}
    return fitted
