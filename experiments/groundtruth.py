"""The simulator's ground truth: how fast a job really runs on what it was given.

Kept apart from every estimator a policy may use: the simulator advances jobs
by these figures, so a policy's estimation error shows in the results. Each
truth answers ``rate(job, gpu_type, gpus, placement=None, plan=None)`` in
iterations per second (0.0 = cannot run there: out of memory, unknown type).

* :class:`GavelTruth` — Gavel's measured steps/s (26 job types x V100/P100/K80
  x 1, 2, 4, 8 GPUs; ``*_unconsolidated`` when a job spans servers).
* :class:`CriusTruth` — Crius's ``prof_database`` (best Alpa-tuned plan,
  iteration seconds per model_params_batch x GPU type x hosts x GPUs/host).
* :class:`MorphlingTruth` — Morphling's measured iteration time per
  execution plan and placement (A800).
* :class:`ElasticFlowTruth` — ElasticFlow's A100/T4 iterations/s by global
  batch and GPU count.
* :class:`TablesTruth` — a user's own measured iteration times (``--tables FILE``).
* :class:`AnalyticTruth` — apportion's analytic estimator, for synthetic
  traces of catalog models (not measured: say so when you use it).

Which truth a replay uses is the trace format's to say (:mod:`apportion.experiments.
truths` names them; :mod:`apportion.experiments.traces` registers the formats).

Missing configurations are interpolated (log-log between the two nearest
measured GPU counts of the same type, scaling exponent clipped to [0, 1]; a
type with no feasible point borrows the job's best type scaled by the median
type-speed ratio of the table) and every interpolated key is recorded in
``interpolated`` so reports can say how much of a run rested on it.

:class:`NoisyView` wraps a truth with seeded multiplicative log-normal noise:
what a policy sees when its profiles are imperfect.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any, Protocol

import pandas as pd
from apportion.estimation.models.measured import TableEstimator
from apportion.experiments.traces.base import SimJob, data_root

from apportion.gpus import canonical_gpu_name, get_gpu
from apportion.jobs import JobSpec
from apportion.models import catalog_model

log = logging.getLogger(__name__)


class GroundTruth(Protocol):
    name: str
    interpolated: set[tuple[Any, ...]]

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float: ...


def _nodes(placement: Mapping[str, int] | None) -> int:
    return sum(1 for k in (placement or {}).values() if k > 0) or 1


def _loglog(points: dict[int, float], g: int, max_exp: float = 1.0) -> float:
    """Throughput at ``g`` from measured {gpus: throughput>0} by log-log interpolation."""
    if g in points:
        return points[g]
    xs = sorted(points)
    if len(xs) == 1:
        x = xs[0]
        return points[x] * (g / x) ** (0.8 if g > x else 1.0)
    below = [x for x in xs if x < g]
    above = [x for x in xs if x > g]
    if below and above:
        a, b = below[-1], above[0]
    elif below:
        a, b = below[-2], below[-1]
    else:
        a, b = above[0], above[1]
    ra, rb = points[a], points[b]
    e = math.log(rb / ra) / math.log(b / a)
    e = min(max(e, 0.0), max_exp)
    ref = b if g > b else a
    return points[ref] * (g / ref) ** e


# ---------------------------------------------------------------------------
# Gavel
# ---------------------------------------------------------------------------
GAVEL_TYPES = {"V100-32GB": "v100", "V100-16GB": "v100", "P100": "p100", "K80": "k80"}


class GavelTruth:
    """Gavel's simulation_throughputs.json: isolated steps/s per (job type, scale factor)."""

    name = "gavel"

    def __init__(self, path: str | Path | None = None) -> None:
        p = Path(path) if path else data_root() / "gavel" / "simulation_throughputs.json"
        raw = json.loads(p.read_text())
        self.table: dict[str, dict[tuple[str, int], float]] = {}
        pat = re.compile(r"^\('(.*)', (\d+)\)$")
        for wt, rows in raw.items():
            t: dict[tuple[str, int], float] = {}
            for k, v in rows.items():
                m = pat.match(k)
                if m and isinstance(v, dict) and v.get("null") is not None:
                    t[(m.group(1), int(m.group(2)))] = float(v["null"])
            self.table[wt] = t
        self.interpolated: set[tuple[Any, ...]] = set()
        self.source = str(p)

    def job_types(self) -> list[str]:
        return sorted({jt for jt, _ in self.table["v100"]})

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float:
        wt = GAVEL_TYPES.get(gpu_type)
        if wt is None:
            return 0.0
        if _nodes(placement) > 1 and f"{wt}_unconsolidated" in self.table:
            t = self.table[f"{wt}_unconsolidated"]
            if (job.job_type, gpus) not in t:
                t = self.table[wt]
        else:
            t = self.table[wt]
        v = t.get((job.job_type, gpus))
        if v is not None:
            return v
        pts = {sf: r for (jt, sf), r in t.items() if jt == job.job_type and r > 0}
        if not pts:
            return 0.0
        self.interpolated.add((job.job_type, gpu_type, gpus))
        return _loglog(pts, gpus)


