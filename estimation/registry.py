"""Estimators by name, and ``auto``: per job, the most accurate one that has data for it.

``--estimator analytic|crius|morphling|tables|auto`` on every command that makes
rounds resolves here. ``auto`` keeps one of each and picks per job (model):

1. ``tables`` when measured iteration times exist for the job's model (and
   batch) — a measurement of this very configuration beats any model;
2. of the fitted estimators that report a held-out error for the job's model
   (``heldout_error_``: Morphling's per architecture, the cell estimator's
   calibration per model, each on the samples its fit did not see), the lowest;
3. ``morphling`` (the fitted appendix-A model) when it has been fitted for the
   model's architecture (k-parameters learned from profiles or run samples,
   in memory or in its cache folder);
4. ``crius`` (the cell estimator) when usable measured stage profiles of the model are
   cached (``apportion profile`` writes them, torch's or JAX's; a stale or foreign-device
   one is refused and does not count: :mod:`apportion.estimation.stage_profiles`);
5. ``analytic`` otherwise.

Morphling's figure is refused where its plan family lies outside the model's claims (the
worst held-out row of the family on Morphling's covering protocol is over 10 %:
:mod:`~apportion.estimation.models.morphling_claims`): that cell is answered by the next
choice (without Morphling), and its source says what was refused and the measured error.

The choice is recorded per job (``chosen_``) so a decision can say which
estimator each allocation came from; each answer is memoised per (model,
batch, cell) by the chosen estimator, so a long replay stays fast. Every answer carries
its source (:class:`~apportion.estimation.base.Source`), and under ``auto`` the held-out
error of the estimator chosen for the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from apportion.estimation.base import Estimate, ParamsMixin, Sample, Source
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.models.measured import TableEstimator
from apportion.estimation.stage_profiles import StageProfiles

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import Cell, ExecutionPlan
from apportion.plugins import call_with, plugins

ESTIMATORS = ("analytic", "crius", "morphling", "tables", "auto")


def make_estimator(name: str, tables: TableEstimator | None = None,
                   cache_dir: str | None = None) -> Any:
    """The estimator called ``name``; bad names are an :class:`InputError` on ``--estimator``."""
    if name == "analytic":
        return AnalyticEstimator()
    if name == "crius":  # measured stage profiles of the cache drive it where usable
        from apportion.estimation.models.crius import CellEstimator

        return CellEstimator(stage_profiles=StageProfiles(_fit_cache(cache_dir)))
    if name == "morphling":
        from apportion.estimation.models.morphling import MorphlingEstimator

        return MorphlingEstimator(cache_dir=_fit_cache(cache_dir))
    if name == "tables":
        if tables is None or not tables.rows:
            raise InputError("--estimator", "estimator", "tables needs measured iteration times: "
                             "give --tables FILE.csv (model, gpu_type, gpus, iter_time_s) or a "
                             "--state store with samples from `apportion run`")
        return tables
    if name == "auto":
        return AutoEstimator(tables=tables, cache_dir=cache_dir)
    extra = plugins("apportion.estimators")
    if name in extra:  # an installed package's estimator (a class or a factory)
        return call_with(extra[name], tables=tables, cache_dir=cache_dir)
    raise InputError("--estimator", "estimator",
                     f"{name!r} is not one of {', '.join(estimator_names())}")


def estimator_names() -> list[str]:
    """Every estimator ``--estimator`` accepts: the built-in ones and the plug-ins'."""
    return [*ESTIMATORS, *(n for n in plugins("apportion.estimators") if n not in ESTIMATORS)]


def _fit_cache(cache_dir: str | None) -> str:
    """Where fitted parameters live: ``cache_dir``, else the profile cache
    (``$APPORTION_CACHE``), so a fit made by one round or process serves the next."""
    from apportion.estimation.cache import default_cache_dir

    return cache_dir or str(default_cache_dir())


def _has_stage_profiles(model: str, cache_dir: str | None) -> bool:
    """Whether ``apportion profile`` cached usable measured stage profiles of ``model``
    (torch's or JAX's; refused ones -- stale, foreign-device -- do not count)."""
    return StageProfiles(_fit_cache(cache_dir)).has(model)


