"""A JAX worker: a catalog transformer trained under DP or TP sharding on a device mesh.

The model is the token transformer of ``torch_nets`` (same shape read from the
catalog: hidden size, blocks, heads, sequence length, vocabulary) written as a
pure function over a parameter pytree. Parallelism is expressed as shardings
on a ``("dp", "tp")`` mesh and left to XLA's SPMD partitioner:

* DP: the batch is split along ``dp``, parameters are replicated;
* TP: q/k/v and fc1 weights are split by output column along ``tp``, o and
  fc2 by input row (Megatron's layout); XLA inserts the all-reduces.

On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set
before jax is first imported to get 8 virtual devices; ``main`` sets it when
it runs as a fresh process (``python -m apportion.runtime.workers.jax_worker``), and
tests run it in a subprocess for that reason. The data are the same
index-keyed synthetic samples as the torch worker's. :func:`train_contract`
is the multi-process form ``apportion run`` launches for ``workload.kind:
jax`` (one process per rank, the workload contract).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

# the catalog shape and data come from torch_nets (which needs torch); see _data()


def _shape(name: str) -> Any:
    from apportion.runtime.workers.torch_nets import shape_of

    from apportion.models import get_model
    shape = shape_of(get_model(name))
    if shape.family == "vit":
        raise ValueError("the JAX worker trains the token transformers (gpt-tiny, bert-tiny)")
    return shape


def init_params(name: str, seed: int = 0) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    s = _shape(name)
    h, f = s.hidden, 4 * s.hidden
    key = jax.random.PRNGKey(seed)
    keys = iter(jax.random.split(key, 2 + 6 * s.layers))

    def w(shape: tuple[int, ...], std: float = 0.02) -> Any:
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    blocks = []
    for _ in range(s.layers):
        blocks.append({"q": w((h, h)), "k": w((h, h)), "v": w((h, h)), "o": w((h, h)),
                       "fc1": w((h, f)), "fc2": w((f, h)),
                       "ln1": jnp.ones((h,)), "ln2": jnp.ones((h,))})
    return {"wte": w((s.vocab, h)), "wpe": w((s.seq, h)), "blocks": blocks,
            "ln_f": jnp.ones((h,))}


def forward(params: dict[str, Any], tokens: Any, heads: int, causal: bool) -> Any:
    import jax
    import jax.numpy as jnp

    def ln(x: Any, g: Any) -> Any:
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * g

    b, s = tokens.shape
    x = params["wte"][tokens] + params["wpe"][:s]
    h = x.shape[-1]
    hd = h // heads
    mask = jnp.tril(jnp.ones((s, s), bool)) if causal else jnp.ones((s, s), bool)
    for blk in params["blocks"]:
        y = ln(x, blk["ln1"])
        q, k, v = (jnp.einsum("bsh,hd->bsd", y, blk[n]).reshape(b, s, heads, hd)
                   for n in ("q", "k", "v"))
        att = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(hd)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
        y = jnp.einsum("bnqk,bknd->bqnd", att, v).reshape(b, s, h)
        x = x + y @ blk["o"]
        x = x + jax.nn.gelu(ln(x, blk["ln2"]) @ blk["fc1"]) @ blk["fc2"]
    return ln(x, params["ln_f"]) @ params["wte"].T


def shardings(params: dict[str, Any], mesh: Any, tp: bool) -> Any:
    """Replicated parameters for DP; Megatron column/row splits along ``tp`` for TP."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    rep = NamedSharding(mesh, P())
    if not tp:
        return jax.tree_util.tree_map(lambda _: rep, params)
    col, row = NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None))
    blocks = [{"q": col, "k": col, "v": col, "o": row, "fc1": col, "fc2": row,
               "ln1": rep, "ln2": rep} for _ in params["blocks"]]
    return {"wte": rep, "wpe": rep, "blocks": blocks, "ln_f": rep}


