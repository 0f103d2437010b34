"""``apportion bench rates``: how accurate the ``estimated`` mode's rates are, per estimator.

In a replay's ``estimated`` information mode every policy reads
:class:`apportion.experiments.information.ProfiledRates`: each job measured (seeded
log-normal noise, sigma 0.1) on one GPU and on its requested count of every GPU type, every
other cell predicted from the nearest measurement by a scaling model, the ``--estimator``.
This benchmark scores those predictions against the truth the replay progresses by (what
the ``oracle`` mode returns with noise 0), on the cells a policy could be offered: every
GPU type of the trace's cluster x GPU counts 1, 2, 4, ... up to the type's capacity plus
the job's request, consolidated (placement None).

Only *held-out* cells are scored: the profiled points (1 GPU and the request, on each type)
are measurements, the same whatever the estimator, so they are left out. Per trace and
estimator:

* the rate: cells scored (truth and prediction both runnable), mean and median relative
  error ``|predicted - truth| / truth``, the share within 10 %;
* rank: per job, Spearman's rho between predicted and true rates over all its held-out
  cells (an unrunnable cell as rate 0 on its side, so every estimator is ranked on the same
  cells), averaged over the jobs whose truth tells at least three cells apart;
* relative speed: ``rate(cell) / rate(reference)`` against the truth's same ratio, the
  reference being the job's requested count on its requested type (or, with none, on the
  type the truth says is fastest at that count): the ratio the objective reads;
* runnability: cells predicted runnable that the truth says cannot run (rate 0), and cells
  predicted unrunnable that do run, counted apart from the errors.

Three views of the same cells: every held-out cell (the truth as the replay progresses by
it); only those whose truth is a measurement (each truth log-log interpolates the counts it
never measured, and records which: Crius's database, for one, measured few counts beyond
16 GPUs); only half and twice the request (with the request, the counts apportion's
candidates offer).

The trace, cluster and truth are what ``apportion compare`` builds
(:func:`apportion.experiments.harness.resolve`), one replay seed per profile-noise seed
(a raw Philly trace's adaptation onto Crius's models follows that seed too), with the
clusters and profiles of the quality tables (``experiments/results/quality/``) for the
named families (:data:`FAMILIES`). Deterministic: no clock is read. Each scaling model is
built once per run and cluster (:class:`ScalingCache`; ``--cache DIR`` keeps its rates on
disk): Crius's cell estimator takes about 35 CPU-minutes for the crius-1280 cells of the
quality tables' traces, the rest of a full run about a minute and a half.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from apportion.errors import InputError

#: the estimators scored by default (``auto`` is ``tables`` in a replay: every job is profiled)
SCORED_ESTIMATORS = ("analytic", "crius", "morphling", "tables")
#: seeds the command may ask for (each is every job's profile once more)
MAX_SEEDS = 100
#: how far off a cell may be and still count as "within": 10 %
WITHIN = 0.10
#: worst cells kept per trace and estimator
WORST = 5

_QUALITY = Path(__file__).resolve().parents[1] / "results" / "quality"


@dataclass(frozen=True)
class Family:
    """A quality-table row's trace: what ``apportion compare`` was given for it."""

    trace: str  # a bundled name, a file path, or ``philly-dN`` (written on demand)
    cluster: str
    profile: str = "default"
    head: int | None = None  # the row's own ``--max-jobs`` (ElasticFlow's 100-job slice)


