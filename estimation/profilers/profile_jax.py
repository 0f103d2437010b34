"""JAX profiler: compile a stage for an N-device mesh, read its per-device cost, time it on one.

A stage of a catalog transformer (its blocks' MLP and attention projections,
at the catalog's hidden size, sequence and micro-batch) is written as a JAX
training step (loss and gradients) and compiled under a ``jax.sharding.Mesh``
of ``devices`` devices with either

* DP sharding: activations split on the batch axis, weights replicated (the
  compiled program all-reduces the gradients), or
* TP sharding: Megatron layout -- the fused QKV and first MLP matrices split
  by columns (per head / per FFN slice), the output projections by rows -- so
  the program all-reduces activations and nothing else.

From the compiled per-device program we read ``cost_analysis()`` (FLOPs,
bytes accessed), ``memory_analysis()`` (argument, output and temporary bytes)
and the collectives in its optimised HLO with their result sizes. Then we time
the per-device computation on one device -- the "distributed-equivalent
compilation" of Crius. Two methods (``JaxStageProfile.method``):

* ``hlo-rewrite`` (default): the optimised per-device HLO of the N-device
  program with each collective replaced by a local op of the same shape,
  recompiled for one device and run (:mod:`apportion.estimation.profilers.hlo_rewrite`).
  This times what a device of the mesh really computes (the partitioner's
  shard shapes, re-layouts and padding included) and, on inputs where the
  other devices contribute zeros, reproduces device 0's outputs (tested).
* ``sharded-shapes`` (fallback when the rewrite fails; the reason goes to
  ``fallback_reason``): the step re-written by hand with the local shard
  shapes (``batch / n`` for DP; ``width / n`` for TP). Same FLOPs, but only an
  approximation of the partitioned program.

Why time at all instead of counting FLOPs: TP and DP shards of a stage have
the same per-device FLOPs (within 1 %) but not the same time -- TP's matmuls
are ``h/8`` wide over the whole micro-batch, DP's are full width over 1/8 of
it. Measured on this machine (gpt-tiny, h=128, s=64, 8 virtual CPU devices,
jax 0.10.2, 2 shared cores at load ~3.5; median of 100-200 interleaved runs):

=============  =========  ===========  ===========  =====  ==================
blocks, batch  FLOPs/dev  DP rewrite   TP rewrite   TP/DP  sharded-shapes TP/DP
=============  =========  ===========  ===========  =====  ==================
1, 8           7.7e7      2.26 ms      2.75 ms      1.22   1.19
1, 32          3.1e8      5.61 ms      9.40 ms      1.68   1.63
4, 8           3.3e8      9.29 ms      9.91 ms      1.07   1.07
=============  =========  ===========  ===========  =====  ==================

The TP penalty was small at batch 8 and about 1.7x at batch 32 (near the
"about twice" reported in the issue); the rewrite and the sharded-shapes step
agree within 3 % for this stage, whose partitioned program holds nothing but
the shard-shaped math and all-reduces. Timings are not asserted in tests.
Collectives are costed from the communication tables, not here.

On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set
before JAX starts; :func:`profile_stage` runs itself in a fresh interpreter
when the current one has fewer devices. JAX has no automatic sharding search
any more; choosing among candidate shardings is apportion's job.

:class:`JaxStageProfiler` is the cell estimator's stage profiler from these
profiles (Crius's cell-guided tuning on an N-device mesh), cached in the profile
cache under kind ``jax-stage`` (:func:`cached_profile_stage`) exactly as the
torch profiler caches its layers; ``apportion profile --backend jax`` fills it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from apportion.estimation.cache import cache_key
from apportion.estimation.models.crius import StageProfile
from apportion.estimation.stage_profiles import MeasuredStage, versions_of

log = logging.getLogger(__name__)

COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                  "all-to-all")
_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "s32": 4, "s8": 1, "u8": 1, "pred": 1,
                "s64": 8, "u32": 4}


@dataclass(frozen=True)
class JaxStageProfile:
    model: str
    mode: str
    devices: int
    micro_batch: int
    layers: int
    flops_per_device: float
    bytes_accessed_per_device: float
    memory_bytes_per_device: float
    collectives: list[dict[str, Any]] = field(default_factory=list)
    local_flops: float = 0.0
    local_time_s: float = 0.0
    method: str = "sharded-shapes"
    #: why ``hlo-rewrite`` was not used (empty when it was, or when not asked for)
    fallback_reason: str = ""
    #: collectives the rewrite replaced by local ops, by kind
    replaced_collectives: dict[str, int] = field(default_factory=dict)
    #: the device the per-device program ran on (``jax.devices()[0].device_kind``)
    device: str = ""
    #: of ``memory_bytes_per_device``: the arguments (weights, the micro-batch) and the
    #: temporaries (activations kept for the backward pass)
    argument_bytes_per_device: float = 0.0
    temp_bytes_per_device: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


METHODS = ("hlo-rewrite", "sharded-shapes")


def parse_collectives(hlo_text: str) -> list[dict[str, Any]]:
    """Collectives in an HLO module's text with their result bytes."""
    out: list[dict[str, Any]] = []
    pat = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(COLLECTIVE_OPS) +
                     r")(?:-start)?\(")
    for line in hlo_text.splitlines():
        m = pat.search(line)
        if not m or "-done" in line.split("=")[0]:
            continue
        shapes = re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", m.group(1))
        nbytes = 0
        for dt, dims in shapes:
            n = 1
            for d in (x for x in dims.split(",") if x):
                n *= int(d)
            nbytes += n * _DTYPE_BYTES.get(dt, 4)
        out.append({"op": m.group(2), "bytes": nbytes})
    return out


