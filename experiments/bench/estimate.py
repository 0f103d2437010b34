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
import re
import statistics
from pathlib import Path
from typing import Any

from apportion.estimation.base import Sample
from apportion.experiments.bench.accuracy import rel_err, spearman, summarize
from apportion.experiments.bench.estimate_morphling import bench_morphling, morphling_markdown
from apportion.experiments.bench.estimate_local import bench_local

from apportion.jobs import JobSpec
from apportion.plans import Cell

log = logging.getLogger(__name__)

def _data() -> Path:
    """``$APPORTION_DATA`` (or ../shared/data), read when a benchmark runs."""
    from apportion.env import data_root

    return data_root()

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


CRIUS_FOLDS = 5
CRIUS_ESTIMATORS = ("cell", "cell_per_family", "cell_calibrated", "analytic")


def crius_splits(rows: list[Any]) -> dict[str, list[tuple[set[str], set[str]]]]:
    """Held-out splits of Crius's jobs, fixed (no seed): ``half``, every other job sorted by
    name trains (the split of the earlier tables); ``kfold``, five folds by model (a model's
    every batch size held out together, models sorted by name and dealt round-robin), so a
    score never sees another batch of the same model in its fit."""
    jobs = sorted({r.job for r in rows})
    half = [(set(jobs[::2]), set(jobs) - set(jobs[::2]))]
    models = sorted({r.job.rsplit("_", 1)[0] for r in rows})
    kfold = []
    for k in range(CRIUS_FOLDS):
        held = set(models[k::CRIUS_FOLDS])
        test = {j for j in jobs if j.rsplit("_", 1)[0] in held}
        kfold.append((set(jobs) - test, test))
    return {"half": half, "kfold": kfold}


def _fit_crius(name: str, rows: list[Any], train: set[str]) -> Any:
    """One estimator calibrated on the measured cells of ``train`` (see
    :meth:`CellEstimator.fit`; the analytic one per GPU type from each cell's best plan)."""
    from apportion.estimation.models.analytic import AnalyticEstimator, nominal_placement
    from apportion.estimation.models.crius import CellEstimator
    from apportion.experiments.bench import crius_data as cd

    calibration = {"cell": "type", "cell_per_family": "family", "cell_calibrated": "cell"}
    base = AnalyticEstimator(efficiency=0.45) if name == "analytic" else CellEstimator()
    samples, clusters, ratios = [], [], {}
    for r in rows:
        if r.job not in train or r.iter_time_s <= 0:
            continue
        cl = cd.cluster_for(r)
        job, e = _best_over_stages(base, r, cl)
        if e is None:
            continue
        placement = nominal_placement(cl, r.gpu_type, r.gpus) or {}
        sample = Sample(job, e.plan, placement, r.gpu_type, r.iter_time_s)
        if name == "analytic":
            one = AnalyticEstimator().fit([sample], cl)
            ratios.setdefault(r.gpu_type, []).extend(one.efficiency_.values())
        samples.append(sample)
        clusters.append(cl)
    if name == "analytic":
        fitted = AnalyticEstimator()
        fitted.efficiency_ = {g: statistics.median(v) for g, v in ratios.items()}
        return fitted
    return CellEstimator(calibration=calibration[name]).fit(samples, clusters)


def bench_crius(root: Path | None = None) -> dict[str, Any]:
    """The cell and analytic estimators against Crius's Alpa-tuned measurements, held out by
    :func:`crius_splits`; per split and estimator the mean error, the mean Spearman of each
    job's cells, the same on exactly the rows Crius's own estimates cover, and OOMs."""
    from apportion.experiments.bench import crius_data as cd

    root = root or _data() / "crius"
    rows = cd.load(root)
    own = crius_own_accuracy(root)
    out: dict[str, Any] = {"against": "crius", "folds": CRIUS_FOLDS}
    for split, folds in crius_splits(rows).items():
        res: dict[str, Any] = {}
        test_jobs = set().union(*(t for _, t in folds))
        for name in CRIUS_ESTIMATORS:
            preds: dict[tuple[str, str, int, int], float | None] = {}
            for train, test in folds:
                fitted = _fit_crius(name, rows, train)
                for r in rows:
                    if r.job in test:
                        _, e = _best_over_stages(fitted, r, cd.cluster_for(r))
                        preds[(r.job, r.gpu, r.hosts, r.per_host)] = \
                            None if e is None else e.iter_time_s
            res[name] = _score_crius(rows, preds, own["rows"])
        ref = {k: v for k, v in own["rows"].items() if k[0] in test_jobs}
        res["crius_own"] = _score_crius(rows, {k: v for k, v in ref.items()}, ref)
        out[split] = res
    out["models"] = out["kfold"]["cell_calibrated"]["models"]
    out["overall"] = out["kfold"]["cell_calibrated"]["overall"]
    out["spearman"] = out["overall"]["spearman"]
    out["split_jobs"] = {"half_test": sorted(crius_splits(rows)["half"][0][1])}
    return out


