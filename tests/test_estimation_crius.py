"""Crius's cell estimator: figure-7 stage determination, assembly, OOM drop, round integration."""

from __future__ import annotations

import itertools
import math

import pytest
from apportion.estimation.models import crius
from apportion.estimation.models.crius import (
    CellEstimator,
    StageProfile,
    determine_stages,
    gpu_shares,
    round_to_powers_of_two,
)
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.config import default_cluster, default_jobs
from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import Cell
from apportion.policies import RoundConfig, run_round


def test_figure7_six_operators_on_eight_gpus():
    # our own shares: FLOPs 1,3,4,2,2,4 sixteenths -> 0.5, 1.5, 2, 1, 1, 2 GPUs
    flops = [1, 3, 4, 2, 2, 4]
    assert gpu_shares(flops, 8) == [0.5, 1.5, 2.0, 1.0, 1.0, 2.0]
    # inter-operator communications: the three smallest sit after OP2, OP3 and OP5
    comm = [9.0, 1.0, 2.0, 8.0, 3.0]
    sp = determine_stages(flops, comm, gpus=8, stages=4)
    assert sp is not None
    assert sp.ranges == ((0, 2), (2, 3), (3, 5), (5, 6))
    assert sp.exact_gpus == (2.0, 2.0, 2.0, 2.0)
    assert sp.gpus == (2, 2, 2, 2) and sum(sp.gpus) == 8


def test_figure7_uneven_accumulation_rounds_to_powers_of_two():
    # shares 0.5, 2.5, 1, 0.5, 2, 1.5 of 8 GPUs; cuts after OP1, OP3, OP5
    flops = [1, 5, 2, 1, 4, 3]
    comm = [1.0, 7.0, 2.0, 9.0, 3.0]
    sp = determine_stages(flops, comm, gpus=8, stages=4)
    assert sp is not None
    assert sp.ranges == ((0, 1), (1, 3), (3, 5), (5, 6))
    assert sp.exact_gpus == (0.5, 3.5, 2.5, 1.5)
    assert sum(sp.gpus) == 8 and all(g & (g - 1) == 0 for g in sp.gpus)
    # each stage within a factor of two of its FLOPs share
    assert all(0.5 <= g / e <= 2.0 for g, e in zip(sp.gpus, sp.exact_gpus))


def test_stages_on_a_real_catalog_model_balance_flops():
    m = get_model("bert-1.3b")
    sp = determine_stages(m.attr("flops"), m.attr("out_bytes")[:-1], gpus=8, stages=4)
    assert sp is not None and sp.gpus == (2, 2, 2, 2)
    flops = m.attr("flops")
    per_stage = [sum(flops[a:b]) for a, b in sp.ranges]
    assert max(per_stage) / min(per_stage) < 1.35
    # the ranges tile the model in order
    assert sp.ranges[0][0] == 0 and sp.ranges[-1][1] == len(flops)
    assert all(a[1] == b[0] for a, b in zip(sp.ranges, sp.ranges[1:]))


@given(st.lists(st.floats(0.05, 20.0), min_size=1, max_size=6), st.integers(1, 64))
@settings(max_examples=80, deadline=None)
def test_rounding_sums_to_the_cell_and_uses_powers_of_two(exact, total):
    out = round_to_powers_of_two(exact, total)
    if total < len(exact):
        assert out is None
        return
    # every total >= S is a sum of S powers of two iff popcount(total) <= S
    if bin(total).count("1") > len(exact):
        assert out is None
        return
    assert out is not None and sum(out) == total
    assert all(g >= 1 and g & (g - 1) == 0 for g in out)


def _cluster() -> Cluster:
    return Cluster("t", [NodeGroup("a100", 4, "A100-40GB", 8), NodeGroup("a10", 8, "A10", 2,
                                                                          intra_node_link="pcie",
                                                                          intra_node_bandwidth_GBps=32)])


