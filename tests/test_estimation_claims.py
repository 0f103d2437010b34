"""Morphling's claims: per plan family and scope, the worst held-out row of the covering
protocol; `auto` refuses Morphling's figure outside them, with the measured error, and
every estimate it gives names its source and the held-out error of its choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.estimation.models.morphling import nodes_of
from apportion.estimation.models.morphling_claims import (
    CLAIM_THRESHOLD,
    claim_for,
    placement_scope,
    plan_family,
    shipped_claims,
)
from apportion.estimation.registry import AutoEstimator
from apportion.experiments.bench import morphling_data as md

from apportion.config import resolve_cluster
from apportion.jobs import JobSpec
from apportion.plans import Cell

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results" / "estimation"


@pytest.fixture
def morphling_root(shared_data: Path) -> Path:
    return shared_data / "morphling"


def test_every_trace_rows_plan_has_the_family_the_benchmark_gives_it(morphling_root: Path):
    """Discovered over every trace row of every artifact model: the estimator's family of a
    plan is the benchmark's (so a claim is read for the plans it was measured on)."""
    seen = set()
    for m in md.MODELS.values():
        for r in md.trace_records(m, morphling_root):
            assert plan_family(r.sample.plan) == r.family, (m.key, r.code)
            seen.add(r.family)
    assert seen == {c[0] for c in shipped_claims() if shipped_claims()[c].n}


def test_the_shipped_claims_are_the_benchmarks_and_keep_the_threshold():
    shipped = json.loads((Path(__file__).resolve().parents[1] / "apportion" / "data" /
                          "morphling_claims.json").read_text())
    bench = json.loads((RESULTS / "morphling.json").read_text())
    assert shipped["claims"] == bench["protocols"]["covering"]["claims"]
    assert shipped["rows_scored"] == bench["protocols"]["covering"]["overall"]["n"]
    for c in shipped_claims().values():
        if c.claimed:
            assert c.n > 0 and c.max_error is not None and c.max_error <= CLAIM_THRESHOLD
        else:
            assert c.n == 0 or (c.max_error is not None and c.max_error > CLAIM_THRESHOLD)


def test_auto_refuses_morphling_outside_its_claims_with_the_measured_error(
        morphling_root: Path, tmp_path: Path):
    m = md.MODELS["vit"]
    recs = [r for r in md.trace_records(m, morphling_root) if r.inconsistent is None]
    one_node = [r.sample for r in recs if len(r.sample.nodes or ()) == 1][:4]
    auto = AutoEstimator(cache_dir=str(tmp_path))
    auto._members()["morphling"].fit(md.profile_samples(m, morphling_root) + one_node)
    job = JobSpec(id="v", model=m.catalog, global_batch_size=m.batch, iterations=1,
                  requested_gpus=1)
    assert auto.choose(job) == "morphling"
    held = auto._members()["morphling"].heldout_error_[m.catalog]
    cl = resolve_cluster("morphling-64")
    kinds = set()
    for gpus in (1, 2, 4, 8, 16, 32):
        cell = Cell("v", "A800-80GB", gpus, 1)
        e = auto.best_in_cell(job, cell, cl)
        assert e is not None and e.source is not None
        own = auto._members()["morphling"].best_in_cell(job, cell, cl)
        from apportion.estimation.models.analytic import nominal_placement

        nodes = nodes_of(nominal_placement(cl, "A800-80GB", gpus) or {})
        claim = claim_for(own.plan, nodes)
        assert placement_scope(nodes) == claim.scope
        if claim.claimed:
            assert e.source.estimator == "auto:morphling" and e.source.kind == "fitted"
            assert e.source.heldout_error == held and e.source.samples
            kinds.add("claimed")
        else:
            assert e.source.estimator != "auto:morphling"
            (why,) = e.source.refused
            assert "morphling" in why and f"{100 * claim.max_error:.1f} %" in why
            kinds.add("refused")
    assert kinds == {"claimed", "refused"}