# ---------------------------------------------------------------------------
# Crius
# ---------------------------------------------------------------------------
CRIUS_GPU = {"a100": "A100-40GB", "a40": "A40", "a10": "A10", "v100": "V100-32GB"}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([MB])$")


def _params(key: str) -> float:
    size = key.rsplit("_", 2)[-2]
    m = _SIZE.match(size)
    if not m:
        return 0.0
    return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e9)


class CriusTruth:
    """Crius's prof_database: measured iteration time of the best plan per configuration."""

    name = "crius"

    def __init__(self, path: str | Path | None = None) -> None:
        p = Path(path) if path else data_root() / "crius" / "converted" / "prof_database.json"
        raw = json.loads(p.read_text())["optimal"]
        # key -> gpu_type -> gpus -> {hosts: iter_s (or -1)}
        self.table: dict[str, dict[str, dict[int, dict[int, float]]]] = {}
        pat = re.compile(r"^(\d+)_([a-z0-9]+)_(\d+)_n_(\d+)_d$")
        for key, cfgs in raw.items():
            for cfg, t in cfgs.items():
                m = pat.match(cfg)
                if not m or m.group(2) not in CRIUS_GPU:
                    continue
                hosts, per = int(m.group(3)), int(m.group(4))
                gt = CRIUS_GPU[m.group(2)]
                (self.table.setdefault(key, {}).setdefault(gt, {})
                 .setdefault(hosts * per, {})[hosts]) = float(t)
        self.interpolated: set[tuple[Any, ...]] = set()
        self._cache: dict[tuple[Any, ...], float] = {}
        self.type_speed = self._type_speed()
        self.source = str(p)

    def _type_speed(self) -> dict[str, float]:
        """Median speed of each type relative to A40 at equal GPU counts (over all jobs)."""
        ratios: dict[str, list[float]] = defaultdict(list)
        for types in self.table.values():
            ref = types.get("A40", {})
            for gt, by_n in types.items():
                for n, hosts in by_n.items():
                    mine = [t for t in hosts.values() if t > 0]
                    base = [t for t in ref.get(n, {}).values() if t > 0]
                    if mine and base:
                        ratios[gt].append(min(base) / min(mine))
        out = {gt: float(median(r)) for gt, r in ratios.items()}
        out["A40"] = 1.0
        return out

    def keys(self) -> list[str]:
        return sorted(self.table)

    def _measured(self, key: str, gpu_type: str, nodes: int | None) -> dict[int, float]:
        """{gpus: best throughput (it/s), 0 for measured-infeasible}."""
        out: dict[int, float] = {}
        for n, hosts in self.table.get(key, {}).get(gpu_type, {}).items():
            cand = [t for h, t in hosts.items() if t > 0 and (nodes is None or h == nodes)]
            if not cand:
                cand = [t for t in hosts.values() if t > 0]
            out[n] = 1.0 / min(cand) if cand else 0.0
        return out

    def fits(self, key: str, gpu_type: str, gpus: int) -> bool:
        """Model states (16 bytes/param, partitioned over the GPUs by the tuned plan) fit."""
        mem = get_gpu(gpu_type).memory_bytes * 0.9
        return _params(key) * 16.0 / gpus <= mem

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float:
        ck = (job.job_type, gpu_type, gpus)
        if ck in self._cache:
            return self._cache[ck]
        v = self._rate(job.job_type, gpu_type, gpus)
        self._cache[ck] = v
        return v

    def _rate(self, key: str, gpu_type: str, gpus: int) -> float:
        if key not in self.table or gpu_type not in self.type_speed or gpus <= 0:
            return 0.0
        meas = self._measured(key, gpu_type, None)
        if gpus in meas:
            return meas[gpus]
        feas = {n: r for n, r in meas.items() if r > 0}
        infeasible_at = [n for n, r in meas.items() if r == 0]
        if any(n >= gpus for n in infeasible_at) or not self.fits(key, gpu_type, gpus):
            return 0.0
        self.interpolated.add((key, gpu_type, gpus))
        if feas:
            return _loglog(feas, gpus)
        # borrow the job's best-measured type, scaled by the table's type speeds
        best = None
        for other, speed in self.type_speed.items():
            pts = {n: r for n, r in self._measured(key, other, None).items() if r > 0}
            if pts:
                r = _loglog(pts, gpus) * self.type_speed[gpu_type] / speed
                best = r if best is None else max(best, r)
        return best or 0.0