class AutoEstimator(ParamsMixin):
    """Per job, the most accurate estimator with data for it (see the module docstring)."""

    def __init__(self, tables: TableEstimator | None = None, cache_dir: str | None = None) -> None:
        self.tables = tables
        self.cache_dir = cache_dir

    def _members(self) -> dict[str, Any]:
        m = self.__dict__.get("members_")
        if m is None:
            from apportion.estimation.models.crius import CellEstimator
            from apportion.estimation.models.morphling import MorphlingEstimator

            m = {"analytic": AnalyticEstimator(),
                 "crius": CellEstimator(calibration="cell", stage_profiles=StageProfiles(
                     _fit_cache(self.cache_dir))),
                 "morphling": MorphlingEstimator(cache_dir=_fit_cache(self.cache_dir)),
                 "tables": self.tables or TableEstimator()}
            self.members_ = m
        return m

    def choose(self, job: JobSpec) -> str:
        """The name of the estimator ``job`` is estimated with (remembered in ``chosen_``)."""
        chosen: dict[str, str] = self.__dict__.setdefault("chosen_", {})
        key = f"{job.model}|{job.global_batch_size}"
        if key not in chosen:
            chosen[key] = self._choose(job, ())
        return chosen[key]

    def _choose(self, job: JobSpec, exclude: tuple[str, ...]) -> str:
        m = self._members()
        if m["tables"].has_data(job) and "tables" not in exclude:
            return "tables"
        try:
            get_model(job.model)
        except (KeyError, ValueError):  # no model to estimate from: measurements only
            return "tables"
        held = {n: e for n, e in self._heldout(job).items() if n not in exclude}
        if held:
            return min(held, key=lambda n: (held[n], n))
        if "morphling" not in exclude and self._morphling_fitted(job):
            return "morphling"
        if _has_stage_profiles(job.model, self.cache_dir):
            return "crius"
        return "analytic"

    def fallback(self, job: JobSpec) -> str:
        """What answers ``job`` where Morphling's figure is refused (outside its claims)."""
        fb: dict[str, str] = self.__dict__.setdefault("fallback_", {})
        key = f"{job.model}|{job.global_batch_size}"
        if key not in fb:
            fb[key] = self._choose(job, ("morphling",))
        return fb[key]

    def _heldout(self, job: JobSpec) -> dict[str, float]:
        """Held-out error for ``job``'s model of every member fitted with one."""
        from apportion.estimation.models.morphling import Arch

        from apportion.models import get_model

        m = self._members()
        out = {}
        arch = Arch.from_spec(get_model(job.model)).name
        if self._morphling_fitted(job):
            h = getattr(m["morphling"], "heldout_error_", {}).get(arch)
            if h is not None:
                out["morphling"] = float(h)
        h = getattr(m["crius"], "heldout_error_", {}).get(job.model)
        if h is not None:
            out["crius"] = float(h)
        return out

    def _morphling_fitted(self, job: JobSpec) -> bool:
        from apportion.estimation.models.morphling import Arch

        from apportion.models import get_model

        morph = self._members()["morphling"]
        arch = Arch.from_spec(get_model(job.model)).name
        return arch in getattr(morph, "k_", {}) or morph._load_cached(arch) is not None

    def estimator_for(self, job: JobSpec) -> Any:
        return self._members()[self.choose(job)]

    def fit(self, samples: Iterable[Sample], cluster: Cluster | None = None) -> AutoEstimator:
        """Each member's own ``fit`` on every sample (the one path the online refit takes):
        table rows, the analytic calibration, the cell calibration and Morphling's fits per
        architecture; then every job chooses again."""
        samples = list(samples)
        m = self._members()
        m["tables"].fit(samples)
        m["analytic"].fit(samples, cluster)
        m["crius"].fit(samples, cluster)
        # an architecture with too few samples keeps its prior (MorphlingEstimator.fit)
        m["morphling"].fit(samples, cluster)
        self.__dict__.pop("chosen_", None)  # data changed: choose again
        self.__dict__.pop("fallback_", None)
        self.__dict__.pop("heldout_memo_", None)
        return self

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        name = self.choose(job)
        est = self._members()[name].predict(job, plan, placement, cluster)
        if name == "morphling" and est.breakdown.get("outside_claims"):
            other = self.fallback(job)
            return self._sourced(self._members()[other].predict(job, plan, placement, cluster),
                                 job, other, refused=est)
        return self._sourced(est, job, name)

    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        name = self.choose(job)
        est = self._members()[name].best_in_cell(job, cell, cluster)
        if name == "morphling" and est is not None and est.breakdown.get("outside_claims"):
            other = self.fallback(job)
            got = self._members()[other].best_in_cell(job, cell, cluster)
            return None if got is None else self._sourced(got, job, other, refused=est)
        return None if est is None else self._sourced(est, job, name)

    def _sourced(self, est: Estimate, job: JobSpec, name: str,
                 refused: Estimate | None = None) -> Estimate:
        """``est`` with its source saying ``auto`` chose ``name`` and that choice's held-out
        error for the job's model, and what Morphling figure was refused, if any."""
        src = est.source or Source("unspecified", f"{name} gave no source")
        extra: tuple[str, ...] = ()
        if refused is not None:
            why = refused.source.detail if refused.source is not None else ""
            err = refused.breakdown.get("claim_max_error")
            extra = (f"morphling's {refused.plan.label()} refused"
                     + (f" (worst held-out error {100 * err:.1f} %)" if err is not None else "")
                     + (f": {why}" if why else ""),)
        memo: dict[str, dict[str, float]] = self.__dict__.setdefault("heldout_memo_", {})
        if job.model not in memo:
            memo[job.model] = self._heldout(job)
        held = memo[job.model].get(name)
        return replace(est, source=replace(src, estimator=f"auto:{name}", heldout_error=held,
                                           refused=src.refused + extra))


def source_of(estimate: Estimate | None, estimator: Any, job: JobSpec) -> dict[str, Any]:
    """The JSON of an estimate's source; an estimator that gave none (a plug-in) is named."""
    if estimate is not None and estimate.source is not None:
        return estimate.source.as_dict()
    name = estimator_name(estimator, job)
    return Source("unspecified", f"estimator {name} gave no source", estimator=name).as_dict()


def estimator_name(estimator: Any, job: JobSpec) -> str:
    """Which estimator answered for ``job`` (``auto`` resolves to its per-job choice)."""
    if isinstance(estimator, AutoEstimator):
        return f"auto:{estimator.choose(job)}"
    inner = getattr(estimator, "inner_name", None)
    if inner:
        return str(inner)
    return {"AnalyticEstimator": "analytic", "CellEstimator": "crius",
            "MorphlingEstimator": "morphling", "TableEstimator": "tables"}.get(
        type(estimator).__name__, type(estimator).__name__)
