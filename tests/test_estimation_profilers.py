"""Real profilers: torch per-layer profile, JAX compile under an 8-device mesh, disk cache."""

from __future__ import annotations

import pytest
from apportion.estimation.cache import DiskCache, cache_key

from apportion.models import get_model


def test_disk_cache_round_trip(tmp_path):
    c = DiskCache(tmp_path)
    k = cache_key("gpt-tiny", "cpu", {"dp": 2, "tp": 1})
    assert c.get("x", k) is None
    c.put("x", k, {"v": 1})
    assert c.get("x", k) == {"v": 1}
    assert c.get("x", cache_key("gpt-tiny", "cpu", {"dp": 4, "tp": 1})) is None


def test_torch_profile_dp_and_tp_shards(tmp_path):
    pytest.importorskip("torch")
    from apportion.estimation.profilers.profile_torch import TorchStageProfiler, profile_layers
    from apportion.estimation.profilers.torch_models import build_net, layered

    spec = get_model("gpt-tiny")
    cache = DiskCache(tmp_path)
    dp = profile_layers("gpt-tiny", 4, "dp", 1, repeats=1, cache=cache)
    tp = profile_layers("gpt-tiny", 4, "tp", 4, repeats=1, cache=cache)
    assert [p.name for p in dp] == list(spec.layers)
    assert all(p.fwd_s > 0 and p.bwd_s > 0 and p.peak_mem_bytes > 0 for p in dp + tp)
    # a TP-4 shard of a block holds a quarter of the block's matrices
    blk = spec.layers.index("block0")
    assert tp[blk].params < dp[blk].params / 2
    assert dp[blk].params == sum(p.numel() for p in layered(build_net("gpt-tiny"))[blk][1]
                                 .parameters())
    # the profiled layers are the catalog's (the tied output embedding is counted in embed)
    assert [p.params for p in dp][:-1] == [int(spec.layer(n)["params"]) for n in spec.layers][:-1]
    # cached: the same key returns the same figures
    assert profile_layers("gpt-tiny", 4, "dp", 1, repeats=1, cache=cache) == dp
    sp = TorchStageProfiler(repeats=1, cache=cache).profile(spec, (0, 3), "cpu", 1, "dp", 4, 1)
    assert sp.compute_s == pytest.approx(sum(p.fwd_s + p.bwd_s for p in dp[:3]))


def test_jax_stage_compiles_for_an_8_device_mesh():
    pytest.importorskip("jax")
    from apportion.estimation.profilers.profile_jax import parse_collectives, profile_stage

    dp = profile_stage("gpt-tiny", "dp", devices=8, micro_batch=8, layers=1, repeats=1)
    tp = profile_stage("gpt-tiny", "tp", devices=8, micro_batch=8, layers=1, repeats=1)
    assert any(c["op"] == "all-reduce" for c in dp.collectives)  # gradient sync
    assert tp.collectives  # activation traffic of the Megatron layout
    # DP: gradients of the weights are all-reduced: at least the weights' bytes
    h = get_model("gpt-tiny").hidden
    weights = 4 * (3 * h * h + h * h + 8 * h * h)
    assert sum(c["bytes"] for c in dp.collectives if c["op"] == "all-reduce") >= weights
    # the per-device HLO with its collectives made local ran on one device ("hlo-rewrite"),
    # replacing every collective the parse found, and has the mesh program's per-device FLOPs
    # (measured: within 0.3 %; the rewrite drops the collectives' own reduction adds)
    for p in (dp, tp):
        assert p.method == "hlo-rewrite" and p.fallback_reason == ""
        assert p.collectives and sum(p.replaced_collectives.values()) == len(p.collectives)
        assert p.local_flops == pytest.approx(p.flops_per_device, rel=0.03)
        assert p.local_time_s > 0 and p.memory_bytes_per_device > 0
    # Megatron layout: TP moves activations with all-reduces only (no Q/K/V reshuffling)
    assert {c["op"] for c in tp.collectives} == {"all-reduce"}
    assert parse_collectives("%a = f32[4,8]{1,0} all-reduce(f32[4,8]{1,0} %x)") == \
        [{"op": "all-reduce", "bytes": 128}]


def _fake_profile(model, mode, devices, micro_batch, layers, t):
    from apportion.estimation.profilers.profile_jax import JaxStageProfile

    return JaxStageProfile(model, mode, devices, micro_batch, layers, 1e9, 1e8, 3e6, [],
                           1e9, t, "hlo-rewrite", "", {}, "cpu", 2e6, 1e6)