#: the quality tables' trace families, with the cluster and profile each row used
FAMILIES: dict[str, Family] = {
    "crius-venus": Family("crius-venus", "crius-1280"),
    "crius-pai": Family("crius-pai", "crius-1280"),
    **{f"philly-d{d}": Family(f"philly-d{d}", "crius-1280") for d in (1, 4, 7, 10, 13)},
    "morphling-base": Family("morphling-base", "morphling-64"),
    "morphling-bp": Family("morphling-bp", "morphling-64"),
    "morphling-mt": Family("morphling-mt", "morphling-64"),
    "gavel-max-min-fairness": Family("gavel-max-min-fairness", "8:8:8", "gavel"),
    "elasticflow-philly": Family("elasticflow-philly",
                                 str(_QUALITY / "elasticflow-n32g8.yaml"), head=100),
    "fm-1-roberta-base": Family("fm-1-roberta-base", "32:0:0", "ymir"),
}
DEFAULT_TRACES = tuple(FAMILIES)
#: a trace that is not a named family runs on this cluster unless ``--cluster`` says
DEFAULT_CLUSTER = "crius-1280"
_PHILLY_DAY = re.compile(r"philly-d(\d+)")


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def check_estimators(names: Sequence[str] | None) -> list[str]:
    """``--estimator`` values: known estimators, each once (default: the four scored)."""
    from apportion.estimation.registry import estimator_names

    if not names:
        return list(SCORED_ESTIMATORS)
    known = estimator_names()
    out: list[str] = []
    for n in names:
        if n not in known:
            raise InputError("--estimator", "estimator",
                             f"{n!r} is not one of {', '.join(known)}")
        if n not in out:
            out.append(n)
    return out


def check_traces(specs: Sequence[str] | None) -> list[str]:
    """``--trace`` values: a named family, a bundled trace, ``philly-dN`` or a file."""
    from apportion.experiments import trace_catalog as catalog

    if not specs:
        return list(DEFAULT_TRACES)
    out: list[str] = []
    for s in specs:
        m = _PHILLY_DAY.fullmatch(s)
        if m and not 1 <= int(m.group(1)) <= 14:
            raise InputError("--trace", "trace", f"{s!r}: a Philly day is 1 to 14")
        if not (s in FAMILIES or m or s in catalog.BUNDLED or catalog.generated_family(s)
                or Path(s).is_file()):
            raise InputError("--trace", "trace",
                             f"{s!r} is neither a file nor a known trace; names: "
                             + ", ".join(sorted(set(FAMILIES) | set(catalog.BUNDLED)))
                             + ", philly-dN (N 1-14)")
        if s not in out:
            out.append(s)
    return out


def philly_day(day: int, folder: Path | None = None) -> Path:
    """Philly day ``day`` as a raw trace file: what
    ``experiments/results/quality/philly_days.py`` writes (day N of ``bench sim``'s
    14-day, ~13,000-job window, rebased to 0). Written once into ``folder`` (default:
    the temporary directory), then reused."""
    from apportion.experiments import trace_catalog as catalog
    from apportion.experiments.bench.sim import window_with

    folder = folder or Path(tempfile.gettempdir()) / "apportion-philly-days"
    p = folder / f"philly-d{day}.csv"
    if p.is_file():
        return p
    raw = catalog.load_trace("philly")
    start, _ = window_with(raw, 14.0, 13000)
    t = raw.window(start + (day - 1) * 86400.0, start + day * 86400.0)
    rows = ["job_id,submit_time_s,num_gpus,duration_s,tenant"]
    rows += [f"{j.job_id},{j.submit_s:.0f},{j.gpus},{j.duration_s:.0f},{j.tenant}"
             for j in t.jobs]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".philly-d{day}.{os.getpid()}.tmp"
    tmp.write_text("\n".join(rows) + "\n")
    tmp.replace(p)
    return p


def family_of(spec: str, cluster: str | None = None) -> Family:
    """The trace, cluster and profile ``spec`` replays with (``cluster`` overrides)."""
    fam = FAMILIES.get(spec) or Family(spec, DEFAULT_CLUSTER)
    return replace(fam, cluster=cluster) if cluster else fam


# ---------------------------------------------------------------------------
# the cells
# ---------------------------------------------------------------------------
def offered_counts(capacity: int, request: int) -> list[int]:
    """GPU counts a policy could offer on a type: powers of two up to ``capacity``, plus
    the request where it fits."""
    out = set()
    g = 1
    while g <= capacity:
        out.add(g)
        g *= 2
    if 1 <= request <= capacity:
        out.add(request)
    return sorted(out)


def held_out(view: Any, js: Any, gpu_type: str, counts: Iterable[int]) -> list[int]:
    """The counts of ``counts`` that ``view`` predicts rather than measures on ``gpu_type``."""
    pts = set(view.points(js, gpu_type))
    return [g for g in counts if g not in pts]


