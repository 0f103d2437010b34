"""The GPU catalog: opaque type names with the figures estimators need.

The catalog ships as ``apportion/data/gpus.yaml`` (vendor data-sheet values,
sources cited there). GPU types are opaque names everywhere else in apportion;
only estimators read the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from apportion.errors import CatalogError


@dataclass(frozen=True)
class GpuType:
    """One GPU model. TFLOP/s are dense peaks; bandwidths in GB/s."""

    name: str
    architecture: str
    memory_gib: float
    half_tflops: float
    fp32_tflops: float
    hbm_GBps: float
    link: str
    link_GBps: float
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    tf32_tflops: float | None = None
    host_GBps: float = 16.0  # the host (PCIe) link per direction; Gen3 x16 where unknown
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # Kubernetes node-label values for this GPU (GPU Feature Discovery's first), also aliases
    products: tuple[str, ...] = field(default_factory=tuple)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    def peak_flops(self, dtype: str = "half") -> float:
        """Peak dense FLOP/s for ``half`` (bf16/fp16), ``fp32`` or ``tf32``."""
        value = {
            "half": self.half_tflops,
            "bf16": self.bf16_tflops or self.half_tflops,
            "fp16": self.fp16_tflops or self.half_tflops,
            "fp32": self.fp32_tflops,
            "tf32": self.tf32_tflops or self.fp32_tflops,
        }[dtype]
        return float(value) * 1e12


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GpuType]:
    """All shipped GPU types keyed by canonical name."""
    text = resources.files("apportion").joinpath("data/gpus.yaml").read_text()
    out: dict[str, GpuType] = {}
    for row in yaml.safe_load(text)["gpus"]:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases") or ())
        row["products"] = tuple(row.get("products") or ())
        gpu = GpuType(**row)
        out[gpu.name] = gpu
    return out


@lru_cache(maxsize=1)
def _alias_map() -> dict[str, str]:
    out: dict[str, str] = {}
    for gpu in gpu_catalog().values():
        out[gpu.name.lower()] = gpu.name
        for alias in (*gpu.aliases, *gpu.products):
            out[alias.lower()] = gpu.name
    return out


def gpu_product(name: str) -> str:
    """The ``nvidia.com/gpu.product`` value GPU Feature Discovery writes for ``name``."""
    gpu = get_gpu(name)
    return gpu.products[0] if gpu.products else gpu.name


def canonical_gpu_name(name: str) -> str:
    """Canonical catalog name for a name or alias; raises :class:`CatalogError`."""
    key = _alias_map().get(str(name).lower())
    if key is None:
        raise CatalogError("GPU type", name, list(gpu_catalog()))
    return key


def get_gpu(name: str) -> GpuType:
    """Look up a GPU type by name or alias (case-insensitive)."""
    return gpu_catalog()[canonical_gpu_name(name)]