# ---------------------------------------------------------------------------
# Morphling
# ---------------------------------------------------------------------------
class MorphlingTruth:
    """Morphling's measured iteration seconds per (plan, placement) on A800 nodes."""

    name = "morphling"
    MODELS = ("bert", "gpt2", "llama30", "llama7", "roberta", "t5", "vit")

    def __init__(self, root: str | Path | None = None) -> None:
        r = Path(root) if root else data_root() / "morphling" / "traces"
        self.rows: dict[str, list[tuple[str, tuple[int, ...], float]]] = {}
        for m in self.MODELS:
            df = pd.read_csv(r / m / "placements.csv", dtype={"exec_plan": str, "placement": str})
            rows = []
            for x in df.itertuples(index=False):
                t = float(x.iter_time)
                if t > 0:
                    rows.append((str(x.exec_plan), tuple(sorted((int(c) for c in str(x.placement)),
                                                                reverse=True)), t))
            self.rows[m] = rows
        self.interpolated: set[tuple[Any, ...]] = set()
        self._cache: dict[tuple[Any, ...], float] = {}
        self.source = str(r)

    def plans(self, app: str, gpus: int) -> list[str]:
        return sorted({p for p, pl, _ in self.rows.get(app, []) if sum(pl) == gpus})

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             plan_ok: Callable[[str], bool] | None = None) -> float:
        if not gpu_type.startswith("A800"):
            return 0.0
        shape = tuple(sorted((k for k in (placement or {}).values() if k > 0), reverse=True))
        ck = (job.job_type, gpus, shape, plan, plan_ok)
        if ck in self._cache:
            return self._cache[ck]
        v = self._rate(job.job_type, gpus, shape, plan, plan_ok)
        self._cache[ck] = v
        return v

    def _rate(self, app: str, gpus: int, shape: tuple[int, ...], plan: str | None,
              plan_ok: Callable[[str], bool] | None) -> float:
        rows = [r for r in self.rows.get(app, [])
                if (plan is None or r[0] == plan) and (plan_ok is None or plan_ok(r[0]))]
        if not rows:
            return 0.0
        exact = [t for p, pl, t in rows if pl == shape] if shape else []
        if exact:
            return 1.0 / min(exact)
        same = [t for p, pl, t in rows if sum(pl) == gpus]
        if same:
            if shape:
                self.interpolated.add((app, gpus, shape, plan))
            return 1.0 / min(same)
        pts: dict[int, float] = {}
        for p, pl, t in rows:
            pts[sum(pl)] = max(pts.get(sum(pl), 0.0), 1.0 / t)
        if gpus < min(pts):
            return 0.0  # fewer GPUs than any measured plan needs: does not fit
        self.interpolated.add((app, gpus, shape, plan))
        return _loglog(pts, gpus)


