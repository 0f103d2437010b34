"""The estimator protocol, scikit-learn style.

Parameters live only in ``__init__``; anything learned from data is set by
``fit`` in attributes ending in ``_``. ``predict(job, plan, placement)`` returns
an :class:`Estimate`. Every estimator passes the same conformance tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Protocol, runtime_checkable

from apportion.cluster import Cluster
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan


#: what an estimate's number rests on (:class:`Source`'s ``kind``)
SOURCE_KINDS = ("measured", "fitted", "profiled", "analytic")


@dataclass(frozen=True)
class Source:
    """Where an estimate's number came from, so an operator can tell a measurement from a
    guess: ``measured`` (a measured table row, or a rate the cluster reported), ``fitted``
    (a model fitted to ``samples`` measurements), ``profiled`` (stage shards measured by a
    profiler on ``device``, the oldest ``age_s`` seconds old) or ``analytic`` (FLOPs, bytes
    and catalog figures only). ``heldout_error`` is the mean relative error, on samples its
    fit did not see, of the estimator ``auto`` chose for this job (None: not chosen by
    ``auto``, or no held-out error). ``refused`` names what was not used and why (a stale or
    foreign-device profile, a plan family outside an estimator's claims), so nothing is
    dropped silently."""

    kind: str
    detail: str = ""
    estimator: str = ""
    samples: int | None = None
    age_s: float | None = None
    device: str | None = None
    backend: str | None = None
    heldout_error: float | None = None
    refused: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, the unset fields left out (``kind`` and ``detail`` always there)."""
        out: dict[str, Any] = {"kind": self.kind, "detail": self.detail}
        for name in ("estimator", "samples", "age_s", "device", "backend", "heldout_error"):
            v = getattr(self, name)
            if v not in (None, ""):
                out[name] = round(v, 3) if name == "age_s" else v
        if self.refused:
            out["refused"] = list(self.refused)
        return out


@dataclass(frozen=True)
class Estimate:
    """Predicted iteration time (s), peak memory per GPU (bytes) and feasibility, and where
    the figure came from (``source``; None from an estimator that does not say)."""

    iter_time_s: float
    mem_per_gpu: float
    feasible: bool
    plan: ExecutionPlan
    global_batch_size: int
    breakdown: Mapping[str, float] = field(default_factory=dict)
    source: Source | None = None
    # the global batch the figures are for, where it is the job's to choose (a job with a
    # ``batch_range``: formulations/batch_options.py); ``global_batch_size`` then stays the
    # job's own, so ``throughput`` counts its progress in the job's own iterations
    batch: int | None = None

    @property
    def throughput(self) -> float:
        """Samples per second (0 when infeasible)."""
        if not self.feasible or self.iter_time_s <= 0:
            return 0.0
        return self.global_batch_size / self.iter_time_s


@dataclass(frozen=True)
class Sample:
    """One measured configuration: what ``fit`` learns from."""

    job: JobSpec
    plan: ExecutionPlan
    placement: Mapping[str, int]
    gpu_type: str
    iter_time_s: float


@runtime_checkable
class Estimator(Protocol):
    def fit(self, samples: Iterable[Sample]) -> "Estimator": ...

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate: ...

    def get_params(self) -> dict[str, Any]: ...


class ParamsMixin:
    """``get_params`` derived from ``__init__``'s signature, as scikit-learn does: every
    constructor argument is stored under its own name, so nothing is listed twice."""

    def get_params(self) -> dict[str, Any]:
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names}


def unmeasured_scale(fitted: Mapping[str, float], default: Callable[[str], float]) -> float:
    """How a GPU type no sample measured scales its default efficiency: the median
    fitted-over-default ratio of the measured types (keys with ``|`` are per-family
    refinements, skipped), so it keeps its shipped ratio to them; 1 with nothing measured.
    Without it a workload measured slower than the model on one type makes every other
    type look faster by the same factor."""
    ratios = [e / default(g) for g, e in fitted.items() if "|" not in g]
    return float(median(ratios)) if ratios else 1.0