def _score_crius(rows: list[Any], preds: dict[tuple[str, str, int, int], float | None],
                 own: dict[tuple[str, str, int, int], float]) -> dict[str, Any]:
    """Errors per family and GPU, overall (a predicted OOM of a measured cell counts as
    error 1), mean Spearman of each job's cells (jobs with three or more), the same on the
    rows ``own`` covers, and the OOM tally."""
    fam_err: dict[str, list[float]] = {}
    by_job: dict[str, tuple[list[float], list[float]]] = {}
    same: list[float] = []
    same_job: dict[str, tuple[list[float], list[float]]] = {}
    oom = {"measured_oom": 0, "predicted_oom_too": 0, "predicted_oom_of_measured": 0}
    scored: list[dict[str, Any]] = []
    for r in rows:
        key = (r.job, r.gpu, r.hosts, r.per_host)
        if key not in preds:
            continue
        p = preds[key]
        if r.iter_time_s <= 0:
            oom["measured_oom"] += 1
            oom["predicted_oom_too"] += int(p is None)
            continue
        if p is None:
            oom["predicted_oom_of_measured"] += 1
            fam_err.setdefault(f"{r.family}|{r.gpu}|predicted-oom", []).append(1.0)
            continue
        err = rel_err(p, r.iter_time_s)
        scored.append({"job": r.job, "gpu": r.gpu, "cell": f"{r.hosts}x{r.per_host}",
                       "measured_s": r.iter_time_s, "predicted_s": p, "error": err})
        fam_err.setdefault(f"{r.family}|{r.gpu}", []).append(err)
        a, b = by_job.setdefault(r.job, ([], []))
        a.append(p)
        b.append(r.iter_time_s)
        if key in own:
            same.append(err)
            a, b = same_job.setdefault(r.job, ([], []))
            a.append(p)
            b.append(r.iter_time_s)

    def rho(groups: dict[str, tuple[list[float], list[float]]]) -> float:
        vals = [v for a, b in groups.values() if len(a) >= 3
                if not math.isnan(v := spearman(a, b))]
        return statistics.fmean(vals) if vals else float("nan")

    models: dict[str, Any] = {}
    for key, errs in sorted(fam_err.items()):
        fam, rest = key.split("|", 1)
        models.setdefault(fam, {})[rest] = summarize(errs)
    allerr = [x for v in fam_err.values() for x in v]
    return {"models": models,
            "overall": {**summarize(allerr), "median_error": statistics.median(allerr)
                        if allerr else float("nan"), "spearman": rho(by_job)},
            "on_crius_rows": {**summarize(same), "spearman": rho(same_job)},
            "oom": oom, "worst": sorted(scored, key=lambda x: -x["error"])[:10]}


def crius_own_accuracy(root: Path, test_jobs: set[str] | None = None) -> dict[str, Any]:
    """The reference: Crius's own estimates (``prof_database_est.json``: its profiler run on
    the real GPUs, best (pp, dp, mp) per configuration) against the same measurements."""
    est = json.loads((root / "converted" / "prof_database_est.json").read_text())
    meas = json.loads((root / "converted" / "prof_database.json").read_text())["optimal"]
    errs: list[float] = []
    fams: dict[str, list[float]] = {}
    by_job: dict[str, tuple[list[float], list[float]]] = {}
    rows: dict[tuple[str, str, int, int], float] = {}
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
            k = re.fullmatch(r"(\d+)_([a-z0-9]+)_(\d+)_n_(\d+)_d", cfg)
            if k:
                rows[(job, k.group(2), int(k.group(3)), int(k.group(4)))] = min(vals)
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
            "families": {f: summarize(v) for f, v in fams.items()}, "rows": rows,
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