def test_assembly_has_two_to_the_s_plans_and_drops_oom():
    est = CellEstimator()
    cl = _cluster()
    m = get_model("bert-2.6b")
    intra, outer = est.links(cl, "A100-40GB", 16)
    e, plans = est.estimate_cell(m, 256, "A100-40GB", 16, 2, intra, outer, 8)
    assert e is not None and len(plans) == 2 ** 2
    assert e.feasible and e.iter_time_s == min(p.iter_time_s for p in plans if p.feasible)
    # a model far too large for 2 A10s: every assembly out of memory -> no estimate
    job = JobSpec("big", "bert-6.7b", 128, 10, 2)
    assert est.best_in_cell(job, Cell("big", "A10", 2, 1), cl) is None


def test_best_in_cell_matches_protocol_and_faster_gpu_is_faster():
    est = CellEstimator()
    cl = _cluster()
    job = JobSpec("j", "bert-1.3b", 128, 10, 8)
    fast = est.best_in_cell(job, Cell("j", "A100-40GB", 8, 2), cl)
    slow = est.best_in_cell(job, Cell("j", "A10", 8, 2), cl)
    assert fast is not None and slow is not None
    assert fast.iter_time_s < slow.iter_time_s
    assert fast.plan.pp == 2 and math.isfinite(fast.throughput) and fast.throughput > 0


def test_cell_estimator_plugs_into_a_validated_round():
    cl = default_cluster()
    jobs, now = default_jobs()
    res = run_round(cl, jobs[:6], now, RoundConfig(backend="highs", time_budget_s=5),
                    estimator=CellEstimator())
    check = validate(res.decision, cl, jobs[:6])
    assert check.ok, check
    assert res.decision.allocations


def test_per_family_calibration_recovers_each_familys_efficiency():
    """Measurements made at different sustained efficiencies per model family: the per-family
    fit recovers both (its predictions match the measurements), the per-type fit cannot."""
    from apportion.estimation.base import Sample
    from apportion.estimation.models.crius import AnalyticStageProfiler

    cl = _cluster()
    truth = CellEstimator(profiler=AnalyticStageProfiler({"A100-40GB|bert": 0.30,
                                                          "A100-40GB|moe": 0.15}, 0.08))
    samples = []
    for model in ("bert-1.3b", "moe-1.3b"):
        for gpus, stages in ((2, 1), (4, 2), (8, 2)):
            job = JobSpec(f"{model}-{gpus}", model, 128, 10, gpus)
            e = truth.best_in_cell(job, Cell(job.id, "A100-40GB", gpus, stages), cl)
            assert e is not None
            samples.append(Sample(job, e.plan, {}, "A100-40GB", e.iter_time_s))
    per_type = CellEstimator().fit(samples, cl)
    per_family = CellEstimator(per_family=True).fit(samples, cl)
    assert set(per_family.efficiency_) == {"A100-40GB", "A100-40GB|bert", "A100-40GB|moe"}

    def worst(est: CellEstimator) -> float:
        errs = []
        for s in samples:
            e = est.best_in_cell(s.job, Cell(s.job.id, "A100-40GB", s.plan.gpus, s.plan.pp), cl)
            assert e is not None
            errs.append(abs(e.iter_time_s - s.iter_time_s) / s.iter_time_s)
        return max(errs)

    # not exact: communication does not scale with the efficiency, the median ratio does
    assert worst(per_family) < 0.05 < 0.2 < worst(per_type)


def test_cells_no_power_of_two_split_fills_still_get_an_estimate():
    """A round may keep a job on 6 GPUs or give it 3: the cell still gets stages (whole GPUs
    by largest remainder) and an estimate; powers of two stay the rule where they fit."""
    from apportion.estimation.models.crius import round_to_integers

    assert round_to_integers([0.5, 2.5, 3.0], 6) == (1, 2, 3)
    assert round_to_integers([1.0, 1.0], 1) is None
    m = get_model("bert-1.3b")
    sp = determine_stages(m.attr("flops"), m.attr("out_bytes")[:-1], gpus=6, stages=1)
    assert sp is not None and sp.gpus == (6,)
    est = CellEstimator()
    cl = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8)])
    job = JobSpec("j", "bert-1.3b", 128, 10, 6)
    for gpus, stages in ((6, 1), (3, 1), (6, 2), (5, 2)):
        e = est.best_in_cell(job, Cell("j", "A100-40GB", gpus, stages), cl)
        assert e is not None and e.feasible and e.plan.gpus <= gpus


