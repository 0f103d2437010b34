"""The terms Morphling's model gained beyond appendix A: each one's equation, when a fit may
free it, and the versioned cache of fits."""

from __future__ import annotations

import math

import pytest
from apportion.estimation.cache import DiskCache
from apportion.estimation.models.morphling import (
    K_INIT,
    K_NAMES,
    K_NEUTRAL,
    MODEL_VERSION,
    AffineForward,
    Arch,
    Env,
    MorphlingEstimator,
    MorphlingSample,
    components,
    dp_rings_per_node,
    fit_forward,
    link_class,
    rails_fraction,
)

from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

ARCH = Arch("x", 1e9, 1024 * 1024 * 24, 24)
K = {**{n: K_INIT[n] for n in K_NAMES}, "k_sync": 1.0}
A800 = Env(intra_GBps=200.0, inter_GBps=50.0, pcie_GBps=25.0, nics_per_node=4, gpus_per_node=8)


def fwd(n: float) -> float:
    return 0.01 * n


def test_affine_forward_keeps_its_fixed_part_under_a_tensor_shard() -> None:
    f = AffineForward(0.004, 0.002)
    assert f(8) == pytest.approx(0.02)
    assert f.shard(8, 4) == pytest.approx(0.004 + 0.004)
    k = {**K, "k_3d": 1.0}
    tp = components(k, ARCH, 8, ExecutionPlan(tp=4), (4,), 1, Env(), f)
    assert tp["T_fwd"] == pytest.approx(f.shard(8, 4))


def test_forward_fit_is_robust_and_needs_three_batch_sizes() -> None:
    # BERT's profile: 40, 65, 116, 227 ms for 4..32 samples, plus one stray reading
    pts = [(4, 0.040), (8, 0.065), (16, 0.116), (32, 0.227), (8, 0.004)]
    f = fit_forward(pts)
    assert 0.005 < f.fixed < 0.02 and f.per_sample == pytest.approx(0.0066, rel=0.1)
    assert f(8) == pytest.approx(0.065, rel=0.1)  # the stray 4 ms reading is ignored
    # two sizes cannot check a line: proportional, as the paper scales the forward
    two = fit_forward([(8, 0.015), (16, 0.026)])
    assert two.fixed == 0.0


def test_gradient_accumulation_repeats_the_fixed_part() -> None:
    f = AffineForward(0.005, 0.001)
    one = components(K, ARCH, 32, ExecutionPlan(dp=1), (1,), 1, Env(), f)
    ga = components(K, ARCH, 32, ExecutionPlan(dp=1, accumulation=4), (1,), 1, Env(), f)
    assert ga["T_fwd"] == pytest.approx(one["T_fwd"] + 3 * 0.005)


def test_rails_link_classes_and_shared_adapters() -> None:
    assert rails_fraction((4, 4), A800) == 0.5  # four GPUs drive two of four adapters
    assert rails_fraction((2, 6), A800) == 0.25 == rails_fraction((1,) * 8, A800)
    assert rails_fraction((2, 2), Env()) == 1.0  # one adapter per node: the paper's model
    assert link_class((8,), A800) == "intra"
    assert link_class((4, 4), A800) == "inter" == link_class((2, 2, 4), A800)
    assert link_class((1, 1), A800) == "inter-single" == link_class((1,) * 8, A800)
    assert link_class((3, 5), A800) == "inter-odd" == link_class((1, 1, 2, 2, 2), A800)
    assert link_class((1, 3), A800) == "inter-odd"
    assert link_class((3, 5), Env()) == "inter" == link_class((1, 1), Env())  # no GPU pairs
    # plain DP: one ring per node; eight TP-8 replicas across eight nodes: eight rings each
    assert dp_rings_per_node(ExecutionPlan(dp=8), (4, 4)) == 1
    assert dp_rings_per_node(ExecutionPlan(dp=8, tp=8), (8,) * 8) == 8
    even = components(K, ARCH, 32, ExecutionPlan(dp=8), (4, 4), 1, A800, fwd)
    thin = components(K, ARCH, 32, ExecutionPlan(dp=8), (2, 6), 1, A800, fwd)
    odd = components({**K, "odd_scale": 0.25}, ARCH, 32, ExecutionPlan(dp=8), (3, 5), 1, A800,
                     fwd)
    assert thin["T_comm_dp"] == pytest.approx(2 * even["T_comm_dp"])
    assert odd["T_comm_dp"] == pytest.approx(4 * even["T_comm_dp"])