def crius_markdown(result: dict[str, Any]) -> str:
    """Per split, every estimator's held-out error and rank agreement (on all rows and on
    exactly the rows Crius's own estimates cover); the headline estimator's per-family
    table and worst rows."""
    from apportion.tables import markdown_table

    lines = ["# Estimator accuracy against crius", "",
             ("Held out by job (`half`) and by model (`kfold`, 5 folds): see "
              "`crius_splits`. Errors are |predicted - measured| / measured; a measured "
              "cell predicted out of memory counts as 1. Spearman: mean over jobs with three "
              "or more measured cells."), ""]
    for split in ("half", "kfold"):
        res = result[split]
        rows = []
        for name, v in res.items():
            o, c = v["overall"], v["on_crius_rows"]
            rows.append([name, str(o["n"]), f"{100 * o['mean_error']:.1f}%",
                         f"{100 * o['median_error']:.1f}%", f"{100 * o['max_error']:.1f}%",
                         f"{o['spearman']:.3f}", str(c["n"]), f"{100 * c['mean_error']:.1f}%",
                         f"{c['spearman']:.3f}", str(v["oom"]["predicted_oom_of_measured"])])
        lines += [f"## Split `{split}`", ""]
        lines += markdown_table(["estimator", "n", "mean", "median", "max", "Spearman",
                                 "n (Crius's rows)", "mean there", "Spearman there",
                                 "measured, predicted OOM"], rows,
                                align=["", "r", "r", "r", "r", "r", "r", "r", "r", "r"]
                                ).rstrip("\n").split("\n")
        lines.append("")
    head = result["kfold"]["cell_calibrated"]
    lines += ["## `cell_calibrated`, 5 folds by model: per family and GPU type", ""]
    rows = [[fam, gpu, str(v["n"]), f"{100 * v['mean_error']:.1f}%",
             f"{100 * v['max_error']:.1f}%"]
            for fam, per in head["models"].items() for gpu, v in per.items()]
    lines += markdown_table(["family", "GPU", "n", "mean", "max"], rows,
                            align=["", "", "r", "r", "r"]).rstrip("\n").split("\n")
    lines += ["", "Worst rows:", ""]
    rows = [[w["job"], w["gpu"], w["cell"], f"{w['measured_s']:.2f}", f"{w['predicted_s']:.2f}",
             f"{100 * w['error']:.0f}%"] for w in head["worst"]]
    lines += markdown_table(["job", "GPU", "hosts x GPUs", "measured s", "predicted s", "error"],
                            rows, align=["", "", "", "r", "r", "r"]).rstrip("\n").split("\n")
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    """A markdown table of a result (per model and family, then overall)."""
    if result.get("against") == "morphling":
        return morphling_markdown(result)
    if result.get("against") == "crius":
        return crius_markdown(result)
    lines = [f"# Estimator accuracy against {result['against']}", ""]
    lines += _family_table(result.get("models", {}), result["overall"], {})
    for est_name, v in result.get("estimators", {}).items():
        lines.append(f"\n{est_name}: n={v['n']}, mean {100 * v['mean_error']:.1f}%, "
                     f"max {100 * v['max_error']:.1f}%")
    return "\n".join(lines) + "\n"


def errors_markdown(result: dict[str, Any]) -> str:
    """The full error tables of a ``--against morphling`` result (``bench estimate
    --errors``): every protocol by model x plan family, plan family x placement kind, GPU
    count x placement kind and model x placement kind, the worst rows overall and per model
    with where each one's error lives, and the rows excluded as inconsistent data."""
    if result.get("against") != "morphling":
        raise ValueError("the full error tables are Morphling's protocols'")
    return morphling_markdown(result, full=True)


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