def test_a_stage_neither_layout_fits_runs_dp_over_tp_groups():
    """wresnet-2b on four A10s (two per node): DP-only needs every replica's 32 GB of model
    state, TP-only may not cross a node -- a DP x TP stage (Alpa's 2D mesh) fits."""
    cl = _cluster()
    est = CellEstimator()
    job = JobSpec("w", "wresnet-2b", 256, 10, 4)
    e = est.best_in_cell(job, Cell("w", "A10", 4, 1), cl)
    assert e is not None and e.feasible
    assert e.plan.tp == 2 and e.plan.dp == 2 and e.breakdown["stage0_tp"] == 2.0


def _measured(truth_scale):
    """Samples whose measured time is the uncalibrated estimate times a known function of
    the cell (the GPU count's log per type and a type-and-family factor)."""
    from apportion.estimation.base import Sample

    cl = _cluster()
    base = CellEstimator()
    samples, clusters = [], []
    for model in ("bert-1.3b", "moe-1.3b"):
        for gpu_type, counts in (("A100-40GB", (1, 2, 4, 8, 16)), ("A10", (1, 2, 4, 8))):
            for gpus in counts:
                job = JobSpec(f"{model}-{gpu_type}-{gpus}", model, 128, 10, gpus)
                e = base.best_in_cell(job, Cell(job.id, gpu_type, gpus, 1), cl)
                if e is None:
                    continue
                t = e.iter_time_s * truth_scale(model, gpu_type, gpus)
                samples.append(Sample(job, e.plan, {}, gpu_type, t))
                clusters.append(cl)
    return samples, clusters, cl


def test_cell_calibration_recovers_how_cells_scale():
    def truth(model, gpu_type, gpus):
        fam = 1.5 if model.startswith("moe") else 1.0
        return fam * (1.3 if gpu_type == "A10" else 1.0) * gpus ** (0.15 if gpu_type == "A10"
                                                                    else 0.05)

    samples, clusters, cl = _measured(truth)
    per_family = CellEstimator(per_family=True).fit(samples, clusters)
    cell = CellEstimator(calibration="cell", ridge=1e-6).fit(samples, clusters)
    assert not hasattr(cell, "efficiency_") and "A10|log2_gpus" in cell.coef_

    def worst(est):
        errs = []
        for s in samples:
            e = est.best_in_cell(s.job, Cell(s.job.id, s.gpu_type, s.plan.gpus, 1), cl)
            errs.append(abs(e.iter_time_s - s.iter_time_s) / s.iter_time_s)
        return max(errs)

    assert worst(cell) < 0.01
    assert worst(per_family) > 0.05
    with pytest.raises(ValueError, match="calibration"):
        CellEstimator(calibration="magic")
    with pytest.raises(ValueError, match="clusters"):
        CellEstimator(calibration="cell").fit(samples, clusters[:1])


def test_cell_calibration_never_moves_a_type_nobody_measured():
    """Measured only on A100s, 40 % slower than the analytic start: A10 cells move with the
    median of the measured corrections, so the two types keep their shipped ratio."""
    samples, clusters, cl = _measured(lambda m, g, n: 1.4)
    a100 = [(s, c) for s, c in zip(samples, clusters) if s.gpu_type == "A100-40GB"]
    fitted = CellEstimator(calibration="cell").fit([s for s, _ in a100], [c for _, c in a100])
    base = CellEstimator()
    job = JobSpec("q", "bert-1.3b", 128, 10, 4)
    ratios = []
    for gpu_type in ("A100-40GB", "A10"):
        f = fitted.best_in_cell(job, Cell("q", gpu_type, 4, 1), cl)
        b = base.best_in_cell(job, Cell("q", gpu_type, 4, 1), cl)
        ratios.append(f.iter_time_s / b.iter_time_s)
    assert ratios[0] == pytest.approx(1.4, rel=0.02) and ratios[1] == pytest.approx(ratios[0])


