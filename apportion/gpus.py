"""The GPU catalog: opaque type names with the figures estimators need.

The catalog ships as ``apportion/data/gpus.yaml`` (vendor data-sheet values,
sources cited there). GPU types are opaque names everywhere else in apportion;
only estimators read the figures.

Every entry accepts its name, its ``aliases``, the ``products`` Kubernetes nodes
carry (GPU Feature Discovery's ``nvidia.com/gpu.product``, GKE's and AMD's labels),
the ``slurm`` GRES types sites use and the ``ray`` accelerator types, each
case-insensitively and in its normalised form (:func:`normalise_gpu_name`), and
no name belongs to two entries. SXM, PCIe and NVL boards of a chip are separate
entries; a name several parts share (Ray's ``H100``) is taken as one and listed in
:func:`ambiguity`, so importers can say which others it may be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from apportion.errors import CatalogError
from apportion.inputs import parse_shipped_yaml


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
    form_factor: str = ""  # SXM4, SXM5, PCIe, PCIe (NVL), OAM, superchip, ...
    interconnect: str = ""  # what `link` is: NVLink 4 (NVSwitch), PCIe Gen5 x16, ...
    vendor: str = "NVIDIA"
    slurm: tuple[str, ...] = field(default_factory=tuple)  # GRES types, also aliases
    ray: tuple[str, ...] = field(default_factory=tuple)  # Ray accelerator types, also aliases

    def names(self) -> dict[str, tuple[str, ...]]:
        """Every name this entry accepts, by kind (what ``apportion gpus --aliases`` lists)."""
        return {"aliases": self.aliases, "products": self.products, "slurm": self.slurm,
                "ray": self.ray}

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


_VENDOR = re.compile(r"^(nvidia|tesla|nv|amd)[-_ ]+", re.IGNORECASE)
_LISTS = ("aliases", "products", "slurm", "ray")


def normalise_gpu_name(raw: str) -> str:
    """A GPU name's lookup key: lower case, ``_`` and blanks as ``-``, vendor prefixes
    dropped (``NVIDIA A100-SXM4-80GB``, ``nvidia_a100-sxm4-80gb`` -> ``a100-sxm4-80gb``)."""
    key = re.sub(r"[\s_]+", "-", str(raw).strip().lower())
    while True:
        new = _VENDOR.sub("", key)
        if new == key:
            return key
        key = new


def _read() -> dict:
    return parse_shipped_yaml(
        resources.files("apportion").joinpath("data/gpus.yaml").read_text())


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GpuType]:
    """All shipped GPU types keyed by canonical name."""
    out: dict[str, GpuType] = {}
    for row in _read()["gpus"]:
        row = dict(row)
        for k in _LISTS:
            row[k] = tuple(row.get(k) or ())
        gpu = GpuType(**row)
        out[gpu.name] = gpu
    return out


@lru_cache(maxsize=1)
def _alias_map() -> tuple[dict[str, str], dict[str, str]]:
    """Every accepted name in lower case -> canonical name (a name two entries share is an
    error in the data file), and the normalised forms that name one entry only."""
    exact: dict[str, str] = {}
    loose: dict[str, str | None] = {}
    for gpu in gpu_catalog().values():
        for alias in (gpu.name, *gpu.aliases, *gpu.products, *gpu.slurm, *gpu.ray):
            if exact.setdefault(alias.lower(), gpu.name) != gpu.name:
                raise ValueError(f"gpus.yaml: {alias!r} names both {exact[alias.lower()]} and "
                                 f"{gpu.name}")
            key = normalise_gpu_name(alias)
            if loose.setdefault(key, gpu.name) != gpu.name:
                loose[key] = None  # two entries' names normalise alike: neither by this key
    return exact, {k: v for k, v in loose.items() if v is not None}


@lru_cache(maxsize=1)
def _ambiguous() -> dict[str, dict[str, object]]:
    out = {}
    for row in _read().get("ambiguous") or []:
        for key in {row["name"].lower(), normalise_gpu_name(row["name"])}:
            out[key] = {"name": row["name"], "taken_as": row["taken_as"],
                        "also": tuple(row["also"]), "why": row["why"]}
    return out


def ambiguous_names() -> list[dict[str, object]]:
    """The names several parts share, as the data file lists them."""
    return [{"name": r["name"], "taken_as": r["taken_as"], "also": list(r["also"]),
             "why": r["why"]} for r in _read().get("ambiguous") or []]


def ambiguity(name: str) -> dict[str, object] | None:
    """For a name several parts share (Ray's ``H100``): the entry it is taken as, the others
    it may be and why; None for a name that says which part it is."""
    lower = str(name).lower()
    if lower in _ambiguous():
        return _ambiguous()[lower]
    if lower in _alias_map()[0]:  # an exact name of one entry (GKE's nvidia-tesla-v100)
        return None
    return _ambiguous().get(normalise_gpu_name(name))


def gpu_product(name: str) -> str:
    """The ``nvidia.com/gpu.product`` value GPU Feature Discovery writes for ``name``."""
    gpu = get_gpu(name)
    return gpu.products[0] if gpu.products else gpu.name


def canonical_gpu_name(name: str) -> str:
    """Canonical catalog name for a name or alias; raises :class:`CatalogError`.

    Memoised (the catalog is fixed for the process): a round looks names up once per
    estimate, thousands of times with a handful of names."""
    global _CANONICAL
    maps = _alias_map()
    if _CANONICAL[0] is not maps:  # the catalog was read again (a test's, a plug-in's)
        _CANONICAL = (maps, {})
    if not isinstance(name, str):  # a wrong type from a file: the lookup's own message
        return _canonical(name, maps)
    memo = _CANONICAL[1]
    hit = memo.get(name)
    if hit is None:
        hit = memo[name] = _canonical(name, maps)
    return hit


#: (the alias maps the memo was made from, name -> canonical name)
_CANONICAL: tuple[object, dict[str, str]] = (None, {})


def _canonical(name: str, maps: tuple[dict[str, str], dict[str, str]]) -> str:
    exact, loose = maps
    norm = normalise_gpu_name(name)
    key = exact.get(str(name).lower()) or exact.get(norm) or loose.get(norm)
    if key is None:
        raise CatalogError("GPU type", name, list(gpu_catalog()))
    return key


def get_gpu(name: str) -> GpuType:
    """Look up a GPU type by name or alias (case-insensitive)."""
    return gpu_catalog()[canonical_gpu_name(name)]