def test_single_gpu_nodes_have_their_own_bandwidth_and_offload_skips_the_classes() -> None:
    k = {**K, "single_scale": 0.5, "odd_scale": 0.25}
    plan = ExecutionPlan(dp=8)
    pairs = components(k, ARCH, 32, plan, (2, 2, 2, 2), 1, A800, fwd)
    single = components(k, ARCH, 32, plan, (1,) * 8, 1, A800, fwd)
    # both drive one adapter per node; the single GPUs' ring runs at its class's scale
    assert single["T_comm_dp"] == pytest.approx(2 * pairs["T_comm_dp"])
    mixed = components(k, ARCH, 32, plan, (1, 1, 2, 2, 2), 1, A800, fwd)
    assert mixed["T_comm_dp"] == pytest.approx(4 * pairs["T_comm_dp"])
    # ZeRO-Offload's traffic never showed the classes' slowdown: the rails only
    off = ExecutionPlan(dp=8, zero_stage=2, offload=True)
    assert components(k, ARCH, 32, off, (1,) * 8, 4, A800, fwd)["T_comm_dp"] == \
        pytest.approx(components(k, ARCH, 32, off, (2, 2, 2, 2), 4, A800, fwd)["T_comm_dp"])


def test_class_scales_are_freed_only_by_their_own_non_offload_samples() -> None:
    job = JobSpec("j", "bert-336m", 32, 1, 1)
    est = MorphlingEstimator(env=A800)

    def names(*configs: tuple[ExecutionPlan, tuple[int, ...]]) -> list[str]:
        prepared = [(ARCH, MorphlingSample(job=job, plan=pl, placement={}, gpu_type="A100-40GB",
                                           iter_time_s=1.0, arch=ARCH, nodes=n), n, 1, fwd)
                    for pl, n in configs]
        return est._terms_exercised(prepared, A800)

    dp2, off2 = ExecutionPlan(dp=2), ExecutionPlan(dp=2, zero_stage=2, offload=True)
    assert "log_single" in names((dp2, (1, 1))) and "log_odd" not in names((dp2, (1, 1)))
    assert "log_single" not in names((off2, (1, 1)))  # offload never exercises a class
    assert "log_odd" in names((ExecutionPlan(dp=4), (1, 3)))
    assert not {"log_single", "log_odd"} & set(names((ExecutionPlan(dp=4), (2, 2))))


def test_pipeline_stages_pay_the_fixed_forward_part_and_k3d_scales_the_rest() -> None:
    f = AffineForward(0.015, 0.002)
    k = {**K, "k_3d": 2.0}
    one = components(k, ARCH, 16, ExecutionPlan(tp=2), (2,), 1, Env(), f)
    assert one["T_fwd"] == pytest.approx(0.015 + 2.0 * 0.002 * 16 / 2)
    # one micro-batch through p stages: each stage's call pays the fixed part (T5's 3D rows
    # grow ~45 ms a stage at every TP width), the per-sample work is divided among them
    for p in (2, 4, 8):
        pp = components(k, ARCH, 16, ExecutionPlan(tp=2, pp=p, micro_batches=1), (2 * p,), 1,
                        Env(), f)
        assert pp["T_fwd"] == pytest.approx(p * 0.015 + 2.0 * 0.002 * 16 / 2)
    m = components(k, ARCH, 16, ExecutionPlan(pp=4, micro_batches=8), (4,), 1, Env(), f)
    assert m["T_fwd"] == pytest.approx((8 + 4 - 1) * (0.015 + 2.0 * 0.002 * 2 / 4))
    # a profile without a fixed part (a FLOPs curve, a plain function) keeps the paper's form
    plain = components(k, ARCH, 32, ExecutionPlan(pp=4, micro_batches=4), (4,), 1, Env(), fwd)
    assert plain["T_fwd"] == pytest.approx(2.0 * fwd(8) / 4 * (4 + 4 - 1))


