"""torch profiler: per-layer forward/backward time and peak memory of a catalog model.

The model is built as the real torch module the runtime worker trains
(:mod:`apportion.estimation.profilers.torch_models`), viewed as the catalog's layers, and
run on this machine's device (CPU here; the same code on CUDA). A stage
of ``n`` devices is profiled as one device's share:

* DP-only: the full layers on ``batch / n`` samples;
* TP-only: the layers' TP shard (heads and FFN width ``/ n``) on ``batch``
  samples -- the sharded shapes on one device.

Each layer is timed alone (its input precomputed), forward and backward, the
median of ``repeats`` runs after a warm-up. Peak memory is the CUDA allocator
peak on GPUs; on CPU it is counted: parameters, gradients, the output and the
tensors autograd saved for backward (a saved-tensor hook sums their bytes).
Results are cached on disk keyed by model, device type and plan
(:mod:`apportion.estimation.cache`). :class:`TorchStageMeasurer` measures stage shards
for the cell estimator through the one measurer protocol
(:class:`~apportion.estimation.profilers.stages.StageMeasurer`, which JAX's implements too);
:class:`TorchStageProfiler` plugs the per-layer measurements into it directly (no
provenance recorded).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from apportion.estimation.cache import DiskCache, cache_key
from apportion.estimation.models.crius import StageProfile
from apportion.estimation.stage_profiles import MeasuredStage, versions_of

from apportion.models import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerProfile:
    name: str
    fwd_s: float
    bwd_s: float
    peak_mem_bytes: float
    params: int


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_layers(model_name: str, batch: int, mode: str = "dp", devices: int = 1,
                   repeats: int = 5, cache: DiskCache | None = None, threads: int | None = None
                   ) -> list[LayerProfile]:
    """Per-layer profiles of one device's share of a ``devices``-wide DP or TP stage."""
    import torch
    from apportion.estimation.profilers.torch_models import build_net, example_input, layered

    if mode not in ("dp", "tp"):
        raise ValueError("mode must be 'dp' or 'tp'")
    per_dev = max(1, batch // devices) if mode == "dp" else batch
    tp = devices if mode == "tp" else 1
    dev = device_name()
    key = cache_key(model_name, dev, {"mode": mode, "devices": devices, "batch": batch},
                    repeats=repeats, threads=threads or torch.get_num_threads())
    if cache is not None:
        hit = cache.get("torch-layers", key)
        if hit is not None:
            return [LayerProfile(**row) for row in hit]
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    parts = layered(build_net(model_name, tp=tp).to(device))
    x = example_input(model_name, per_dev).to(device)
    inputs = []
    with torch.no_grad():
        h = x
        for _name, layer in parts:
            inputs.append(h)
            h = layer(h)
    out: list[LayerProfile] = []
    for (name, layer), inp in zip(parts, inputs):
        params = sum(p.numel() for p in layer.parameters())
        fwd_t, bwd_t, peaks = [], [], []
        for it in range(repeats + 1):
            layer.zero_grad(set_to_none=True)
            a = inp.detach().clone()
            if a.is_floating_point():
                a.requires_grad_(True)
            saved = [0]

            def pack(t: Any) -> Any:
                saved[0] += t.numel() * t.element_size()
                return t

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            _sync()
            t0 = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = layer(a)
            _sync()
            t1 = time.perf_counter()
            grad = torch.ones_like(y)
            _sync()
            t2 = time.perf_counter()
            y.backward(grad)
            _sync()
            t3 = time.perf_counter()
            if device.type == "cuda":
                peak = float(torch.cuda.max_memory_allocated())
            else:
                pbytes = sum(p.numel() * p.element_size() for p in layer.parameters())
                peak = float(2 * pbytes + saved[0] + y.numel() * y.element_size())
            if it > 0:
                fwd_t.append(t1 - t0)
                bwd_t.append(t3 - t2)
                peaks.append(peak)
        out.append(LayerProfile(name, statistics.median(fwd_t), statistics.median(bwd_t),
                                max(peaks), params))
    if cache is not None:
        cache.put("torch-layers", key, [asdict(p) for p in out])
    return out


class TorchStageProfiler:
    """Crius stage profiles from per-layer torch measurements on this device.

    Micro-batches are rounded to whole samples; ``inflight`` micro-batches of
    activations are held (1F1B on the first stage holds the most).
    """

    def __init__(self, repeats: int = 3, cache: DiskCache | None = None,
                 threads: int | None = None) -> None:
        self.repeats = repeats
        self.cache = cache
        self.threads = threads

    def profile(self, model: ModelSpec, rng: tuple[int, int], gpu_type: str, devices: int,
                mode: str, micro_batch: float, inflight: int) -> StageProfile:
        a, b = rng
        batch = max(1, int(round(micro_batch)))
        layers = profile_layers(model.name, batch, mode, devices, self.repeats, self.cache,
                                self.threads)
        sel = layers[a:b]
        compute = sum(p.fwd_s + p.bwd_s for p in sel)
        params_bytes = sum(p.params for p in sel) * 4.0
        act = sum(max(0.0, p.peak_mem_bytes - 2 * p.params * 4.0) for p in sel)
        mem = 4.0 * params_bytes + act * inflight  # weights, grads, two Adam moments
        return StageProfile(mode, devices, compute, mem)


class TorchStageMeasurer:
    """Stage shards measured with torch on this machine's device, per layer
    (:func:`profile_layers`, through the per-layer cache), summed over the stage's layers.

    DP: the stage's layers on one device's share of the micro-batch (a whole number of
    samples, at least one; the time and activations scaled to the share it stands for);
    TP: the layers' ``1/devices`` shard on the whole micro-batch. Resident bytes: weights,
    gradients and two Adam moments of fp32 parameters; activations: what the layers keep
    for backward beyond their weights and gradients."""

    backend = "torch"

    def __init__(self, repeats: int = 3, cache: DiskCache | None = None,
                 threads: int | None = None) -> None:
        self.repeats = repeats
        self.cache = cache
        self.threads = threads

    def device(self) -> str:
        return device_name()

    def versions(self) -> dict[str, str]:
        return versions_of(["torch"])

    def measure(self, model: ModelSpec, rng: tuple[int, int], devices: int, mode: str,
                micro_batch: float) -> MeasuredStage:
        from apportion.estimation.profilers.torch_models import TRAINABLE, shape_of

        if model.name not in TRAINABLE:
            raise ValueError(f"no torch module for {model.name}; torch profiles: "
                             f"{', '.join(TRAINABLE)}")
        if mode == "tp" and shape_of(model).heads % devices:
            raise ValueError(f"{model.name}'s {shape_of(model).heads} attention heads do not "
                             f"split {devices} ways")
        share = micro_batch / devices if mode == "dp" else micro_batch
        samples = max(1, int(round(share)))
        scale = max(share, 1e-9) / samples
        batch = samples * devices if mode == "dp" else samples
        layers = profile_layers(model.name, batch, mode, devices, self.repeats, self.cache,
                                self.threads)
        sel = layers[rng[0]:rng[1]]
        compute = sum(p.fwd_s + p.bwd_s for p in sel) * scale
        params_bytes = sum(p.params for p in sel) * 4.0
        act = sum(max(0.0, p.peak_mem_bytes - 2 * p.params * 4.0) for p in sel) * scale
        return MeasuredStage(compute, 4.0 * params_bytes, act)
