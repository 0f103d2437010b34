"""JAX profiler: compile a stage for an N-device mesh, read its per-device cost, time it on one.

A stage of a catalog transformer (its blocks' MLP and attention projections,
at the catalog's hidden size, sequence and micro-batch) is written as a JAX
training step (loss and gradients) and compiled under a ``jax.sharding.Mesh``
of ``devices`` devices with either

* DP sharding: activations split on the batch axis, weights replicated (the
  compiled program all-reduces the gradients), or
* TP sharding: Megatron layout, first matrix split by columns and second by
  rows (the program all-reduces activations).

From the compiled per-device program we read ``cost_analysis()`` (FLOPs,
bytes accessed), ``memory_analysis()`` (argument, output and temporary bytes)
and the collectives in its optimised HLO with their result sizes. Then we time
the per-device computation on one device -- the "distributed-equivalent
compilation" of Crius: the same step compiled for the local shard shapes
(``batch / n`` for DP; ``width / n`` for TP) on a single device, whose cost
equals the N-device program's per-device cost minus its collectives (checked:
the FLOPs agree). Collectives are costed from the communication tables.

On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set
before JAX starts; :func:`profile_stage` runs itself in a fresh interpreter
when the current one has fewer devices. JAX has no automatic sharding search
any more; choosing among candidate shardings is apportion's job.
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    import jax
    import jax.numpy as jnp

    def block(x, w):  # type: ignore[no-untyped-def]
        wqkv, wo, w1, w2 = w
        q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
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
    return [(jnp.full((h, 3 * h // tp), 0.01, jnp.float32), jnp.full((h // tp, h), 0.01, jnp.float32),
             jnp.full((h, 4 * h // tp), 0.01, jnp.float32), jnp.full((4 * h // tp, h), 0.01, jnp.float32))
            for _ in range(layers)]


def _in_process(model: str, mode: str, devices: int, micro_batch: int, layers: int | None,
                repeats: int) -> JaxStageProfile:
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
    head_dim = h // heads
    nblocks = layers or sum(1 for n in spec.layers if spec.graph.nodes[n].get("kind") == "block")
    nblocks = max(1, nblocks)
    if len(jax.devices()) < devices:
        raise RuntimeError(f"{len(jax.devices())} JAX devices, need {devices}")
    mesh = Mesh(jax.devices()[:devices], ("x",))
    step = _stage_fns(h, head_dim, nblocks)
    ws = _weights(h, nblocks)
    x = jnp.ones((micro_batch, s, h), jnp.float32)
    if mode == "dp":
        w_sh = [tuple(NamedSharding(mesh, P()) for _ in w) for w in ws]
        x_sh = NamedSharding(mesh, P("x"))
    else:
        col, row = NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P("x", None))
        w_sh = [(col, row, col, row) for _ in ws]
        x_sh = NamedSharding(mesh, P())
    compiled = jax.jit(step, in_shardings=(w_sh, x_sh)).lower(ws, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    mem = compiled.memory_analysis()
    mem_bytes = float(sum(getattr(mem, a, 0) or 0 for a in
                          ("argument_size_in_bytes", "output_size_in_bytes",
                           "temp_size_in_bytes"))) if mem is not None else 0.0
    colls = parse_collectives(compiled.as_text())
    # the per-device computation alone, on one device, with the local shard shapes
    one = jax.devices()[0]
    if mode == "dp":
        lw, lx = _weights(h, nblocks), jnp.ones((max(1, micro_batch // devices), s, h), jnp.float32)
    else:
        lw, lx = _weights(h, nblocks, devices), x
    local_step = _stage_fns(h, head_dim, nblocks)
    lw = jax.device_put(lw, one)
    lx = jax.device_put(lx, one)
    local = jax.jit(local_step).lower(lw, lx).compile()
    lcost = local.cost_analysis()
    lcost = lcost[0] if isinstance(lcost, (list, tuple)) else lcost
    jax.block_until_ready(local(lw, lx))
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        jax.block_until_ready(local(lw, lx))
        times.append(time.perf_counter() - t0)
    times.sort()
    return JaxStageProfile(model, mode, devices, micro_batch, nblocks,
                           float((cost or {}).get("flops", 0.0)),
                           float((cost or {}).get("bytes accessed", 0.0)), mem_bytes, colls,
                           float((lcost or {}).get("flops", 0.0)), times[len(times) // 2])


def profile_stage(model: str, mode: str = "dp", devices: int = 8, micro_batch: int = 8,
                  layers: int | None = None, repeats: int = 3) -> JaxStageProfile:
    """Compile and cost one stage; runs in a subprocess when JAX lacks the devices."""
    if mode not in ("dp", "tp"):
        raise ValueError("mode must be 'dp' or 'tp'")
    if "jax" in sys.modules:
        import jax

        if len(jax.devices()) >= devices:
            return _in_process(model, mode, devices, micro_batch, layers, repeats)
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={max(devices, 8)}"
                        ).strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    args = json.dumps({"model": model, "mode": mode, "devices": devices,
                       "micro_batch": micro_batch, "layers": layers, "repeats": repeats})
    proc = subprocess.run([sys.executable, "-m", "apportion.estimation.profile_jax", args],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"JAX profile failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return JaxStageProfile(**data)


def _main() -> None:
    a = json.loads(sys.argv[1])
    p = _in_process(a["model"], a["mode"], a["devices"], a["micro_batch"], a["layers"],
                    a["repeats"])
    print(json.dumps(p.as_dict()))


if __name__ == "__main__":
    _main()