def test_pipeline_sends_carry_the_whole_activation_of_each_tp_rank() -> None:
    # LLaMA-7B's TP-8 pipelines grow 50 ms a stage with one replica, none with eight: the
    # 268 MB activation of a one-replica send, not an eighth of it
    a = components(K, ARCH, 8, ExecutionPlan(tp=8, pp=4, micro_batches=1), (8, 8, 8, 8), 1,
                   A800, fwd)
    b = components(K, ARCH, 8, ExecutionPlan(tp=1, pp=4, micro_batches=1), (1, 1, 1, 1), 1,
                   A800, fwd)
    assert a["T_comm_pp"] == pytest.approx(b["T_comm_pp"])
    c = components(K, ARCH, 8, ExecutionPlan(dp=2, tp=4, pp=4, micro_batches=1), (8, 8, 8, 8),
                   1, A800, fwd)
    assert c["T_comm_pp"] == pytest.approx(a["T_comm_pp"] / 2)


def test_forward_fit_drops_a_fixed_part_within_the_timing_resolution() -> None:
    # LLaMA-7B's profile: 381, 749, 1497 ms for 1, 2, 4 samples -- proportional within 2 %
    f = fit_forward([(1, 0.381), (2, 0.749), (4, 1.497)])
    assert f.fixed == 0.0 and f.per_sample == pytest.approx(0.3745, rel=0.01)
    # T5's: a fixed part well above it (and one stray reading)
    t5 = fit_forward([(2, 0.054), (4, 0.004), (8, 0.08), (2, 0.057), (4, 0.091), (8, 0.176),
                      (16, 0.423)])
    assert t5.fixed > 0.005


def test_communication_latency_terms() -> None:
    plan = ExecutionPlan(dp=4)
    base = components(K, ARCH, 32, plan, (4,), 1, Env(), fwd)
    lat = components({**K, "k_lat": 1e-4}, ARCH, 32, plan, (4,), 1, Env(), fwd)
    calls = math.ceil(2.0 * ARCH.params / (25 * 2**20))  # DDP's 25 MiB buckets
    assert lat["T_comm_dp"] - base["T_comm_dp"] == pytest.approx(calls * 2 * 3 * 1e-4)
    zero = components({**K, "k_lat": 1e-4}, ARCH, 32, ExecutionPlan(dp=4, zero_stage=2), (4,),
                      1, Env(), fwd)
    assert zero["T_comm_dp"] - base["T_comm_dp"] == pytest.approx(2 * 2 * 3 * 1e-4)  # 1 GB
    tp = ExecutionPlan(tp=4)
    t0 = components(K, ARCH, 32, tp, (4,), 1, Env(), fwd)
    t1 = components({**K, "k_tp_lat": 1e-3}, ARCH, 32, tp, (4,), 1, Env(), fwd)
    assert t1["T_comm_tp"] - t0["T_comm_tp"] == pytest.approx(4 * ARCH.layers * 1e-3)
    pp = ExecutionPlan(pp=4, micro_batches=8)
    p0 = components(K, ARCH, 32, pp, (4,), 1, Env(), fwd)
    p1 = components({**K, "k_pp_lat": 1e-3}, ARCH, 32, pp, (4,), 1, Env(), fwd)
    assert p1["T_comm_pp"] - p0["T_comm_pp"] == pytest.approx(2 * (8 + 4 - 1) * 1e-3)


