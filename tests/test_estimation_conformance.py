"""One conformance suite every estimator passes (sklearn-style protocol).

The estimators come from the registry (``apportion.estimation.registry.ESTIMATORS``,
what ``--estimator`` accepts), so a new one is checked on arrival."""

from __future__ import annotations

import inspect
import math

import pytest
from apportion.estimation.models.analytic import nominal_placement
from apportion.estimation.base import Estimate, Estimator, Sample
from apportion.estimation.models.measured import TableEstimator
from apportion.estimation.registry import ESTIMATORS as REGISTERED
from apportion.estimation.registry import make_estimator

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec
from apportion.plans import Cell, ExecutionPlan

CL = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8)])


def _reference_s(model: str, batch: int, gpus: int) -> float:
    """A fixed reference model of measured time (not an estimator): the table's data."""
    size = {"bert-336m": 1.0, "bert-1.3b": 4.0}[model]
    return 0.05 + size * batch / 40.0 / gpus


def _tables() -> TableEstimator:
    return TableEstimator([(m, b, "A100-40GB", g, _reference_s(m, b, g))
                           for m in ("bert-336m", "bert-1.3b") for b in (32, 256)
                           for g in (1, 2, 8)])


def _make(name: str):
    """A fresh estimator registered as ``name`` (``tables`` and ``auto`` with measurements)."""
    def build():
        return make_estimator(name, tables=_tables() if name in ("tables", "auto") else None)
    build.__name__ = name
    return build


ESTIMATORS = [_make(n) for n in REGISTERED]


def _samples() -> list[Sample]:
    out = []
    for i, g in enumerate((1, 2, 4, 8, 8, 4, 2, 1)):
        job = JobSpec(f"s{i}", "bert-336m", 64, 10, g)
        placement = nominal_placement(CL, "A100-40GB", g)
        plan = ExecutionPlan(dp=g, checkpointing=i >= 4)
        # "measured": a fixed reference model of the time (not an estimator)
        out.append(Sample(job, plan, placement, "A100-40GB", 0.05 + 1.6 / g))
    return out


@pytest.mark.parametrize("cls", ESTIMATORS, ids=REGISTERED)
def test_params_only_in_init_and_fit_returns_self(cls):
    est = cls()
    assert isinstance(est, Estimator)
    sig = set(inspect.signature(type(est).__init__).parameters) - {"self"}
    assert set(est.get_params()) == sig
    before = set(vars(est))
    params = est.get_params()
    assert not any(k.endswith("_") for k in before)
    out = est.fit(_samples())
    assert out is est
    # what fit learned is public and ends in "_" (scikit-learn's convention); a private
    # memo (a leading "_") may fill as fit estimates, and is neither parameter nor learned
    learned = {k for k in set(vars(est)) - before if not k.startswith("_")}
    assert learned and all(k.endswith("_") for k in learned)
    assert est.get_params() == params  # fit never changes parameters


@pytest.mark.parametrize("cls", ESTIMATORS, ids=REGISTERED)
def test_predict_and_best_in_cell_return_estimates(cls):
    est = cls().fit(_samples())
    job = JobSpec("j", "bert-336m", 64, 10, 4)
    placement = nominal_placement(CL, "A100-40GB", 4)
    e = est.predict(job, ExecutionPlan(dp=4), placement, CL)
    assert isinstance(e, Estimate) and e.iter_time_s > 0 and math.isfinite(e.iter_time_s)
    b = est.best_in_cell(job, Cell("j", "A100-40GB", 4, 1), CL)
    assert b is None or (isinstance(b, Estimate) and b.feasible and b.throughput > 0)
    assert b is not None


@pytest.mark.parametrize("cls", ESTIMATORS, ids=REGISTERED)
def test_monotonic_sanity(cls):
    est = cls()
    small = JobSpec("a", "bert-336m", 32, 10, 4)
    large = JobSpec("b", "bert-336m", 256, 10, 4)
    cell = Cell("a", "A100-40GB", 4, 1)
    e_small, e_large = est.best_in_cell(small, cell, CL), est.best_in_cell(large, cell, CL)
    assert e_small is not None and e_large is not None
    assert e_large.iter_time_s > e_small.iter_time_s  # more samples take longer
    bigger = JobSpec("c", "bert-1.3b", 32, 10, 4)
    e_big = est.best_in_cell(bigger, cell, CL)
    assert e_big is not None and e_big.iter_time_s > e_small.iter_time_s
