"""Measuring the stage shards a cell needs, with any profiler, into the profile cache.

Crius profiles, for a cell (GPU type x GPUs x pipeline stages), each stage of its stage
split run data-parallel only and tensor-parallel only on the stage's devices. This module
does that with whichever profiler is at hand: torch and JAX both implement
:class:`StageMeasurer` (:class:`~apportion.estimation.profilers.profile_torch.
TorchStageMeasurer`, :class:`~apportion.estimation.profilers.profile_jax.
JaxStageMeasurer`), and :func:`profile_stages` writes each measurement as a
:class:`~apportion.estimation.stage_profiles.StageRecord` with the device it ran on, the
library versions and the time, which Crius's cell estimator then reads
(:class:`~apportion.estimation.models.crius.MeasuredStageProfiler`).

A measurement stands for the GPU type of the device it ran on
(:func:`~apportion.estimation.stage_profiles.device_gpu_type`): profiling for a cell of
another type is refused before anything runs (:func:`check_cell_type`), so a profile is
only ever made on the machine that runs the job (or, on a machine without GPUs, for the
stand-in type its worker slots are scheduled as).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from apportion.estimation.cache import DiskCache
from apportion.estimation.models.crius import CellEstimator, determine_stages
from apportion.estimation.models.tuning import parse_cell
from apportion.estimation.profilers.profile_jax import JaxStageMeasurer, cached_profile_stage
from apportion.estimation.profilers.profile_torch import (
    TorchStageMeasurer,
    device_name,
    profile_layers,
)
from apportion.estimation.stage_profiles import (
    CPU_STAND_IN,
    MeasuredStage,
    StageProfiles,
    StageRecord,
    device_gpu_type,
)

from apportion.errors import CatalogError, InputError
from apportion.inputs import check_count
from apportion.models import ModelSpec, get_model


class StageMeasurer(Protocol):
    """A profiler of stage shards: its name, the device it measures on, the versions of
    the libraries it measures with, and one shard's measurement per device."""

    backend: str

    def device(self) -> str: ...

    def versions(self) -> dict[str, str]: ...

    def measure(self, model: ModelSpec, rng: tuple[int, int], devices: int, mode: str,
                micro_batch: float) -> MeasuredStage: ...


def measurer(backend: str, repeats: int = 3, cache: Any = None) -> StageMeasurer:
    """The measurer of ``backend`` (``torch`` or ``jax``)."""
    if backend == "torch":
        return TorchStageMeasurer(repeats=repeats, cache=cache)
    if backend == "jax":
        return JaxStageMeasurer(repeats=repeats, cache=cache)
    raise InputError("--backend", "backend", f"{backend!r} is not one of torch, jax")


def check_cell_type(device: str, gpu_type: str, option: str = "--cell") -> str:
    """``gpu_type`` when this machine's ``device`` stands for it; an :class:`InputError`
    naming both otherwise (a profile is made on the GPU type it describes)."""
    mine = device_gpu_type(device)
    if mine is None:
        raise InputError(option, "gpu_type", f"this machine's device {device!r} is not in "
                         "the GPU catalog: its profiles could stand for no GPU type")
    if mine != gpu_type:
        stand = f" (a CPU stands in for {CPU_STAND_IN} only)" if device.lower() == "cpu" else ""
        raise InputError(option, "gpu_type", f"this machine's device is {device}, a "
                         f"{mine}{stand}: it cannot profile {gpu_type}; run `apportion profile` "
                         f"on a machine with {gpu_type} GPUs")
    return gpu_type


@dataclass
class Profiled:
    """What :func:`profile_stages` measured and wrote, and what it could not measure."""

    records: list[StageRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"records": [r.as_dict() for r in self.records], "skipped": list(self.skipped)}


def profile_stages(m: StageMeasurer, store: StageProfiles, spec: ModelSpec, gpu_type: str,
                   stages: list[tuple[tuple[int, int], int]], micro_batch: float) -> Profiled:
    """Measure each ``((start, end), devices)`` stage DP-only and (on more than one
    device) TP-only at ``micro_batch``, and store each record. A shard the profiler cannot
    run (a TP width the model's heads do not split into) is listed in ``skipped``, and the
    cell estimator will say it has no measured profile for it."""
    out = Profiled()
    for rng, n in stages:
        for mode in ("dp", "tp") if n > 1 else ("dp",):
            try:
                meas = m.measure(spec, rng, n, mode, micro_batch)
            except ValueError as exc:
                out.skipped.append(f"{mode} x{n} layers [{rng[0]},{rng[1]}): {exc}")
                continue
            rec = StageRecord(spec.name, gpu_type, rng[0], rng[1], mode, n, micro_batch, meas,
                              m.backend, m.device(), m.versions(), time.time())
            path = store.put(rec)
            out.records.append(StageRecord(**{**rec.__dict__, "path": str(path)}))
    return out


def cell_stages(spec: ModelSpec, batch: int, gpus: int, stages: int
                ) -> tuple[list[tuple[tuple[int, int], int]], float]:
    """The cell's stage split (Crius figure 7) and the micro-batch the cell estimator
    scores it at first (``B = 4 x stages`` micro-batches, as :class:`CellEstimator`)."""
    sp = determine_stages(spec.attr("flops"), spec.attr("out_bytes")[:-1], gpus, stages)
    if sp is None:
        raise InputError("--cell", "stages", f"{spec.name} has {len(spec.layers)} layers: no "
                         f"split into {stages} stages on {gpus} GPUs")
    B = max(1, min(CellEstimator().micro_batch_factor * stages, batch))
    return list(zip(sp.ranges, sp.gpus)), batch / B