def test_3d_factor_zero_share_and_offload_on_every_rank() -> None:
    dp = components(K, ARCH, 32, ExecutionPlan(dp=4), (4,), 1, Env(), fwd)
    slow3d = {**K, "k_3d": 2.0}
    assert components(slow3d, ARCH, 32, ExecutionPlan(dp=4), (4,), 1, Env(), fwd)["T_fwd"] == \
        dp["T_fwd"]  # DP plans keep the profiled forward
    tp = components(slow3d, ARCH, 32, ExecutionPlan(tp=4), (4,), 1, Env(), fwd)
    assert tp["T_fwd"] == pytest.approx(2 * fwd(32) / 4)
    z0 = components(K, ARCH, 32, ExecutionPlan(dp=4, zero_stage=2), (4,), 1, Env(), fwd)
    z1 = components({**K, "k_zero": 1.0}, ARCH, 32, ExecutionPlan(dp=4, zero_stage=2), (4,),
                    1, Env(), fwd)
    assert z0["T_opt"] == pytest.approx(dp["T_opt"] / 4) and z1["T_opt"] == dp["T_opt"]
    off = ExecutionPlan(dp=8, zero_stage=2, offload=True)
    o = components(K, ARCH, 32, off, (8,), 4, Env(), fwd)
    assert o["T_off"] == pytest.approx(4 * ARCH.params / 25e9)  # not divided by d


def _samples(gpus: tuple[int, ...]) -> list[MorphlingSample]:
    arch = ARCH
    job = JobSpec("j", "bert-336m", 32, 1, 1)
    k = {**K, "k_lat": 2e-4}
    out = []
    for g in gpus:
        plan = ExecutionPlan(dp=g)
        t = components(k, arch, 32, plan, (g,), 1, Env(), fwd)["T_iter"]
        out.append(MorphlingSample(job=job, plan=plan, placement={}, gpu_type="A100-40GB",
                                   iter_time_s=t, arch=arch, nodes=(g,), fwd_s=fwd(32 / g)))
    return out


def test_latency_is_freed_only_where_ring_sizes_tell_it_from_bandwidth() -> None:
    two = MorphlingEstimator(min_samples=3).fit(_samples((1, 2, 2, 1)))
    assert two.k_["x"]["k_lat"] == K_NEUTRAL["k_lat"]
    three = MorphlingEstimator(min_samples=3).fit(_samples((1, 2, 4, 8)))
    assert three.k_["x"]["k_lat"] > 0
    off = MorphlingEstimator(min_samples=3, terms=()).fit(_samples((1, 2, 4, 8)))
    assert off.k_["x"]["k_lat"] == K_NEUTRAL["k_lat"]
    with pytest.raises(ValueError, match="unknown terms"):
        MorphlingEstimator(terms=("k_magic",))


def test_unfitted_estimator_runs_the_papers_equations() -> None:
    k = MorphlingEstimator().k_for("never-fitted")
    assert {n: k[n] for n in K_NEUTRAL} == K_NEUTRAL


def test_fits_are_cached_by_version_with_their_forward_profile(tmp_path) -> None:
    samples = _samples((1, 2, 4, 8))
    est = MorphlingEstimator(min_samples=3, cache_dir=str(tmp_path)).fit(samples)
    fresh = MorphlingEstimator(cache_dir=str(tmp_path))
    assert fresh.k_for("x") == pytest.approx(est.k_["x"])
    s = samples[2]
    assert fresh.predict_config(ARCH, 32, s.plan, s.nodes, 1, s.gpu_type)["T_iter"] == \
        pytest.approx(est.predict_config(ARCH, 32, s.plan, s.nodes, 1, s.gpu_type)["T_iter"])
    # a fit cached by other equations is never read back
    disk = DiskCache(tmp_path)
    entry = disk.get("morphling-fit", {"arch": "x", "version": MODEL_VERSION})
    assert entry is not None
    disk.put("morphling-fit", {"arch": "y", "version": MODEL_VERSION - 1}, entry)
    assert MorphlingEstimator(cache_dir=str(tmp_path))._load_cached("y") is None