def _safe_rate(src: Any, js: Any, gpu_type: str, gpus: int) -> float:
    """A rate, 0 where it is not a positive number (unrunnable)."""
    r = float(src.rate(js, gpu_type, gpus))
    return r if math.isfinite(r) and r > 0 else 0.0


@dataclass
class _Setting:
    label: str
    trace: Any
    truth: Any
    cluster: Any
    family: Family


def load_setting(spec: str, seed: int, cluster: str | None = None,
                 max_jobs: int | None = None) -> _Setting:
    """The trace (adapted with ``seed`` where ``compare`` adapts it), its truth and cluster."""
    from apportion.experiments.groundtruth import ConsolidatedRates
    from apportion.experiments.harness import cluster_from_arg, resolve
    from apportion.experiments.simulator import PROFILES

    fam = family_of(spec, cluster)
    arg = fam.trace
    m = _PHILLY_DAY.fullmatch(arg)
    if m and not Path(arg).is_file():
        arg = str(philly_day(int(m.group(1))))
    cl = cluster_from_arg(fam.cluster)
    t, truth = resolve(arg, cl, seed)
    if fam.head:
        t = t.head(fam.head)
    if max_jobs:
        t = t.head(max_jobs)
    if PROFILES[fam.profile].consolidated_rates:  # as the simulator wraps it (gavel)
        truth = ConsolidatedRates(truth)
    label = spec if spec in FAMILIES or not Path(spec).is_file() else Path(spec).stem
    return _Setting(label, t, truth, cl, fam)


def truth_interpolated(truth: Any, job: Any, gpu_type: str, gpus: int) -> bool:
    """Whether the truth's rate of this cell (asked once already) is not a measurement but
    its own interpolation (log-log between measured counts, or another batch's or type's
    figures): each truth records the keys it had to interpolate, in its own form."""
    base = getattr(truth, "base", truth)
    seen = getattr(base, "interpolated", None)
    if not seen:
        return False
    kind = type(base).__name__
    if kind in ("CriusTruth", "GavelTruth"):
        key: tuple[Any, ...] = (job.job_type, gpu_type, gpus)
    elif kind == "MorphlingTruth":
        key = (job.job_type, gpus, (), None)
    elif kind == "ElasticFlowTruth":
        key = (job.job_type, job.batch, gpus)
    elif kind == "FinetuneTruth":
        ft = job.finetune
        key = (ft.backbone if ft else None, gpus, job.batch)
    else:
        return False
    return key in seen


def _reference(truth_view: Any, js: Any, caps: dict[str, int]) -> str | None:
    """The type of the job's reference cell (its request): the requested type, else the
    type the truth says is fastest at the requested count; None when it runs nowhere."""
    n = int(js.spec.requested_gpus)
    want = js.spec.requested_gpu_type
    if want in caps and _safe_rate(truth_view, js, want, n) > 0:
        return want
    best = max(((r, t) for t in sorted(caps) if n <= caps[t]
                for r in [_safe_rate(truth_view, js, t, n)] if r > 0), default=None)
    return None if best is None else best[1]