def test_cell_features_read_the_chosen_plan_and_its_communication():
    from apportion.estimation.models.crius import cell_features

    cl = _cluster()
    job = JobSpec("f", "bert-1.3b", 128, 10, 8)
    est = CellEstimator().best_in_cell(job, Cell("f", "A10", 8, 2), cl)
    f = cell_features(get_model("bert-1.3b"), 128, "A10", 8, 4, est)
    assert f["A10|bert"] == 1.0 and f["A10|log2_gpus"] == 3.0
    assert f["A10|log2_hosts"] == f["A10|bert|log2_hosts"] == 2.0
    assert f["log2_pp"] == 1.0 and f["bert|log2_tp"] == math.log2(est.plan.tp)
    assert f["bert|comm_share"] == pytest.approx(est.breakdown["dp_allreduce_s"]
                                                 / est.iter_time_s)
    assert 0.0 <= f["bert|comm_share"] < 1.0
    # without an estimate (the earlier form) only the cell's own features
    assert "log2_pp" not in cell_features(get_model("bert-1.3b"), 128, "A10", 8, 4)


def test_unmeasured_types_and_families_borrow_the_median_of_their_siblings():
    from apportion.estimation.models.crius import _apply, _siblings

    coef = {"A100-40GB|bert": 0.2, "A10|bert": 0.6, "A10|moe": 1.0, "A10|log2_gpus": 0.1,
            "A100-40GB|log2_gpus": 0.3, "A10|bert|log2_hosts": 0.4,
            "A100-40GB|bert|log2_hosts": 0.2, "A10|moe|log2_hosts": 1.0,
            "bert|log2_tp": -0.2, "moe|log2_tp": 0.4}
    assert _siblings("V100-32GB|log2_gpus", coef) == [0.1, 0.3]
    assert sorted(_siblings("V100-32GB|bert|log2_hosts", coef)) == [0.2, 0.4]  # same family
    assert sorted(_siblings("V100-32GB|gpt|log2_hosts", coef)) == [0.2, 0.4, 1.0]
    assert sorted(_siblings("gpt|log2_tp", coef)) == [-0.2, 0.4]
    assert sorted(_siblings("A10|gpt", coef)) == [0.6, 1.0]  # its type's intercepts
    assert sorted(_siblings("V100-32GB|moe", coef)) == [1.0]  # else its family's
    feats = {"V100-32GB|gpt": 1.0, "V100-32GB|log2_gpus": 2.0, "gpt|log2_tp": 1.0}
    assert _apply(coef, feats) == pytest.approx(0.6 + 2 * 0.2 + 0.1)


def test_cell_calibration_ridge_is_chosen_by_models_held_out_of_the_fit():
    from apportion.estimation.models.crius import RIDGE_DEFAULT, RIDGE_GRID, _choose_ridge

    def truth(model, gpu_type, gpus):
        return (1.5 if model.startswith("moe") else 1.0) * gpus ** 0.1

    samples, clusters, _ = _measured(truth)
    fitted = CellEstimator(calibration="cell").fit(samples, clusters)
    assert fitted.ridge_ in RIDGE_GRID
    again = CellEstimator(calibration="cell").fit(samples, clusters)
    assert again.ridge_ == fitted.ridge_ and again.coef_ == fitted.coef_  # no seed, no clock
    assert CellEstimator(calibration="cell", ridge=2.0).fit(samples, clusters).ridge_ == 2.0
    assert _choose_ridge([({"x": 1.0}, 0.0)], ["only-one-model"]) == RIDGE_DEFAULT
    with pytest.raises(ValueError, match="ridge"):
        CellEstimator(ridge="magic")


def _assemblies_one_by_one(options, recvs, optimizer, B, hbm_Bps):
    """The assembly search as a loop over every assembly (the definition the scorer keeps)."""
    out = []
    for choice in itertools.product(*[range(len(o)) for o in options]):
        chosen = [options[s][c] for s, c in enumerate(choice)]
        if any(math.isinf(p.compute_s) for p in chosen):
            continue
        times, comms = [], []
        for s, p in enumerate(chosen):
            recv = recvs[s][choice[s - 1]][choice[s]] if s > 0 else 0.0
            times.append(p.compute_s + p.tp_comm_s + recv)
            comms.append(recv)
        pipeline = sum(times) + (B - 1) * max(t - c for t, c in zip(times, comms))
        grad = max(p.grad_sync_s for p in chosen)
        opt = max(optimizer[s][c] for s, c in enumerate(choice)) / hbm_Bps
        out.append((choice, pipeline + grad + opt, max(p.mem_bytes for p in chosen)))
    return out