def _stage_fns(hidden: int, head_dim: int, layers: int):  # type: ignore[no-untyped-def]
    """The stage's training step: ``(loss, grads) = step(weights, x)``.

    ``wqkv`` is ``(h, 3, inner)`` rather than ``(h, 3h)`` so that splitting its
    last axis gives each device whole heads of Q, K and V (Megatron); a column
    split of a fused ``(h, 3h)`` matrix would cut across Q/K/V and make the
    partitioner shuffle them between devices.
    """
    import jax
    import jax.numpy as jnp

    def block(x, w):  # type: ignore[no-untyped-def]
        wqkv, wo, w1, w2 = w
        qkv = jnp.einsum("bsd,dte->bste", x, wqkv)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        b, s, inner = q.shape
        hd = head_dim
        nh = inner // hd

        def sp(t):  # type: ignore[no-untyped-def]
            return t.reshape(b, s, nh, hd).transpose(0, 2, 1, 3)

        att = jax.nn.softmax(sp(q) @ sp(k).transpose(0, 1, 3, 2) / jnp.sqrt(hd), axis=-1)
        y = (att @ sp(v)).transpose(0, 2, 1, 3).reshape(b, s, inner)
        x = x + y @ wo
        return x + jax.nn.gelu(x @ w1) @ w2

    def loss(ws, x):  # type: ignore[no-untyped-def]
        for w in ws:
            x = block(x, w)
        return jnp.mean(x * x)

    return jax.value_and_grad(loss)