def profile_cell(m: StageMeasurer, store: StageProfiles, spec: ModelSpec, batch: int,
                 gpu_type: str, gpus: int, stages: int) -> Profiled:
    """Every stage shard Crius's cell estimator needs for ``spec`` at global batch
    ``batch`` on the cell ``gpu_type x gpus x stages``, measured here and stored."""
    check_cell_type(m.device(), gpu_type)
    split, mb = cell_stages(spec, batch, gpus, stages)
    return profile_stages(m, store, spec, gpu_type, split, mb)


#: ``profile --batch``: samples per profiled step (the inputs are allocated at once)
MAX_PROFILE_BATCH = 4096
#: ``profile --devices``: the stage width (JAX compiles for that many host devices)
MAX_PROFILE_DEVICES = 64


def check_profile_args(model: str, backend: str, batch: int, devices: int,
                       cell: str | None = None) -> ModelSpec:
    """The ``profile`` command's choices, refused before anything is built or allocated:
    a catalog model (a malformed ``custom:`` name included), a backend, a batch and a
    stage width within their limits, a cell of this machine's GPU type with enough GPUs
    for its stages, and for torch a width the model's attention heads split into (its TP
    shards hold ``heads / devices`` heads each; with ``--cell`` a stage width they do not
    split into is skipped and said)."""
    try:
        spec = get_model(model)
    except (CatalogError, ValueError) as exc:
        raise InputError("MODEL", "model", str(exc)) from None
    if backend not in ("torch", "jax"):
        raise InputError("--backend", "backend", f"{backend!r} is not one of torch, jax")
    check_count(batch, "--batch", maximum=MAX_PROFILE_BATCH)
    check_count(devices, "--devices", maximum=MAX_PROFILE_DEVICES)
    if cell is not None:
        _, gpus, stages = parse_cell(cell)
        check_count(gpus, "--cell", maximum=MAX_PROFILE_DEVICES)
        cell_stages(spec, batch, gpus, stages)
    if backend == "torch":
        from apportion.estimation.profilers.torch_models import TRAINABLE, shape_of

        if spec.name not in TRAINABLE:
            raise InputError("MODEL", "model", f"no torch module for {spec.name}; "
                             f"torch profiles: {', '.join(TRAINABLE)}")
        heads = shape_of(spec).heads
        if cell is None and heads % devices:
            raise InputError("--devices", "devices", f"{spec.name}'s {heads} attention heads "
                             f"cannot be split {devices} ways for its TP profile; give a "
                             f"divisor of {heads}")
    return spec


def profile_report(model: str, backend: str = "torch", batch: int = 8, devices: int = 4,
                   repeats: int = 3, cache_dir: str | None = None, cell: str | None = None
                   ) -> dict[str, Any]:
    """Profile ``model`` with the torch or JAX backend and store its stage records (JSON-ready).

    Without ``cell``: DP-only and TP-only profiles of the whole model as one stage of
    ``devices`` devices at micro-batch ``batch`` (per layer for torch, the compiled stage for
    JAX), stored as that stage's records for this machine's GPU type. With ``cell``
    (``GPU_TYPE:GPUS[:STAGES]``, this machine's type): every stage shard Crius's cell
    estimator needs for a job of global batch ``batch`` on that cell."""
    spec = check_profile_args(model, backend, batch, devices, cell)
    cache = DiskCache(cache_dir) if cache_dir else DiskCache()
    store = StageProfiles(cache.root)
    m = measurer(backend, repeats, cache)
    out: dict[str, Any] = {"model": spec.name, "backend": backend, "batch": batch,
                           "devices": devices}
    if cell is not None:
        gpu, gpus, stages = parse_cell(cell)
        done = profile_cell(m, store, spec, batch, gpu, gpus, stages)
        out.update(cell={"gpu_type": gpu, "gpus": gpus, "stages": stages})
    else:
        blocks = sum(1 for n in spec.layers if spec.graph.nodes[n].get("kind") == "block")
        for mode in ("dp", "tp"):
            if backend == "torch":
                out[mode] = [asdict(p) for p in profile_layers(spec.name, batch, mode, devices,
                                                               repeats, cache)]
            else:  # the compile the stage record below reads again from the cache
                out[mode] = cached_profile_stage(cache, spec.name, mode, devices, batch,
                                                 max(1, blocks), repeats=repeats).as_dict()
        gpu = device_gpu_type(m.device())
        done = Profiled() if gpu is None else profile_stages(
            m, store, spec, gpu, [((0, len(spec.layers)), devices)], batch)
        if gpu is None:
            done.skipped.append(f"device {m.device()!r} is not in the GPU catalog: no stage "
                                "records written")
    out.update(device=m.device() if backend == "jax" else device_name(),
               gpu_type=device_gpu_type(m.device()), versions=m.versions(),
               stage_records=done.as_dict()["records"], skipped=done.skipped)
    return out