_times = st.floats(1e-6, 10.0, allow_nan=False)


@st.composite
def _search(draw):
    stages = draw(st.integers(1, 6))
    options = []
    for _ in range(stages):
        opts = [StageProfile("dp", 2, draw(_times), draw(st.floats(1.0, 100.0)), 0.0,
                             draw(_times))]
        for mode in draw(st.lists(st.sampled_from(["tp", "hybrid", "inf"]), max_size=2)):
            if mode == "inf":
                opts.append(StageProfile("tp", 2, math.inf, math.inf))
            else:
                opts.append(StageProfile(mode, 2, draw(_times), draw(st.floats(1.0, 100.0)),
                                         draw(_times), draw(_times), tp=2))
        options.append(opts)
    recvs = [[[0.0] * len(options[0])]] + [
        [[draw(_times) for _ in options[s]] for _ in options[s - 1]] for s in range(1, stages)]
    optimizer = [[draw(st.floats(1.0, 1e9)) for _ in o] for o in options]
    return options, recvs, optimizer, draw(st.integers(1, 64)), draw(st.floats(20.0, 90.0))


@settings(max_examples=200, deadline=None)
@given(_search())
def test_scoring_assemblies_at_once_gives_the_loops_floats_and_choice(search):
    # every assembly's time and memory is the same float the one-by-one loop gives, in the
    # same order, and the fastest that fits is the loop's (ties: the first)
    options, recvs, optimizer, B, usable = search
    want = _assemblies_one_by_one(options, recvs, optimizer, B, 1e12)
    got = [(tuple(int(c) for c in sc.choice[r]), float(sc.iter_time[r]), float(sc.mem[r]))
           for sc in crius._score_assemblies(options, recvs, optimizer, B, 1e12, usable)
           for r in range(len(sc.iter_time))]
    assert got == want
    fits = [w for w in want if w[2] <= usable]
    best = [(tuple(int(c) for c in sc.choice[0]), float(sc.iter_time[0]))
            for sc in crius._score_assemblies(options, recvs, optimizer, B, 1e12, usable,
                                              best_only=True)]
    assert best == ([min(fits, key=lambda w: w[1])[:2]] if fits else [])


def test_scoring_spans_blocks(monkeypatch):
    # past one block (2^S > _BLOCK) the order and the best are the loop's
    monkeypatch.setattr(crius, "_BLOCK", 5)
    options = [[StageProfile("dp", 2, 1.0 + s, 10.0 * s, 0.0, 0.1),
                StageProfile("tp", 2, 0.5 + s, 20.0, 0.2, 0.0)] for s in range(4)]
    recvs = [[[0.0, 0.0]]] + [[[0.01, 0.02], [0.03, 0.04]] for _ in range(3)]
    optimizer = [[4.0, 2.0] for _ in range(4)]
    want = _assemblies_one_by_one(options, recvs, optimizer, 8, 1e3)
    got = [(tuple(int(c) for c in sc.choice[r]), float(sc.iter_time[r]), float(sc.mem[r]))
           for sc in crius._score_assemblies(options, recvs, optimizer, 8, 1e3, 25.0)
           for r in range(len(sc.iter_time))]
    assert got == want
    (best,) = crius._score_assemblies(options, recvs, optimizer, 8, 1e3, 25.0, best_only=True)
    fits = [w for w in want if w[2] <= 25.0]
    assert float(best.iter_time[0]) == min(w[1] for w in fits)


def test_the_memoised_cell_estimate_is_the_search_and_follows_a_refit():
    est = CellEstimator()
    m = get_model("gpt2-1.5b")
    cl = default_cluster()
    gpu_type = min(cl.capacity_by_type())
    intra, outer = est.links(cl, gpu_type, 4)
    args = (m, 64, gpu_type, 4, 2, intra, outer, cl.max_gpus_per_node(gpu_type))
    first = est.cell_estimate(*args)
    assert first == est.estimate_cell(*args)[0]
    assert est.cell_estimate(*args) is first  # memoised
    est.efficiency_ = {gpu_type: 0.2}  # a refit changes the state: a fresh search
    assert est.cell_estimate(*args) == est.estimate_cell(*args)[0] != first
    assert len(est._cell_memo[1]) == 1  # one state's estimates only: it never grows with fits