def _weights(hidden: int, layers: int, tp: int = 1):  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    h = hidden
    return [(jnp.full((h, 3, h // tp), 0.01, jnp.float32), jnp.full((h // tp, h), 0.01, jnp.float32),
             jnp.full((h, 4 * h // tp), 0.01, jnp.float32), jnp.full((4 * h // tp, h), 0.01, jnp.float32))
            for _ in range(layers)]


@dataclass
class StageProgram:
    """A stage's step with its N-device shardings, ready to lower."""

    step: Any
    weights: Any
    x: Any
    in_shardings: Any
    hidden: int
    head_dim: int
    seq: int
    blocks: int

    def compile(self) -> Any:
        import jax

        return jax.jit(self.step, in_shardings=self.in_shardings,
                       keep_unused=True).lower(self.weights, self.x).compile()


def stage_program(model: str, mode: str, devices: int, micro_batch: int,
                  layers: int | None) -> StageProgram:
    """The stage of ``model`` under DP or TP sharding over the first ``devices`` devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from apportion.models import get_model

    spec = get_model(model)
    h, s = spec.hidden, spec.seq_len
    heads = max(devices, h // 64)  # a TP degree must divide the heads
    if h % heads:
        raise ValueError(f"hidden {h} does not split into {heads} heads")
    nblocks = layers or sum(1 for n in spec.layers if spec.graph.nodes[n].get("kind") == "block")
    nblocks = max(1, nblocks)
    if len(jax.devices()) < devices:
        raise RuntimeError(f"{len(jax.devices())} JAX devices, need {devices}")
    mesh = Mesh(jax.devices()[:devices], ("x",))
    if mode == "dp":
        rep = NamedSharding(mesh, P())
        w_sh = [(rep, rep, rep, rep) for _ in range(nblocks)]
        x_sh = NamedSharding(mesh, P("x"))
    else:
        col, row = NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P("x", None))
        w_sh = [(NamedSharding(mesh, P(None, None, "x")), row, col, row) for _ in range(nblocks)]
        x_sh = NamedSharding(mesh, P())
    return StageProgram(_stage_fns(h, h // heads, nblocks), _weights(h, nblocks),
                        jnp.ones((micro_batch, s, h), jnp.float32), (w_sh, x_sh), h, h // heads,
                        s, nblocks)


def _hlo_rewrite_local(compiled: Any, repeats: int) -> tuple[float, float, dict[str, int]]:
    """FLOPs and median time of the N-device program's per-device HLO run on one device."""
    from apportion.estimation.profilers import hlo_rewrite as hr

    rw = hr.rewrite_for_one_device(compiled.as_text())
    exe = hr.compile_hlo_text(rw.text)
    t = hr.time_executable(exe, hr.default_inputs(rw.parameters), repeats)
    return hr.flops(exe), t, rw.replaced


def _sharded_shapes_local(sp: StageProgram, mode: str, devices: int, micro_batch: int,
                          repeats: int) -> tuple[float, float]:
    """FLOPs and median time of the step re-written with the local shard shapes."""
    import jax
    import jax.numpy as jnp

    one = jax.devices()[0]
    h, n = sp.hidden, sp.blocks
    if mode == "dp":
        lw = _weights(h, n)
        lx = jnp.ones((max(1, micro_batch // devices), sp.seq, h), jnp.float32)
    else:
        lw, lx = _weights(h, n, devices), jnp.ones((micro_batch, sp.seq, h), jnp.float32)
    lw, lx = jax.device_put(lw, one), jax.device_put(lx, one)
    local = jax.jit(_stage_fns(h, sp.head_dim, n)).lower(lw, lx).compile()
    lcost = local.cost_analysis()
    lcost = lcost[0] if isinstance(lcost, (list, tuple)) else lcost
    jax.block_until_ready(local(lw, lx))
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        jax.block_until_ready(local(lw, lx))
        times.append(time.perf_counter() - t0)
    times.sort()
    return float((lcost or {}).get("flops", 0.0)), times[len(times) // 2]


def _in_process(model: str, mode: str, devices: int, micro_batch: int, layers: int | None,
                repeats: int, method: str = "hlo-rewrite") -> JaxStageProfile:
    sp = stage_program(model, mode, devices, micro_batch, layers)
    compiled = sp.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    mem = compiled.memory_analysis()
    mem_bytes = float(sum(getattr(mem, a, 0) or 0 for a in
                          ("argument_size_in_bytes", "output_size_in_bytes",
                           "temp_size_in_bytes"))) if mem is not None else 0.0
    arg_bytes = float(getattr(mem, "argument_size_in_bytes", 0) or 0) if mem is not None else 0.0
    temp_bytes = float(getattr(mem, "temp_size_in_bytes", 0) or 0) if mem is not None else 0.0
    colls = parse_collectives(compiled.as_text())
    reason, replaced = "", dict[str, int]()
    if method == "hlo-rewrite":
        try:
            lflops, ltime, replaced = _hlo_rewrite_local(compiled, repeats)
        except Exception as exc:  # noqa: BLE001 - any failure of the rewrite falls back
            reason = f"{type(exc).__name__}: {str(exc)[:500]}"
            log.warning("hlo-rewrite failed for %s %s, timing sharded shapes: %s", model, mode,
                        reason)
            method = "sharded-shapes"
    if method == "sharded-shapes":
        lflops, ltime = _sharded_shapes_local(sp, mode, devices, micro_batch, repeats)
    import jax

    return JaxStageProfile(model, mode, devices, micro_batch, sp.blocks,
                           float((cost or {}).get("flops", 0.0)),
                           float((cost or {}).get("bytes accessed", 0.0)), mem_bytes, colls,
                           lflops, ltime, method, reason, replaced,
                           str(jax.devices()[0].device_kind), arg_bytes, temp_bytes)


def device0_equivalence(model: str, mode: str, devices: int = 8, micro_batch: int = 8,
                        layers: int | None = 1, seed: int = 0) -> list[dict[str, Any]]:
    """Run the N-device program and its one-device rewrite; compare device 0's outputs.

    Inputs are random where device 0 holds them and zero on every other
    device's shard (a replicated input stays whole). In this stage every
    collective is a sum all-reduce, and the other devices' contributions are
    exactly zero: under DP their batch rows are zero, so their activations,
    loss terms and weight gradients are zero (no biases; ``gelu(0) = 0``);
    under TP their weight shards are zero, so their partial projections and
    the partial input gradients they add are zero. An all-reduce over device 0's value and zeros
    returns device 0's value, which is what the rewrite's copy returns too, so
    every output of the rewritten program (loss and weight gradients) must
    equal device 0's shard of the N-device program's output, up to float
    re-association from the recompilation. Returns one row per output:
    shape, max |reference| and max |difference|.
    """
    import jax
    import numpy as np
    from apportion.estimation.profilers import hlo_rewrite as hr

    sp = stage_program(model, mode, devices, micro_batch, layers)
    rng = np.random.default_rng(seed)
    dev0 = jax.devices()[0]
    leaves, treedef = jax.tree.flatten((sp.weights, sp.x))
    sh_leaves = jax.tree.leaves(sp.in_shardings)
    glob, local = [], []
    for leaf, sh in zip(leaves, sh_leaves):
        full = rng.standard_normal(leaf.shape).astype(np.float32) * 0.1
        idx = sh.devices_indices_map(leaf.shape)[dev0]
        kept = np.zeros_like(full)
        kept[idx] = full[idx]
        glob.append(jax.device_put(kept, sh))
        local.append(kept[idx])
    ws, x = jax.tree.unflatten(treedef, glob)
    compiled = sp.compile()
    ref = [next(np.asarray(s.data) for s in o.addressable_shards if s.device == dev0)
           for o in jax.tree.leaves(compiled(ws, x))]
    rw = hr.rewrite_for_one_device(compiled.as_text())
    if [p.dims for p in rw.parameters] != [list(a.shape) for a in local]:
        raise RuntimeError(f"entry parameters {[p.dims for p in rw.parameters]} are not the "
                           f"shards {[a.shape for a in local]}")
    got = hr.run(hr.compile_hlo_text(rw.text), local)
    if len(got) != len(ref):
        raise RuntimeError(f"{len(got)} outputs from the rewrite, {len(ref)} from the mesh")
    return [{"shape": list(r.shape), "max_ref": float(np.max(np.abs(r))),
             "max_diff": float(np.max(np.abs(np.asarray(g) - r)))} for g, r in zip(got, ref)]


def profile_stage(model: str, mode: str = "dp", devices: int = 8, micro_batch: int = 8,
                  layers: int | None = None, repeats: int = 3,
                  method: str = "hlo-rewrite") -> JaxStageProfile:
    """Compile and cost one stage; runs in a subprocess when JAX lacks the devices."""
    if mode not in ("dp", "tp"):
        raise ValueError("mode must be 'dp' or 'tp'")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    if "jax" in sys.modules:
        import jax

        if len(jax.devices()) >= devices:
            return _in_process(model, mode, devices, micro_batch, layers, repeats, method)
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={max(devices, 8)}"
                        ).strip()
    env.setdefault("JAX_PLATFORMS", "cpu")

    def child(how: str) -> subprocess.CompletedProcess[str]:
        args = json.dumps({"model": model, "mode": mode, "devices": devices,
                           "micro_batch": micro_batch, "layers": layers, "repeats": repeats,
                           "method": how})
        return subprocess.run([sys.executable, "-m", "apportion.estimation.profilers.profile_jax", args],
                              env=env, capture_output=True, text=True, timeout=600,
                              check=False)

    proc, reason = child(method), ""
    if proc.returncode < 0 and method == "hlo-rewrite":
        # XLA aborts (CHECK failures) rather than raising on some malformed modules: a
        # killed child falls back like a raised error does
        reason = f"profile process killed by signal {-proc.returncode}: {proc.stderr[-400:]}"
        log.warning("hlo-rewrite crashed for %s %s, timing sharded shapes", model, mode)
        proc = child("sharded-shapes")
    if proc.returncode != 0:
        raise RuntimeError(f"JAX profile failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if reason:
        data["fallback_reason"] = reason
    return JaxStageProfile(**data)


def profile_platform() -> str:
    """The JAX platform :func:`profile_stage` compiles for when it starts its own process
    (``JAX_PLATFORMS``' first entry, else ``cpu``): part of every cached profile's key."""
    return (os.environ.get("JAX_PLATFORMS") or "cpu").split(",")[0].strip() or "cpu"


def cached_profile_stage(cache: Any, model: str, mode: str = "dp", devices: int = 8,
                         micro_batch: int = 8, layers: int | None = None, repeats: int = 3,
                         method: str = "hlo-rewrite") -> JaxStageProfile:
    """:func:`profile_stage` through the profile cache (kind ``jax-stage``, keyed by model,
    platform, layout, mesh width, micro-batch, blocks, repeats and method), as the torch
    profiler caches its layers: a stage compiled once is never compiled again.
    ``cache``: a :class:`~apportion.estimation.cache.DiskCache` or None (no caching)."""
    key = cache_key(model, profile_platform(),
                    {"mode": mode, "devices": devices, "micro_batch": micro_batch,
                     "blocks": layers}, repeats=repeats, method=method)
    if cache is not None:
        hit = cache.get(KIND, key)
        if hit is not None:
            return JaxStageProfile(**hit)
    prof = profile_stage(model, mode, devices, micro_batch, layers, repeats, method)
    if cache is not None:
        cache.put(KIND, key, prof.as_dict())
    return prof


#: the profile cache's kind for JAX stage profiles
KIND = "jax-stage"


class JaxStageProfiler:
    """Crius stage profiles from JAX, as :class:`~apportion.estimation.profilers.
    profile_torch.TorchStageProfiler` gives them from torch: plugged into the cell
    estimator (``CellEstimator(profiler=...)``) and its cell-guided tuning.

    A stage's blocks are compiled for a ``devices``-wide mesh under DP or TP sharding and the
    per-device program timed on one device (:func:`profile_stage`), through the profile
    cache (:func:`cached_profile_stage`). Under DP each device gets a whole number of the
    micro-batch's samples (at least one; the time is scaled to the share it stands for);
    the compute is the measured per-device step, forward and backward. Memory: the
    program's per device (weights, gradients, the activations it keeps) with the
    activations held for ``inflight`` micro-batches, plus two Adam moments of the
    device's weights. A stage without blocks (the embedding or the head alone) has
    nothing to compile: its weights' memory and no compute.
    """

    def __init__(self, repeats: int = 3, cache: Any = None, method: str = "hlo-rewrite") -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        self.repeats = repeats
        self.cache = cache
        self.method = method

    def profile(self, model: Any, rng: tuple[int, int], gpu_type: str, devices: int,
                mode: str, micro_batch: float, inflight: int) -> StageProfile:
        a, b = rng
        blocks = sum(1 for n in model.layers[a:b] if model.graph.nodes[n].get("kind") == "block")
        params = float(sum(model.attr("params")[a:b]))
        shard = devices if mode == "tp" else 1
        if blocks == 0:
            return StageProfile(mode, devices, 0.0, 16.0 * params / shard)
        if mode == "dp":
            per_dev = max(1, round(micro_batch / devices))
            mb = per_dev * devices
            scale = max(micro_batch / devices, 1e-9) / per_dev
        else:
            mb = max(1, round(micro_batch))
            scale = max(micro_batch, 1e-9) / mb
        p = cached_profile_stage(self.cache, model.name, mode, devices, mb, blocks,
                                 self.repeats, self.method)
        weights = 4.0 * params / shard
        mem = p.memory_bytes_per_device + p.temp_bytes_per_device * scale * \
            (max(inflight, 1) - 1) + 2.0 * weights
        return StageProfile(mode, devices, p.local_time_s * scale, mem)


class JaxStageMeasurer:
    """Stage shards measured with JAX through the one measurer protocol
    (:class:`~apportion.estimation.profilers.stages.StageMeasurer`): the stage's blocks
    compiled for a ``devices``-wide mesh and the per-device program timed
    (:func:`cached_profile_stage`), read as :class:`JaxStageProfiler` reads it. The device
    is the one the program ran on (``jax.devices()[0].device_kind``: ``cpu`` unless
    ``JAX_PLATFORMS`` names another platform)."""

    backend = "jax"

    def __init__(self, repeats: int = 3, cache: Any = None, method: str = "hlo-rewrite") -> None:
        self.repeats = repeats
        self.cache = cache
        self.method = method
        self._device = ""

    def device(self) -> str:
        """The device the stage programs run on: the last measured one's, else ``cpu`` for
        the default host platform, else the first device of the platform JAX starts on."""
        if self._device:
            return self._device
        if profile_platform() == "cpu":
            return "cpu"
        import jax

        return str(jax.devices()[0].device_kind)

    def versions(self) -> dict[str, str]:
        return versions_of(["jax", "jaxlib"])

    def measure(self, model: Any, rng: tuple[int, int], devices: int, mode: str,
                micro_batch: float) -> MeasuredStage:
        a, b = rng
        blocks = sum(1 for n in model.layers[a:b] if model.graph.nodes[n].get("kind") == "block")
        params = float(sum(model.attr("params")[a:b]))
        shard = devices if mode == "tp" else 1
        if blocks == 0:
            return MeasuredStage(0.0, 16.0 * params / shard, 0.0)
        if mode == "dp":
            per_dev = max(1, round(micro_batch / devices))
            mb = per_dev * devices
            scale = max(micro_batch / devices, 1e-9) / per_dev
        else:
            mb = max(1, round(micro_batch))
            scale = max(micro_batch, 1e-9) / mb
        p = cached_profile_stage(self.cache, model.name, mode, devices, mb, blocks,
                                 self.repeats, self.method)
        self._device = p.device or self._device
        weights = 4.0 * params / shard
        static = p.memory_bytes_per_device - p.temp_bytes_per_device + 2.0 * weights
        return MeasuredStage(p.local_time_s * scale, max(static, 0.0),
                             p.temp_bytes_per_device * scale)


def _main() -> None:
    a = json.loads(sys.argv[1])
    p = _in_process(a["model"], a["mode"], a["devices"], a["micro_batch"], a["layers"],
                    a["repeats"], a.get("method", "hlo-rewrite"))
    print(json.dumps(p.as_dict()))


if __name__ == "__main__":
    _main()