# ---------------------------------------------------------------------------
# ElasticFlow
# ---------------------------------------------------------------------------
class ElasticFlowTruth:
    """ElasticFlow's iterations/s by model, global batch and GPU count (A100 or T4)."""

    name = "elasticflow"

    def __init__(self, gpu: str = "A100", root: str | Path | None = None) -> None:
        r = Path(root) if root else data_root() / "elasticflow" / f"throughputs_{gpu}"
        self.gpu = canonical_gpu_name("A100" if gpu == "A100" else gpu)
        self.table: dict[str, dict[int, dict[int, float]]] = {}
        for f in sorted(r.glob("*.csv")):
            df = pd.read_csv(f)
            t: dict[int, dict[int, float]] = {}
            for d in df.to_dict("records"):  # columns by name: itertuples renamed them _1.._7
                b = int(d.pop("global_batch_size"))
                t[b] = {int(k): float(v) for k, v in d.items() if float(v) > 0}
            self.table[f.stem] = t
        self.interpolated: set[tuple[Any, ...]] = set()

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float:
        if canonical_gpu_name(gpu_type) != self.gpu or job.job_type not in self.table:
            return 0.0
        t = self.table[job.job_type]
        b = min(t, key=lambda x: abs(math.log(x / max(1, job.batch))))
        if b != job.batch:
            self.interpolated.add((job.job_type, job.batch, gpus))
        pts = t[b]
        if gpus in pts:
            return pts[gpus]
        if not pts:
            return 0.0
        self.interpolated.add((job.job_type, job.batch, gpus))
        return _loglog(pts, gpus)


# ---------------------------------------------------------------------------
# A user's own measured iteration times
# ---------------------------------------------------------------------------
class TablesTruth:
    """Measured iteration times as the truth: a user's own (``--tables FILE``, the CSV
    ``solve-round --tables`` reads, read by the same reader: model, gpu_type, gpus,
    iter_time_s and optionally global_batch_size).

    A job is looked up by its model (its job type where it has no model) and batch; a GPU
    count between two measured ones is interpolated log-log, one outside them
    extrapolated with the measured scaling exponent (at most linear), each recorded in
    ``interpolated`` (:class:`apportion.estimation.models.measured.TableEstimator`, the one
    interpolation). A model or GPU type without rows rates 0: it does not run there. The
    name carries a digest of the rows, so two tables are two truths (the lower bound's
    cache keys on it)."""

    def __init__(self, table: TableEstimator, source: str = "") -> None:
        self.table = table
        self.source = source
        digest = hashlib.sha256(json.dumps(sorted(map(list, table.rows)), default=str)
                                .encode()).hexdigest()
        self.name = f"tables:{digest[:12]}"
        self.interpolated: set[tuple[Any, ...]] = set()
        self._cache: dict[tuple[Any, ...], float] = {}

    @classmethod
    def from_csv(cls, path: str | Path) -> TablesTruth:
        return cls(TableEstimator.from_csv(path), str(path))

    @staticmethod
    def _model(job: SimJob) -> str:
        return job.model or job.job_type

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float:
        model, batch = self._model(job), max(1, job.batch)
        ck = (model, batch, gpu_type, gpus)
        if ck in self._cache:
            return self._cache[ck]
        t = (self.table.iter_time(JobSpec(job.job_id, model, batch, 1, max(1, gpus)), gpu_type,
                                  gpus) if gpus > 0 else None)
        v = 1.0 / t if t else 0.0
        if v > 0 and not any(m == model and g_t == gpu_type and g == gpus and b in (None, batch)
                             for m, b, g_t, g, _ in self.table.rows):
            self.interpolated.add(ck)
        self._cache[ck] = v
        return v

    def explain(self, jobs: Sequence[SimJob]) -> str:
        """What the table holds for the models of ``jobs`` (why it rates them nowhere)."""
        parts = []
        for model in sorted({self._model(j) for j in jobs})[:4]:
            rows = [(t, g, b) for m, b, t, g, _ in self.table.rows if m == model]
            if not rows:
                parts.append(f"no row for model {model}")
                continue
            types = sorted({t for t, _, _ in rows})
            batches = sorted({b for _, _, b in rows if b is not None})
            parts.append(f"model {model} has rows on {', '.join(types)}"
                         + (f" at batch {', '.join(map(str, batches))}" if batches else ""))
        return "; ".join(parts) + (" (a table's gpu_type must be the cluster's type name; "
                                   "its global_batch_size, when given, the job's batch_size)")