def train(name: str, dp: int, tp: int, steps: int, batch_size: int, lr: float = 0.1,
          seed: int = 0) -> dict[str, Any]:
    """Train ``steps`` SGD steps on a (dp, tp) mesh; returns losses and where params live."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from apportion.runtime.workers.torch_nets import batch
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    devices = jax.devices()
    if dp * tp > len(devices):
        raise ValueError(f"mesh dp={dp} x tp={tp} needs {dp * tp} devices, jax sees "
                         f"{len(devices)} (set XLA_FLAGS=--xla_force_host_platform_device_count)")
    if batch_size % dp:
        raise ValueError(f"global batch {batch_size} is not divisible by dp={dp}")
    s = _shape(name)
    if tp > 1 and s.heads % tp:
        raise ValueError(f"tp={tp} does not divide {s.heads} heads")
    mesh = Mesh(np.array(devices[:dp * tp]).reshape(dp, tp), ("dp", "tp"))
    params = init_params(name, seed)
    p_shard = shardings(params, mesh, tp > 1)
    params = jax.device_put(params, p_shard)
    data_shard = NamedSharding(mesh, P("dp", None))
    step = _sgd_step(s.heads, s.family == "gpt", lr)
    losses = []
    for it in range(steps):
        xt, yt = batch(name, seed, it * batch_size, batch_size)
        x = jax.device_put(jnp.asarray(xt.numpy()), data_shard)
        y = jax.device_put(jnp.asarray(yt.numpy()), data_shard)
        params, loss = step(params, x, y)
        losses.append(float(loss))
    fc1 = params["blocks"][0]["fc1"]
    return {"losses": losses, "devices": dp * tp, "dp": dp, "tp": tp,
            "fc1_shard_shape": list(fc1.addressable_shards[0].data.shape),
            "fc1_shape": list(fc1.shape)}


def _sgd_step(heads: int, causal: bool, lr: float) -> Any:
    """The jitted SGD step at ``lr`` on the next-token cross-entropy: ``step(params, x,
    y) -> (params, loss)``; the same for :func:`train` and :func:`train_contract`."""
    import jax
    import jax.numpy as jnp

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(forward(p, x, heads, causal), -1)
        return -jnp.take_along_axis(logp, y[..., None], -1).mean()

    @jax.jit
    def step(p: Any, x: Any, y: Any) -> tuple[Any, Any]:
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), loss

    return step


def _join_ranks(plan: Any, world: int) -> None:
    """Refuse a plan this worker cannot run on ``world`` ranks; with several, join
    ``jax.distributed`` (gloo collectives on CPU), keeping the contract's SIGTERM."""
    import jax
    from apportion.runtime import workload as wl

    if plan.pp > 1 or plan.zero_stage or plan.offload or plan.gpus != world:
        raise ValueError(f"plan {plan.label()}: the JAX worker runs dp x tp on {world} ranks")
    if world > 1:
        if os.environ["JAX_PLATFORMS"] == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        wl.init_jax_distributed()
        wl.stop_requested(install=True)  # jax.distributed installs its own SIGTERM handler


def _resumed_params(host: dict[str, Any], ckfile: Path, mesh: Any,
                    tp: bool) -> tuple[int, Any]:
    """The iteration reached and the parameters, sharded on ``mesh``: from ``ckfile``
    (full parameters, arrays only: any plan resumes any other), else ``host``'s."""
    import jax
    import numpy as np

    leaves, tree = _flat(host)
    start = 0
    if ckfile.exists():
        with np.load(ckfile, allow_pickle=False) as z:  # arrays only, never objects
            start = int(z["iteration"])
            leaves = [z[f"p{i}"] for i in range(len(leaves))]
    shard_leaves, _ = _flat(shardings(host, mesh, tp))
    params = jax.tree_util.tree_unflatten(tree, [
        _global_array(np.asarray(x), sh) for x, sh in zip(leaves, shard_leaves, strict=True)])
    return start, params


def _write_params(params: Any, it: int, writer: bool, ckfile: Path) -> None:
    """Gather the full parameters from every process (each calls this) and, on the
    ``writer``, replace ``ckfile`` with them and ``iteration`` (written beside it first, so
    a kill never leaves half a file)."""
    import numpy as np
    from jax.experimental import multihost_utils

    full = [np.asarray(x) for x in multihost_utils.process_allgather(_flat(params)[0],
                                                                      tiled=True)]
    if writer:
        ckdir = ckfile.parent
        ckdir.mkdir(parents=True, exist_ok=True)
        tmp = ckdir / ".params.tmp.npz"
        np.savez(tmp, iteration=np.int64(it), **{f"p{i}": x for i, x in enumerate(full)})
        os.replace(tmp, ckfile)


def _global_array(host: Any, sharding: Any) -> Any:
    """A global array from a host value every process holds whole (each takes its shards)."""
    import jax
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _flat(params: Any) -> tuple[list[Any], Any]:
    import jax
    return jax.tree_util.tree_flatten(params)


