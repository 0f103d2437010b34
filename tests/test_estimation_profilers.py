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