# ---------------------------------------------------------------------------
# Analytic (not measured) and noise
# ---------------------------------------------------------------------------
class AnalyticTruth:
    """apportion's analytic estimator as the truth (synthetic traces; not measured data)."""

    name = "analytic"

    def __init__(self, cluster: Any, efficiency: float = 0.45) -> None:
        from apportion.estimation.models.analytic import AnalyticEstimator

        self.est = AnalyticEstimator(efficiency=efficiency)
        self.cluster = cluster
        self.interpolated: set[tuple[Any, ...]] = set()
        self._cache: dict[tuple[Any, ...], float] = {}

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None) -> float:
        from apportion.plans import Cell

        if not job.model:
            return 0.0
        ck = (job.model, job.batch, gpu_type, gpus)
        if ck in self._cache:
            return self._cache[ck]
        if catalog_model(job.model) is None:  # it knows catalog models only
            self._cache[ck] = 0.0
            return 0.0
        spec = JobSpec(job.job_id, job.model, job.batch, 1, job.gpus)
        best = 0.0
        s = 1
        while s <= gpus and s <= 16:
            if gpus % s == 0:
                e = self.est.best_in_cell(spec, Cell(job.job_id, gpu_type, gpus, s), self.cluster)
                if e is not None and e.feasible:
                    best = max(best, 1.0 / e.iter_time_s)
            s *= 2
        self._cache[ck] = best
        return best


class NoisyView:
    """A truth seen through seeded multiplicative log-normal noise (sigma in log space).

    The ``oracle`` information mode's rate source (:class:`apportion.view.RateSource`):
    policies ask with a :class:`apportion.view.JobView`, whose ``trace`` record keys
    the truth. The noise of a (job, type, GPU count) is fixed for the run: a profile
    that is wrong stays wrong, as a mis-measured profile would."""

    def __init__(self, base: Any, sigma: float = 0.0, seed: int = 0) -> None:
        self.base = base
        self.sigma = sigma
        self.seed = seed
        self.name = f"{base.name}+noise{sigma}"
        self.interpolated = base.interpolated
        # a truth that rates a job by its progress is asked with the job's (perfect
        # profiles know where the job is), and one that rates batches is asked at any
        self.by_progress = bool(getattr(base, "by_progress", False))
        self.rates_batches = bool(getattr(base, "rates_batches", False))

    def factor(self, job_id: str, gpu_type: str, gpus: int) -> float:
        if self.sigma <= 0:
            return 1.0
        h = hashlib.blake2b(f"{self.seed}|{job_id}|{gpu_type}|{gpus}".encode(), digest_size=8)
        u1, u2 = (int.from_bytes(h.digest()[:4], "big") + 0.5) / 2**32, \
            (int.from_bytes(h.digest()[4:], "big") + 0.5) / 2**32
        z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
        return math.exp(self.sigma * z)

    def rate(self, job: Any, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             **kw: Any) -> float:
        j: SimJob = job.trace if hasattr(job, "trace") else job
        if self.by_progress and "progress" not in kw and hasattr(job, "done"):
            kw["progress"] = float(job.done)
        r = self.base.rate(j, gpu_type, gpus, placement, plan, **kw)
        return r * self.factor(j.job_id, gpu_type, gpus) if r > 0 else 0.0


class ConsolidatedRates:
    """A truth that prices every placement as if the job's GPUs shared one server.

    Gavel's simulator reads only each type's consolidated throughputs (its
    ``*_unconsolidated`` tables are never looked up), so a multi-GPU job progresses at
    the same rate wherever its GPUs are; the ``gavel`` profile replays that way
    (``SimConfig.consolidated_rates``) to compare with Gavel's own figures. Everything
    but ``rate`` is the wrapped truth's."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def rate(self, job: Any, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             **kw: Any) -> float:
        return self.base.rate(job, gpu_type, gpus, None, plan, **kw)