def train_contract(config_path: str) -> int:
    """apportion's JAX trainer under the workload contract: one process per rank.

    What ``apportion run`` launches for ``workload.kind: jax`` without a
    command. Every rank joins ``jax.distributed`` from torchrun's variables
    (gloo collectives on CPU), the plan's (dp, tp) mesh spans every process's
    device, parameters are sharded as :func:`shardings` says and batches along
    ``dp``. SGD at the job's ``train.lr``. Resumes from
    ``<checkpoint dir>/params.npz`` (full parameters: any plan resumes any
    other), checkpoints periodically, on SIGTERM (then exits 0) and at the
    target; rank 0 appends the progress lines.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import time

    import jax
    import numpy as np
    from apportion.runtime import workload as wl
    from apportion.runtime.workers.torch_nets import batch
    from apportion.runtime.workers.train_config import TrainConfig
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    cfg = TrainConfig.load(config_path)
    plan = cfg.execution_plan
    wl.stop_requested()
    rank, world = wl.rank(), wl.world_size()
    _join_ranks(plan, world)
    s = _shape(cfg.model)
    if plan.tp > 1 and s.heads % plan.tp:
        raise ValueError(f"tp={plan.tp} does not divide {s.heads} heads")
    B = cfg.global_batch_size
    if B % plan.dp:
        raise ValueError(f"global batch {B} is not divisible by dp={plan.dp}")
    devices = jax.devices()[:plan.gpus]
    mesh = Mesh(np.array(devices).reshape(plan.dp, plan.tp), ("dp", "tp"))
    host = init_params(cfg.model, cfg.seed)
    ckdir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else Path(cfg.workdir) / "checkpoint"
    ckfile = ckdir / "params.npz"
    progress = Path(cfg.progress_file) if cfg.progress_file else \
        Path(cfg.workdir) / wl.PROGRESS_FILE_NAME
    start, params = _resumed_params(host, ckfile, mesh, plan.tp > 1)
    data_shard = NamedSharding(mesh, P("dp", None))
    step = _sgd_step(s.heads, s.family == "gpt", cfg.lr)

    def append(rec: dict[str, Any]) -> None:
        if rank == 0:
            with open(progress, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")

    policy = wl.CheckpointPolicy(cfg.checkpoint_every, cfg.checkpoint_interval_s)

    def save(it: int) -> None:
        _write_params(params, it, rank == 0, ckfile)
        if rank == 0:
            append({"iteration": it, "checkpoint": True, "wall": time.time()})
        multihost_utils.sync_global_devices("apportion-checkpoint")
        policy.saved()

    it = start
    while it < cfg.iterations:
        flags = np.array([wl.stop_requested(), rank == 0 and policy.due(it) and it > start],
                         np.int32)
        if world > 1:
            flags = np.asarray(multihost_utils.process_allgather(flags)).reshape(-1, 2).max(0)
        if flags[0]:
            break
        if flags[1]:
            save(it)
        t0 = time.perf_counter()
        xt, yt = batch(cfg.model, cfg.seed, it * B, B)
        x, y = _global_array(xt.numpy(), data_shard), _global_array(yt.numpy(), data_shard)
        params, loss = step(params, x, y)
        it += 1
        append({"iteration": it, "loss": float(loss), "wall": time.time(),
                "iter_time_s": time.perf_counter() - t0})
    save(it)
    return 0


cli = typer.Typer(add_completion=False, help=(__doc__ or "").splitlines()[0])


@cli.command()
def run(model: str = typer.Option("gpt-tiny", "--model"),
        dp: int = typer.Option(8, "--dp", min=1), tp: int = typer.Option(1, "--tp", min=1),
        steps: int = typer.Option(3, "--steps", min=1),
        batch: int = typer.Option(8, "--batch", min=1),
        devices: int = typer.Option(8, "--devices", min=1),
        config: str | None = typer.Option(None, "--config", help="train under the workload "
                                             "contract (apportion run, workload kind jax)")) -> None:
    """Train a few steps with DP x TP sharding on forced host devices; print JSON."""
    if config:
        raise typer.Exit(train_contract(config))
    if "jax" not in sys.modules:  # XLA reads its flags when jax is first imported
        flag = f"--xla_force_host_platform_device_count={devices}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    print(json.dumps(train(model, dp, tp, steps, batch)))


def main(argv: list[str] | None = None) -> int:
    cli(args=argv, prog_name="python -m apportion.runtime.workers.jax_worker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
