"""The estimator check: scikit-learn's contract, and estimates a round can use."""

from __future__ import annotations

import inspect
import math

from apportion.cluster import Cluster, NodeGroup
from apportion.estimation.base import Estimate, Estimator, Sample
from apportion.estimation.models.analytic import nominal_placement
from apportion.jobs import JobSpec
from apportion.plans import Cell, ExecutionPlan
from apportion.testing.failures import check, expect, subject


@check
def check_estimator(estimator: Estimator) -> None:
    """scikit-learn's contract (parameters only in ``__init__``, ``fit`` returns self and
    learns only attributes ending in ``_``), and estimates that are finite, positive and
    grow with the batch."""
    cl = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8)])
    expect(isinstance(estimator, Estimator), f"{estimator!r}: not an estimator")
    who = subject(estimator)
    sig = set(inspect.signature(type(estimator).__init__).parameters) - {"self"}
    expect(set(estimator.get_params()) == sig,
           f"{who}: parameters must be __init__'s arguments: {sorted(estimator.get_params())} "
           f"vs {sorted(sig)}")
    before, params = set(vars(estimator)), estimator.get_params()
    expect(not any(k.endswith("_") for k in before),
           f"{who}: fitted attributes before fit: {sorted(k for k in before if k.endswith('_'))}")
    samples = []
    for i, g in enumerate((1, 2, 4, 8, 8, 4, 2, 1)):
        job = JobSpec(f"s{i}", "bert-336m", 64, 10, g)
        samples.append(Sample(job, ExecutionPlan(dp=g, checkpointing=i >= 4),
                              nominal_placement(cl, "A100-40GB", g), "A100-40GB",
                              0.05 + 1.6 / g))
    expect(estimator.fit(samples) is estimator, f"{who}: fit must return self")
    learned = set(vars(estimator)) - before
    expect(all(k.endswith("_") for k in learned), f"{who}: fit set {sorted(learned)}")
    expect(estimator.get_params() == params, f"{who}: fit changed a parameter")
    job = JobSpec("j", "bert-336m", 64, 10, 4)
    e = estimator.predict(job, ExecutionPlan(dp=4), nominal_placement(cl, "A100-40GB", 4), cl)
    expect(isinstance(e, Estimate) and e.iter_time_s > 0 and math.isfinite(e.iter_time_s),
           f"{who}: predict gave {e!r}, not an estimate of a finite positive time")
    cell = Cell("a", "A100-40GB", 4, 1)
    small = estimator.best_in_cell(JobSpec("a", "bert-336m", 32, 10, 4), cell, cl)
    large = estimator.best_in_cell(JobSpec("b", "bert-336m", 256, 10, 4), cell, cl)
    expect(small is not None and large is not None and large.iter_time_s > small.iter_time_s,
           f"{who}: a batch of 256 is not slower than one of 32 in the same cell "
           f"({large} vs {small})")


__all__ = ["check_estimator"]