class ScalingCache:
    """One scaling model per (estimator, cluster) for a whole run.

    A scaling model's rate depends on the job's model and batch, the GPU type and count
    only (:class:`~apportion.estimation.rates.EstimatorRates` memoises on exactly that), never
    on the profile's seed, so every seed's (and every trace's on the same cluster)
    :class:`ProfiledRates` shares one: Crius's cell estimator takes seconds per (model,
    batch, type) on Crius's cluster. ``folder``: also keep the rates on disk between runs
    (one JSON file per estimator and cluster; delete it when an estimator changes)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._rates: dict[tuple[str, str], Any] = {}
        self._loaded: dict[tuple[str, str], int] = {}

    @staticmethod
    def cluster_key(cluster: Any) -> str:
        nodes = sorted((n.name, n.gpu_type, n.gpus, n.intra_link, n.intra_bandwidth_GBps,
                        n.inter_bandwidth_GBps) for n in cluster.nodes.values())
        return hashlib.blake2b(repr(nodes).encode(), digest_size=6).hexdigest()

    def _file(self, key: tuple[str, str]) -> Path | None:
        return None if self.folder is None else \
            self.folder / f"replay-rates-{key[0]}-{key[1]}.json"

    def get(self, estimator: str, cluster: Any) -> Any:
        from apportion.estimation.rates import EstimatorRates
        from apportion.estimation.registry import make_estimator

        key = (estimator, self.cluster_key(cluster))
        if key not in self._rates:
            er = EstimatorRates(make_estimator(estimator), cluster)
            f = self._file(key)
            if f is not None and f.is_file():
                for m, b, t, g, r in json.loads(f.read_text()):
                    er._memo[(m, b, t, g, ())] = float(r)
            self._loaded[key] = len(er._memo)
            self._rates[key] = er
        return self._rates[key]

    def fitted(self) -> dict[str, list[str]]:
        """Per estimator, the architectures whose fitted parameters it read (Morphling's
        estimator reads fits from the profile cache, ``$APPORTION_CACHE``, as it does in a
        replay; none: the paper's starting values)."""
        out: dict[str, list[str]] = {}
        for (name, _), er in self._rates.items():
            out[name] = sorted(set(out.get(name, [])) | set(getattr(er.estimator, "k_", {})))
        return out

    def save(self) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for key, er in self._rates.items():
            rows = sorted([m, b, t, g, r] for (m, b, t, g, p), r in er._memo.items() if not p)
            if len(rows) == self._loaded.get(key):
                continue
            f = self._file(key)
            assert f is not None
            tmp = f.with_name(f.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(rows))
            tmp.replace(f)


def _views(st: _Setting, seed: int, estimators: Sequence[str], profile_noise: float,
           scaling: ScalingCache) -> dict[str, Any]:
    from apportion.experiments.information import rate_source

    views = {}
    for e in estimators:
        v = rate_source("estimated", st.truth, st.cluster, seed, estimator=e,
                        profile_noise=profile_noise)
        if v.scaling is not None:  # the same model, memoised for the whole run
            v.scaling = scaling.get(v.estimator_name, st.cluster)
        views[e] = v
    return views


def score_setting(st: _Setting, seed: int, estimators: Sequence[str],
                  profile_noise: float, scaling: ScalingCache | None = None
                  ) -> list[dict[str, Any]]:
    """Every held-out cell of every job: the truth and each estimator's prediction."""
    from apportion.experiments.information import rate_source
    from apportion.experiments.simulator import JobState, _spec

    oracle = rate_source("oracle", st.truth, st.cluster, seed, noise=0.0)
    views = _views(st, seed, estimators, profile_noise, scaling or ScalingCache())
    caps = st.cluster.capacity_by_type()
    probe = next(iter(views.values()))
    cells: list[dict[str, Any]] = []
    for j in st.trace.jobs:
        js = JobState(_spec(j), trace=j)
        ref_t = _reference(oracle, js, caps)
        n = int(js.spec.requested_gpus)
        ref_true = _safe_rate(oracle, js, ref_t, n) if ref_t else 0.0
        ref_pred = {e: _safe_rate(v, js, ref_t, n) if ref_t else 0.0 for e, v in views.items()}
        for t in sorted(caps):
            for g in held_out(probe, js, t, offered_counts(caps[t], n)):
                cells.append({
                    "seed": seed, "job": j.job_id, "model": js.spec.model,
                    "batch": js.spec.global_batch_size, "request": n,
                    "requested_type": js.spec.requested_gpu_type, "gpu_type": t, "gpus": g,
                    "truth": _safe_rate(oracle, js, t, g),
                    "interpolated": truth_interpolated(st.truth, j, t, g), "ref_type": ref_t,
                    "ref_truth": ref_true,
                    "pred": {e: _safe_rate(v, js, t, g) for e, v in views.items()},
                    "ref_pred": ref_pred})
    return cells


# ---------------------------------------------------------------------------
# scores
# ---------------------------------------------------------------------------
def _ranks(x: Sequence[float]) -> list[float]:
    """1-based ranks, ties at their average (as :func:`scipy.stats.rankdata`)."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho with average ranks for ties (what
    :func:`apportion.experiments.bench.accuracy.spearman` gives, without scipy's per-call
    cost: it is called once per job, view and estimator); NaN when a side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(ra)
    ma, mb = sum(ra) / n, sum(rb) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    saa = sum((x - ma) ** 2 for x in ra)
    sbb = sum((y - mb) ** 2 for y in rb)
    return sab / math.sqrt(saa * sbb) if saa > 0 and sbb > 0 else float("nan")


def _summary(errs: list[float]) -> dict[str, float]:
    if not errs:
        return {"mean": float("nan"), "median": float("nan"), "within": float("nan")}
    return {"mean": float(statistics.fmean(errs)), "median": float(statistics.median(errs)),
            "within": sum(e <= WITHIN + 1e-12 for e in errs) / len(errs)}


def score(cells: list[dict[str, Any]], estimator: str) -> dict[str, Any]:
    """One estimator's figures over ``cells`` (see the module's docstring)."""
    rate_err: list[float] = []
    speed_err: list[float] = []
    signed: list[float] = []
    false_run = missed = both_zero = 0
    per_job: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    for c in cells:
        tru, pred = c["truth"], c["pred"][estimator]
        # rank over every held-out cell of the job, an unrunnable one as rate 0 on its side:
        # the same cells for every estimator, and a cell wrongly called runnable or not
        # costs rank as it would cost a scheduler
        a, b = per_job.setdefault((c["seed"], c["job"]), ([], []))
        a.append(pred)
        b.append(tru)
        if tru <= 0 and pred <= 0:
            both_zero += 1
            continue
        if tru <= 0:
            false_run += 1
            continue
        if pred <= 0:
            missed += 1
            continue
        rate_err.append(abs(pred - tru) / tru)
        signed.append(math.log(pred / tru))
        rp, rt = c["ref_pred"][estimator], c["ref_truth"]
        if rp > 0 and rt > 0:
            speed_err.append(abs((pred / rp) / (tru / rt) - 1.0))
    # jobs whose truth ranks at least three cells apart; a prediction that tells none of
    # them apart (constant) counts as rho 0, not as a job left out
    rhos = [0.0 if math.isnan(r) else r for a, b in per_job.values()
            if len(b) >= 3 and len(set(b)) >= 2 for r in [spearman(a, b)]]
    return {
        "estimator": estimator, "cells": len(rate_err), "rate": _summary(rate_err),
        "bias": math.exp(statistics.median(signed)) if signed else float("nan"),
        "speed": {**_summary(speed_err), "cells": len(speed_err)},
        "rank": {"rho": float(statistics.fmean(rhos)) if rhos else float("nan"),
                 "jobs": len(rhos)},
        "false_runnable": false_run, "missed": missed, "both_zero": both_zero,
    }


def is_near(gpus: int, request: int) -> bool:
    """Half or twice the request: with the request itself (a profiled point), the GPU
    counts apportion's candidates offer (scales 0.5, 1, 2)."""
    return gpus == 2 * request or (request % 2 == 0 and gpus == request // 2)


def _by(cells: list[dict[str, Any]], estimators: Sequence[str], key: Any) -> dict[str, Any]:
    """Median relative error of the rate per group of cells (``key(cell)``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        if c["truth"] > 0:
            groups.setdefault(str(key(c)), []).append(c)
    out = {}
    for k in sorted(groups):
        row: dict[str, Any] = {"cells": len(groups[k])}
        for e in estimators:
            errs = [abs(c["pred"][e] - c["truth"]) / c["truth"] for c in groups[k]
                    if c["pred"][e] > 0]
            row[e] = float(statistics.median(errs)) if errs else float("nan")
        out[k] = row
    return out


def _worst(cells: list[dict[str, Any]], estimators: Sequence[str]) -> list[dict[str, Any]]:
    """Each estimator's worst cells (largest |log(predicted / truth)|, runnable both sides),
    with every estimator's prediction for the same cell."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for e in estimators:
        ok = [c for c in cells if c["truth"] > 0 and c["pred"][e] > 0]
        ok.sort(key=lambda c: (-abs(math.log(c["pred"][e] / c["truth"])), c["seed"], c["job"],
                               c["gpu_type"], c["gpus"]))
        for c in ok[:WORST]:
            k = (c["seed"], c["job"], c["gpu_type"], c["gpus"])
            if k in seen:
                continue
            seen.add(k)
            out.append({"worst_for": e, **{x: c[x] for x in (
                "seed", "job", "model", "batch", "request", "gpu_type", "gpus", "truth",
                "interpolated", "ref_type", "ref_truth")}, "pred": dict(c["pred"]),
                "ref_pred": dict(c["ref_pred"])})
    return out


def bench_trace(spec: str, estimators: Sequence[str], seeds: int = 3,
                max_jobs: int | None = None, profile_noise: float = 0.1,
                cluster: str | None = None, scaling: ScalingCache | None = None
                ) -> dict[str, Any]:
    """Score every estimator on one trace over seeds ``0 .. seeds - 1``."""
    scaling = scaling or ScalingCache()
    cells: list[dict[str, Any]] = []
    jobs = 0
    st = None
    for seed in range(seeds):
        st = load_setting(spec, seed, cluster, max_jobs)
        jobs += len(st.trace.jobs)
        cells += score_setting(st, seed, estimators, profile_noise, scaling)
    assert st is not None
    models = sorted({c["model"] for c in cells})
    measured = [c for c in cells if not c["interpolated"]]
    near = [c for c in cells if is_near(c["gpus"], c["request"])]
    return {
        "trace": st.label, "trace_name": st.trace.name, "cluster": st.cluster.name,
        "capacity": st.cluster.capacity_by_type(), "profile": st.family.profile,
        "truth": type(getattr(st.truth, "base", st.truth)).__name__
        if type(st.truth).__name__ == "ConsolidatedRates" else type(st.truth).__name__,
        "seeds": seeds, "jobs": jobs, "held_out_cells": len(cells),
        "models_outside_catalog": _outside_catalog(models),
        "interpolated_cells": sum(c["interpolated"] for c in cells),
        "estimators": {e: score(cells, e) for e in estimators},
        "estimators_measured": {e: score(measured, e) for e in estimators},
        "estimators_near": {e: score(near, e) for e in estimators},
        "by_model": _by(cells, estimators, lambda c: c["model"]),
        "by_gpus": _by(cells, estimators, lambda c: _distance(c)),
        "by_type": _by(cells, estimators, lambda c: c["gpu_type"]),
        "worst": _worst(cells, estimators),
    }


def _distance(c: dict[str, Any]) -> str:
    """How far a cell lies from the nearest profiled count (1 GPU or the request): the
    ratio of its GPU count to that count."""
    p = min({1, c["request"]}, key=lambda q: (abs(math.log(c["gpus"] / q)), q))
    r = c["gpus"] / p
    return f"x{r:g}" if r >= 1 else f"x1/{1 / r:g}"


def _outside_catalog(models: Iterable[str]) -> list[str]:
    from apportion.errors import CatalogError
    from apportion.models import get_model

    out = []
    for m in models:
        try:
            get_model(m)
        except CatalogError:
            out.append(m)
    return out


def run(traces: Sequence[str], estimators: Sequence[str], seeds: int = 3,
        max_jobs: int | None = None, profile_noise: float = 0.1,
        cluster: str | None = None, cache: Path | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Every trace of ``traces`` with every estimator of ``estimators`` (``cache``: a
    folder keeping the scaling models' rates between runs, :class:`ScalingCache`)."""
    scaling = ScalingCache(cache)
    rows = []
    for i, t in enumerate(traces):
        rows.append(bench_trace(t, estimators, seeds, max_jobs, profile_noise, cluster,
                                scaling))
        scaling.save()
        if progress:
            progress(i + 1, len(traces), t)
    return {"seeds": seeds, "max_jobs": max_jobs, "profile_noise": profile_noise,
            "estimators": list(estimators), "within": WITHIN,
            "fitted_from_cache": scaling.fitted(), "traces": rows}


# ---------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}"


def _f(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{nd}f}"


def best_by(row: dict[str, Any], what: str, key: str = "estimators") -> list[str]:
    """The estimators best on ``what`` (``speed``: lowest median relative-speed error;
    ``rank``: highest mean rho; ``rate``: lowest median rate error) in ``row[key]``; ties all
    named."""
    ests = row[key]

    def val(e: str) -> float:
        s = ests[e]
        v = -s["rank"]["rho"] if what == "rank" else s[what]["median"]
        return math.inf if math.isnan(v) else round(v, 4)

    best = min(val(e) for e in ests)
    return [] if math.isinf(best) else [e for e in ests if val(e) == best]


def table(res: dict[str, Any], key: str = "estimators") -> list[str]:
    """One row per trace and estimator (``key``: ``estimators``, every held-out cell;
    ``estimators_measured``, the cells whose truth is a measurement; ``estimators_near``,
    half and twice the request)."""
    lines = [
        ("| trace | estimator | cells | rate mean | rate median | rate within 10 % "
         "| bias (median pred/truth) | speed mean | speed median | speed within 10 % "
         "| rank rho (jobs) | runnable, truth 0 | unrunnable, truth > 0 |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in res["traces"]:
        bs, br = set(best_by(row, "speed", key)), set(best_by(row, "rank", key))
        for e, s in row[key].items():
            sp = _pct(s["speed"]["median"])
            rho = f"{_f(s['rank']['rho'])} ({s['rank']['jobs']})"
            lines.append(
                f"| {row['trace']} | {e} | {s['cells']} "
                f"| {_pct(s['rate']['mean'])} | {_pct(s['rate']['median'])} "
                f"| {_pct(s['rate']['within'])} | {_f(s['bias'])} "
                f"| {_pct(s['speed']['mean'])} | {'**' + sp + '**' if e in bs else sp} "
                f"| {_pct(s['speed']['within'])} | {'**' + rho + '**' if e in br else rho} "
                f"| {s['false_runnable']} | {s['missed']} |")
    return lines


def markdown(res: dict[str, Any]) -> str:
    """The three tables (every held-out cell; those whose truth is measured; half and twice
    the request) and the notes."""
    lines = [
        f"Held-out cells only (profiled points left out); seeds 0-{res['seeds'] - 1}, "
        f"profile noise sigma {res['profile_noise']:g}"
        + (f", first {res['max_jobs']} jobs per trace" if res["max_jobs"] else "")
        + (". Errors in %: |predicted - truth| / truth; speed: rate / rate at the request, "
           "against the truth's; rho: Spearman per job over its cells, mean over jobs; best "
           "speed median and rho in bold."), "",
        "Every held-out cell (the truth as the replay progresses by it):", "",
        *table(res, "estimators"), "",
        ("Only the cells whose truth is a measurement (not the truth's own log-log "
         "interpolation):"), "",
        *table(res, "estimators_measured"), "",
        ("Only half and twice the request (on every type: the counts apportion's candidates "
         "offer beside the request):"), "",
        *table(res, "estimators_near"),
    ]
    lines.append("")
    for row in res["traces"]:
        out = row["models_outside_catalog"]
        lines.append(f"* {row['trace']}: {row['jobs']} jobs over the seeds on {row['cluster']} "
                     f"({', '.join(f'{t} x{n}' for t, n in row['capacity'].items())}), truth "
                     f"{row['truth']}, {row['held_out_cells']} held-out cells, "
                     f"{row['interpolated_cells']} of them interpolated by the truth"
                     + (f"; {len(out)} of its models outside the catalog ({', '.join(out[:4])}"
                        f"{', ...' if len(out) > 4 else ''}): every estimator but tables scales "
                        "those with the same sub-linear curve" if out else ""))
    fitted = {e: a for e, a in res.get("fitted_from_cache", {}).items() if a}
    if fitted:
        lines.append("* fitted parameters read from the profile cache: " + "; ".join(
            f"{e}: {', '.join(a)}" for e, a in fitted.items()))
    return "\n".join(lines) + "\n"
