"""Distributed-equivalent compilation: an N-device program's per-device HLO run on one device.

The rewrite replaces each collective by a local op of the same shape. Its
outputs are checked against device 0's outputs of the real 8-device program on
inputs where every other device's shard is zero (see
``profile_jax.device0_equivalence`` for why they must then agree), and, on a
hand-written module holding every collective form, against numpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

from apportion.estimation.profilers import hlo_rewrite as hr

# every collective form the rewriter knows, with layouts, shardings and an N-device header
HAND = """\
HloModule hand, is_scheduled=true, entry_computation_layout={(f32[8,4]{1,0}, f32[4,8]{0,1})->(f32[8,4]{1,0})}, num_partitions=2, replica_count=1

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%wrapped_rs (p: f32[8,4]) -> f32[4,4] {
  %p = f32[8,4]{1,0} parameter(0)
  ROOT %rs.w = f32[4,4]{1,0} reduce-scatter(%p), channel_id=3, replica_groups={{0,1}}, dimensions={0}, to_apply=%add
}

ENTRY %main (x: f32[8,4], y: f32[4,8]) -> (f32[8,4], f32[8,4], f32[8,4], f32[16,4], f32[8,4], /*index=5*/f32[4,4], f32[4,4], f32[4,4], f32[4,4], f32[4,4]) {
  %x = f32[8,4]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}, metadata={op_name="x"}
  %y = f32[4,8]{0,1} parameter(1), sharding={replicated}
  %yt = f32[8,4]{1,0} bitcast(%y)
  %pid = u32[] partition-id()
  %rid = u32[] replica-id()
  %zero = u32[] constant(0)
  %ds = f32[4,4]{1,0} dynamic-slice(%x, %pid, %zero), dynamic_slice_sizes={4,4}
  %ar = (f32[8,4]{1,0}, f32[8,4]{1,0}) all-reduce(%x, %yt), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add, sharding={{replicated}, {replicated}}
  %g0 = f32[8,4]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[8,4]{1,0} get-tuple-element(%ar), index=1
  %ars = f32[8,4]{1,0} all-reduce-start(%x), channel_id=2, replica_groups={{0,1}}, to_apply=%add
  %ard = f32[8,4]{1,0} all-reduce-done(%ars)
  %ags = (f32[8,4]{1,0}, f32[16,4]{1,0}) all-gather-start(%x), channel_id=4, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
  %agd = f32[16,4]{1,0} all-gather-done(%ags)
  %cps = (f32[8,4]{1,0}, f32[8,4]{1,0}, u32[], u32[]) collective-permute-start(%x), channel_id=5, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[8,4]{1,0} collective-permute-done(%cps)
  %rss = ((f32[8,4]{1,0}), f32[4,4]{1,0}) async-start(%x), calls=%wrapped_rs
  %rsd = f32[4,4]{1,0} async-done(%rss), calls=%wrapped_rs
  %rs = f32[4,4]{1,0} reduce-scatter(%x), channel_id=6, replica_groups={{0,1}}, dimensions={0}, to_apply=%add
  %sl0 = f32[4,4]{1,0} slice(%x), slice={[0:4], [0:4]}
  %sl1 = f32[4,4]{1,0} slice(%x), slice={[4:8], [0:4]}
  %a2a = (f32[4,4]{1,0}, f32[4,4]{1,0}) all-to-all(%sl0, %sl1), channel_id=7, replica_groups={{0,1}}
  %a0 = f32[4,4]{1,0} get-tuple-element(%a2a), index=0
  %a1 = f32[4,4]{1,0} get-tuple-element(%a2a), index=1
  ROOT %out = (f32[8,4]{1,0}, f32[8,4]{1,0}, f32[8,4]{1,0}, f32[16,4]{1,0}, f32[8,4]{1,0}, /*index=5*/f32[4,4]{1,0}, f32[4,4]{1,0}, f32[4,4]{1,0}, f32[4,4]{1,0}, f32[4,4]{1,0}) tuple(%g0, %g1, %ard, %agd, %cpd, /*index=5*/%rsd, %rs, %a0, %a1, %ds)
}
"""


def _opcodes(text: str) -> set[str]:
    return {i.opcode for i in map(hr.parse_instr, text.splitlines()) if i is not None}


def test_parse_instruction_with_tuple_shape_and_comments():
    ins = hr.parse_instr('  ROOT %t.1 = (f32[2]{0}, /*index=1*/s32[]) tuple(%a, /*index=1*/%b), '
                         'metadata={op_name="x, y"}, sharding={{replicated}, {maximal device=0}}')
    assert ins is not None and ins.root and ins.name == "t.1" and ins.opcode == "tuple"
    assert ins.operands == ["a", "b"]
    assert ins.attrs == ['metadata={op_name="x, y"}', "sharding={{replicated}, {maximal device=0}}"]
    assert [a.text() for a in hr.parse_shape(ins.shape)] == ["f32[2]", "s32[]"]
    assert hr.parse_shape("f32[3,4]{0,1}")[0].minor_to_major == [0, 1]
    assert hr.parse_instr("HloModule m, num_partitions=8") is None


def test_every_collective_form_becomes_local_and_runs_on_one_device():
    rw = hr.rewrite_for_one_device(HAND)
    assert rw.replaced == {"all-reduce": 2, "all-gather": 1, "collective-permute": 1,
                           "reduce-scatter": 2, "all-to-all": 1}
    left = _opcodes(rw.text)
    assert not left & {*hr.COLLECTIVES, *(c + "-start" for c in hr.COLLECTIVES),
                       *(c + "-done" for c in hr.COLLECTIVES), "partition-id", "replica-id",
                       "bitcast", "fusion"}
    for tied in ("num_partitions", "replica_count", "sharding=", "replica_groups",
                 "channel_id", "entry_computation_layout"):
        assert tied not in rw.text
    assert [p.text() for p in rw.parameters] == ["f32[8,4]", "f32[4,8]"]
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    y = 10 * np.arange(32, dtype=np.float32).reshape(4, 8)
    out = hr.run(hr.compile_hlo_text(rw.text), [x, y])
    # device 0 alone: sums are its own value, the gather holds it first (zeros elsewhere),
    # a scatter keeps its first block; the {0,1}-layout bitcast is a transpose;
    # permute and all-to-all keep the shape and the operand (not other devices' data)
    want = [x, y.T, x, np.concatenate([x, np.zeros_like(x)]), x, x[:4], x[:4], x[:4], x[4:],
            x[:4]]
    assert len(out) == len(want)
    for got, exp in zip(out, want):
        np.testing.assert_array_equal(got, exp)


def test_send_recv_cannot_be_made_local():
    text = HAND.replace(
        "%zero = u32[] constant(0)",
        "%zero = u32[] constant(0)\n  %tok = token[] after-all()\n"
        "  %snd = (f32[8,4], u32[], token[]) send(%x, %tok), channel_id=9")
    with pytest.raises(hr.HloRewriteError, match="send"):
        hr.rewrite_for_one_device(text)


# run under an 8-device CPU mesh: XLA_FLAGS must be set before JAX starts
SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from apportion.estimation.profilers import hlo_rewrite as hr
from apportion.estimation.profilers.profile_jax import device0_equivalence

out = {"stage": {m: device0_equivalence("gpt-tiny", m, 8, 8, 1) for m in ("dp", "tp")}}
mesh = Mesh(jax.devices()[:8], ("x",))
S = lambda *a: NamedSharding(mesh, P(*a))
cases = {  # name: (function, input shapes, input shardings, output sharding)
    "all-gather": (lambda a: jnp.sin(a), [(64, 32)], [S("x")], S()),
    "scatter": (lambda a, b: a @ b, [(64, 128), (128, 64)], [S(None, "x"), S("x", None)],
                S("x", None)),
    "all-to-all": (lambda a: a * 2, [(64, 64)], [S("x", None)], S(None, "x")),
    "collective-permute": (lambda a: jnp.roll(a, 3, axis=0) + 1, [(64, 16)], [S("x")], S("x")),
}
dev0 = jax.devices()[0]
rng = np.random.default_rng(0)
out["tiny"] = {}
for name, (f, shapes, insh, outsh) in cases.items():
    glob, local = [], []
    for shp, sh in zip(shapes, insh):
        full = rng.standard_normal(shp).astype(np.float32)
        idx = sh.devices_indices_map(shp)[dev0]
        kept = np.zeros_like(full)
        kept[idx] = full[idx]
        glob.append(jax.device_put(kept, sh))
        local.append(kept[idx])
    c = jax.jit(f, in_shardings=insh, out_shardings=outsh).lower(*glob).compile()
    ref = [next(np.asarray(s.data) for s in o.addressable_shards if s.device == dev0)
           for o in jax.tree.leaves(c(*glob))]
    rw = hr.rewrite_for_one_device(c.as_text())
    got = hr.run(hr.compile_hlo_text(rw.text), local)
    out["tiny"][name] = {
        "ops": sorted({i.opcode for i in map(hr.parse_instr, c.as_text().splitlines())
                       if i and i.opcode in hr.COLLECTIVES + ("partition-id",)}),
        "replaced": rw.replaced, "same_shapes": [g.shape for g in got] == [r.shape for r in ref],
        "max_diff": max(float(np.abs(g - r).max()) for g, r in zip(got, ref))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mesh_run() -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["dp", "tp"])
def test_rewritten_stage_reproduces_device0_of_the_8_device_program(mesh_run, mode):
    """Loss and every weight gradient of the one-device rewrite equal device 0's shard.

    The other devices hold zeros (DP: their batch rows; TP: their weight
    shards), so each all-reduce of the mesh program adds zeros to device 0's
    value -- exactly what the rewrite's copy yields.
    """
    rows = mesh_run["stage"][mode]
    assert len(rows) == 5  # loss + 4 weight gradients of the one block
    assert rows[0]["shape"] == []
    for r in rows:
        assert r["max_ref"] > 0  # a non-trivial value, not zeros matching zeros
        assert r["max_diff"] <= 1e-4 * r["max_ref"]
    if mode == "tp":  # device 0's gradient shards, not the full matrices
        assert rows[1]["shape"] == [128, 3, 16] and rows[2]["shape"] == [16, 128]


def test_tiny_programs_with_other_collectives(mesh_run):
    tiny = mesh_run["tiny"]
    assert tiny["all-gather"]["ops"] == ["all-gather"]
    assert tiny["all-to-all"]["ops"] == ["all-to-all"]
    assert tiny["collective-permute"]["ops"] == ["collective-permute"]
    # the CPU backend lowers a reduce-scatter to all-reduce + dynamic-slice at partition-id
    assert set(tiny["scatter"]["ops"]) <= {"reduce-scatter", "all-reduce", "partition-id"}
    for case in tiny.values():
        assert case["same_shapes"] and sum(case["replaced"].values()) >= 1
    # value-exact where device 0 with zeros elsewhere determines the result
    assert tiny["all-gather"]["max_diff"] == 0.0
    assert tiny["scatter"]["max_diff"] <= 1e-5
    # permute and all-to-all keep shapes and the data dependency, not other devices' data
    assert tiny["all-to-all"]["max_diff"] > 0 and tiny["collective-permute"]["max_diff"] > 0


def test_rewrite_failure_falls_back_to_sharded_shapes(monkeypatch):
    """A one-device mesh in this process; the rewrite is made to fail on purpose."""
    from apportion.estimation.profilers import profile_jax

    def boom(text: str) -> None:
        raise hr.HloRewriteError("synthetic failure")

    monkeypatch.setattr(hr, "compile_hlo_text", boom)
    p = profile_jax.profile_stage("gpt-tiny", "dp", devices=1, micro_batch=2, layers=1,
                                  repeats=1)
    assert p.method == "sharded-shapes"
    assert "synthetic failure" in p.fallback_reason
    assert p.local_flops == pytest.approx(p.flops_per_device, rel=0.05)
    monkeypatch.undo()
    q = profile_jax.profile_stage("gpt-tiny", "dp", devices=1, micro_batch=2, layers=1,
                                  repeats=1)
    assert q.method == "hlo-rewrite" and q.fallback_reason == "" and q.replaced_collectives == {}
    assert q.local_flops == pytest.approx(q.flops_per_device, rel=0.05)