def test_jax_stage_profiler_answers_from_the_cache_without_compiling(tmp_path, monkeypatch):
    from apportion.estimation.cache import DiskCache
    from apportion.estimation.profilers import profile_jax as pj

    cache = DiskCache(tmp_path)
    spec = get_model("gpt-tiny")
    blocks = sum(1 for n in spec.layers if spec.graph.nodes[n].get("kind") == "block")
    calls = []

    def fake(model, mode, devices, micro_batch, layers, repeats, method):
        calls.append((mode, devices, micro_batch, layers))
        return _fake_profile(model, mode, devices, micro_batch, layers,
                             0.01 if mode == "dp" else 0.02)

    monkeypatch.setattr(pj, "profile_stage", fake)
    prof = pj.JaxStageProfiler(repeats=1, cache=cache)
    whole = (0, len(spec.layers))
    dp = prof.profile(spec, whole, "A100-40GB", 4, "dp", 8, 1)
    assert calls == [("dp", 4, 8, blocks)] and dp.compute_s == pytest.approx(0.01)
    # half a sample per device: one whole sample profiled, half its time counted
    half = prof.profile(spec, whole, "A100-40GB", 4, "dp", 2, 1)
    assert calls[-1] == ("dp", 4, 4, blocks) and half.compute_s == pytest.approx(0.005)
    tp = prof.profile(spec, whole, "A100-40GB", 4, "tp", 8, 3)
    params = sum(spec.attr("params"))
    assert tp.mem_bytes == pytest.approx(3e6 + 2 * 1e6 + 2 * 4.0 * params / 4)
    n = len(calls)
    # a second profiler on the same cache compiles nothing
    again = pj.JaxStageProfiler(repeats=1, cache=cache)
    assert again.profile(spec, whole, "A100-40GB", 4, "dp", 8, 1) == dp and len(calls) == n
    # the embedding alone has no block to compile
    emb = prof.profile(spec, (0, 1), "A100-40GB", 4, "dp", 8, 1)
    assert emb.compute_s == 0.0 and len(calls) == n
    # the measurer protocol reads the same compiles the same way (no compile more)
    m = pj.JaxStageMeasurer(repeats=1, cache=cache)
    meas = m.measure(spec, whole, 4, "tp", 8)
    assert meas.compute_s == pytest.approx(tp.compute_s) and len(calls) == n
    assert meas.static_bytes + 3 * meas.act_bytes == pytest.approx(tp.mem_bytes)
    assert m.device() == "cpu" and set(m.versions()) == {"apportion", "jax", "jaxlib"}
    # auto counts stage records (with their provenance), not a profiler's raw compiles
    from apportion.estimation.profilers.stages import profile_stages
    from apportion.estimation.registry import _has_stage_profiles
    from apportion.estimation.stage_profiles import StageProfiles

    assert not _has_stage_profiles("gpt-tiny", str(tmp_path))
    done = profile_stages(m, StageProfiles(tmp_path), spec, "T4", [(whole, 4)], 8)
    assert [(r.mode, r.backend, r.device) for r in done.records] == \
        [("dp", "jax", "cpu"), ("tp", "jax", "cpu")] and len(calls) == n
    assert _has_stage_profiles("gpt-tiny", str(tmp_path))
    assert not _has_stage_profiles("bert-tiny", str(tmp_path))


def test_cell_estimator_and_its_tuning_run_on_cached_jax_stage_profiles(tmp_path, monkeypatch):
    """Real compiles on a 2-device mesh (DP, TP) and of the tuner's hybrid, once each: the
    cell estimate and the cell-guided tuning come from the JAX profiles, and a second
    estimator on the same cache compiles nothing."""
    pytest.importorskip("jax")
    from apportion.estimation.cache import DiskCache
    from apportion.estimation.models.crius import CellEstimator
    from apportion.estimation.models.tuning import tune_cell
    from apportion.estimation.profilers import profile_jax as pj

    from apportion.cluster import Cluster, NodeGroup
    from apportion.jobs import JobSpec
    from apportion.plans import Cell

    cl = Cluster("j", [NodeGroup("a", 1, "A100-40GB", 2)])
    job = JobSpec("g", "gpt-tiny", 4, 1, 2)
    cell = Cell("g", "A100-40GB", 2, 1)
    est = CellEstimator(profiler=pj.JaxStageProfiler(repeats=1, cache=DiskCache(tmp_path)),
                        micro_batch_factor=1)
    first = est.best_in_cell(job, cell, cl)
    assert first is not None and first.iter_time_s > 0
    assert DiskCache(tmp_path).has(pj.KIND, model="gpt-tiny")
    tuned_first = tune_cell(job, cell, cl, est)  # its hybrid layouts: compiled once more
    assert tuned_first is not None and tuned_first.iter_time_s > 0

    def no_compile(*a, **k):
        raise AssertionError("compiled again")

    monkeypatch.setattr(pj, "profile_stage", no_compile)
    est2 = CellEstimator(profiler=pj.JaxStageProfiler(repeats=1, cache=DiskCache(tmp_path)),
                         micro_batch_factor=1)
    again = est2.best_in_cell(job, cell, cl)
    assert again.iter_time_s == pytest.approx(first.iter_time_s)
    tuned = tune_cell(job, cell, cl, est2)
    assert tuned is not None and tuned.iter_time_s == pytest.approx(tuned_first.iter_time_s)
