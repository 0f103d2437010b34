"""Measured stage profiles: what a profiler measured of one stage shard, with its provenance.

Crius's cell estimator scores a cell from two profiles per pipeline stage, the stage run
data-parallel only and tensor-parallel only on its devices (Crius section 4.2). Where those
were measured on the cell's GPU type (``apportion profile``, torch or JAX), the estimator
uses them instead of its analytic FLOPs model; this module holds them.

A record is one stage shard: the model, the GPU type it stands for, the stage's layer range
``[start, end)``, the layout (``dp`` or ``tp``) over ``devices`` devices and the micro-batch,
keyed exactly so in the profile cache (kind :data:`KIND`, one JSON file a record,
:class:`~apportion.estimation.cache.DiskCache`). Its value holds the measurement -- compute
seconds of one micro-batch's forward and backward per device, the bytes a device holds for
the stage's weights, gradients and optimizer state, and the activation bytes one in-flight
micro-batch keeps -- and its provenance: the profiler (``backend``), the device it ran on
as the library names it (``device``), the library versions, the record format and when it
was measured (``measured_at``, seconds since the epoch).

A record is used only when it can be trusted for the cell, and refused by name otherwise
(:meth:`StageProfiles.refusals`), never dropped silently:

* **foreign device**: its device is not the cell's GPU type (a CUDA device's product name
  maps to a catalog type; a CPU stands only for :data:`CPU_STAND_IN`, the type a machine
  without GPUs gives its worker slots, so that profiling "on the machine that runs the job"
  means the same on such a machine);
* **stale**: older than ``APPORTION_PROFILE_MAX_AGE_DAYS`` (default
  :data:`DEFAULT_MAX_AGE_DAYS`), measured in the future, or recorded by another version of a
  library installed here (the profiler's library or apportion) or in another record format;
* **malformed**: a field missing or not a finite non-negative number.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from apportion.estimation.cache import DiskCache, default_cache_dir

from apportion.errors import CatalogError, InputError
from apportion.gpus import canonical_gpu_name

log = logging.getLogger(__name__)

#: the profile cache's kind for measured stage shards
KIND = "stage-profile"
#: the record format this apportion writes and reads (bump when a field changes meaning)
PROFILE_FORMAT = 1
#: the catalog type a machine without GPUs schedules its CPU worker slots as
#: (:func:`apportion.runtime.executors.local.executor.local_cluster`): a CPU profile stands for it
CPU_STAND_IN = "T4"
ENV_MAX_AGE = "APPORTION_PROFILE_MAX_AGE_DAYS"
DEFAULT_MAX_AGE_DAYS = 30.0
#: a record stamped more than this far in the future is refused (clocks of two machines)
FUTURE_SLACK_S = 3600.0
MODES = ("dp", "tp")


def device_gpu_type(device: str) -> str | None:
    """The catalog GPU type a device name stands for: a CUDA product name as torch or
    ``nvidia-smi`` print it ("NVIDIA H100 80GB HBM3" -> ``H100-80GB``), a CPU
    (``cpu``, or JAX's device kind on a CPU) -> :data:`CPU_STAND_IN`; None where the
    catalog has no such GPU."""
    name = (device or "").strip()
    if not name:
        return None
    if name.lower() == "cpu":
        return CPU_STAND_IN
    for cand in (name, name.replace(" ", "-"), name.removeprefix("NVIDIA ")):
        try:
            return canonical_gpu_name(cand)
        except CatalogError:
            continue
    return None


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution (``torch``, ``jax``, ``apportion``), read
    from its metadata without importing it; None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions_of(dists: Sequence[str]) -> dict[str, str]:
    """What a record notes of the libraries its measurement depended on."""
    out = {"apportion": installed_version("apportion") or "unknown"}
    for d in dists:
        out[d] = installed_version(d) or "unknown"
    return out


def max_age_s() -> float:
    """``APPORTION_PROFILE_MAX_AGE_DAYS`` in seconds (default :data:`DEFAULT_MAX_AGE_DAYS`);
    a value that is not a positive number is the user's error, named."""
    raw = os.environ.get(ENV_MAX_AGE)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_AGE_DAYS * 86400.0
    try:
        days = float(raw)
    except ValueError:
        raise InputError(ENV_MAX_AGE, ENV_MAX_AGE, f"{raw!r} is not a number of days") from None
    if not (days > 0 and math.isfinite(days)):
        raise InputError(ENV_MAX_AGE, ENV_MAX_AGE, f"must be a positive number of days, "
                         f"got {raw!r}")
    return days * 86400.0


@dataclass(frozen=True)
class MeasuredStage:
    """One stage shard's measurement, per device: forward and backward seconds of one
    micro-batch, the stage's resident bytes (weights, gradients, optimizer state) and the
    activation bytes one in-flight micro-batch keeps."""

    compute_s: float
    static_bytes: float
    act_bytes: float

    def scaled(self, factor: float) -> MeasuredStage:
        """The same shard on ``factor`` times the micro-batch: compute and activations scale
        linearly with the samples (Morphling's appendix A scales its profiled forward the
        same way), the resident bytes do not."""
        return MeasuredStage(self.compute_s * factor, self.static_bytes,
                             self.act_bytes * factor)


@dataclass(frozen=True)
class StageRecord:
    """A measured stage shard with its key and provenance (see the module docstring)."""

    model: str
    gpu_type: str
    start: int
    end: int
    mode: str
    devices: int
    micro_batch: float
    measured: MeasuredStage
    backend: str
    device: str
    versions: Mapping[str, str] = field(default_factory=dict)
    measured_at: float = 0.0
    format: int = PROFILE_FORMAT
    path: str = ""

    def key(self) -> dict[str, Any]:
        return stage_key(self.model, self.gpu_type, (self.start, self.end), self.mode,
                         self.devices, self.micro_batch)

    def value(self) -> dict[str, Any]:
        return {"compute_s": self.measured.compute_s, "static_bytes": self.measured.static_bytes,
                "act_bytes": self.measured.act_bytes, "backend": self.backend,
                "device": self.device, "gpu_type": self.gpu_type,
                "versions": dict(self.versions), "measured_at": self.measured_at,
                "format": self.format}

    def name(self) -> str:
        """How a refusal names the record: what it profiled and where it lies."""
        where = f" ({self.path})" if self.path else ""
        return (f"{self.backend or 'stage'} profile of {self.model} layers "
                f"[{self.start},{self.end}) {self.mode} x{self.devices} at micro-batch "
                f"{self.micro_batch:g} for {self.gpu_type}{where}")

    def as_dict(self) -> dict[str, Any]:
        return {**self.key(), **self.value(), "path": self.path}


def _mb(micro_batch: float) -> float:
    return float(f"{float(micro_batch):.9g}")


def stage_key(model: str, gpu_type: str, rng: tuple[int, int], mode: str, devices: int,
              micro_batch: float) -> dict[str, Any]:
    """The cache key of a stage shard: model, GPU type, stage split (layer range), layout,
    devices and micro-batch."""
    return {"model": model, "gpu_type": gpu_type, "stage": [int(rng[0]), int(rng[1])],
            "mode": mode, "devices": int(devices), "micro_batch": _mb(micro_batch)}


def _number(value: Mapping[str, Any], name: str) -> float:
    v = value.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"malformed: {name} is {v!r}, not a finite non-negative number")
    return float(v)


def parse_record(data: Any, path: str = "") -> StageRecord:
    """A cache entry (``{"key": ..., "value": ...}``) as a record; ValueError naming the
    field when it is malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict) or \
            not isinstance(data.get("value"), dict):
        raise ValueError("malformed: not a {key, value} entry")
    k, v = data["key"], data["value"]
    stage = k.get("stage")
    if not (isinstance(stage, list) and len(stage) == 2 and all(isinstance(x, int)
                                                                for x in stage)):
        raise ValueError(f"malformed: stage is {stage!r}, not [start, end]")
    if k.get("mode") not in MODES:
        raise ValueError(f"malformed: mode is {k.get('mode')!r}, not dp or tp")
    for name in ("model", "gpu_type"):
        if not isinstance(k.get(name), str) or not k[name]:
            raise ValueError(f"malformed: {name} is {k.get(name)!r}")
    devices = k.get("devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"malformed: devices is {devices!r}")
    versions = v.get("versions", {})
    if not isinstance(versions, dict):
        raise ValueError("malformed: versions is not a mapping")
    fmt = v.get("format")
    if isinstance(fmt, bool) or not isinstance(fmt, int):
        raise ValueError(f"malformed: format is {fmt!r}")
    return StageRecord(
        k["model"], k["gpu_type"], stage[0], stage[1], k["mode"], devices,
        _number(k, "micro_batch"),
        MeasuredStage(_number(v, "compute_s"), _number(v, "static_bytes"),
                      _number(v, "act_bytes")),
        str(v.get("backend", "")), str(v.get("device", "")),
        {str(a): str(b) for a, b in versions.items()}, _number(v, "measured_at"), fmt, path)


def refusal(record: StageRecord, now: float, max_age: float) -> str | None:
    """Why ``record`` may not be used (None: it may): a foreign device, a value that does
    not match its key, another record format or library version, too old, or from the
    future."""
    if record.format != PROFILE_FORMAT:
        return (f"stale: record format {record.format}, this apportion reads "
                f"{PROFILE_FORMAT}")
    mapped = device_gpu_type(record.device)
    if mapped != record.gpu_type:
        what = f"{record.device} ({mapped})" if mapped else f"{record.device or 'no device'}"
        return f"foreign device: measured on {what}, not {record.gpu_type}"
    for dist, recorded in sorted(record.versions.items()):
        have = installed_version(dist)
        if have is not None and have != recorded:
            return f"stale: measured with {dist} {recorded}, this machine has {dist} {have}"
    age = now - record.measured_at
    if age < -FUTURE_SLACK_S:
        return f"stale: measured_at lies {-age / 3600:.1f} h in the future"
    if age > max_age:
        return (f"stale: measured {age / 86400:.1f} days ago, older than "
                f"{max_age / 86400:g} days ({ENV_MAX_AGE})")
    return None


@dataclass(frozen=True)
class Hit:
    """A usable measurement for one stage shard: the record, and the factor its
    micro-batch was scaled by (1: measured at exactly this micro-batch)."""

    record: StageRecord
    stage: MeasuredStage
    scale: float

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.record.measured_at)


class StageProfiles:
    """The measured stage shards of a profile cache folder (``root/stage-profile/``), read
    once and again whenever the folder changes; see the module docstring for what is
    refused. ``now`` and ``max_age`` are fixed for tests (default: the clock at each read,
    ``APPORTION_PROFILE_MAX_AGE_DAYS``)."""

    def __init__(self, root: str | Path | None = None, now: float | None = None,
                 max_age: float | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.now = now
        self.max_age = max_age
        self._stamp: tuple[int, int, int] | None = None
        self._usable: dict[tuple[Any, ...], list[StageRecord]] = {}
        self._refused: list[tuple[StageRecord | None, str, str]] = []

    # -- reading -----------------------------------------------------------------------
    def clock(self) -> float:
        return time.time() if self.now is None else self.now

    def _folder(self) -> Path:
        return self.root / KIND

    def stamp(self) -> tuple[int, int, int]:
        """What changes when a record is written, replaced or removed (the folder's
        modification time: every write renames a file into it), and every hour (a record
        ages out while a service runs) -- one ``stat``, cheap enough for every memoised
        estimate to check: estimates of an older stamp are stale."""
        hour = int(self.clock() // 3600)
        try:
            st = self._folder().stat()
        except OSError:
            return (0, 0, hour)
        return (st.st_mtime_ns, st.st_ino, hour)

    def _load(self) -> None:
        stamp = self.stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        self._usable, self._refused = {}, []
        now, limit = self.clock(), self.max_age if self.max_age is not None else max_age_s()
        try:
            paths = sorted(self._folder().glob("*.json"))
        except OSError:
            paths = []
        for p in paths:
            try:
                data = json.loads(p.read_text())
                rec = parse_record(data, str(p))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                self._refused.append((None, str(p), f"malformed: unreadable ({exc})"))
                continue
            except ValueError as exc:
                self._refused.append((None, str(p), str(exc)))
                continue
            why = refusal(rec, now, limit)
            if why is not None:
                self._refused.append((rec, rec.name(), why))
                continue
            key = (rec.model, rec.gpu_type, rec.start, rec.end, rec.mode, rec.devices)
            self._usable.setdefault(key, []).append(rec)

    def records(self, model: str | None = None, gpu_type: str | None = None
                ) -> list[StageRecord]:
        """The usable records (of ``model`` and ``gpu_type`` where given)."""
        self._load()
        return [r for rs in self._usable.values() for r in rs
                if (model is None or r.model == model) and
                (gpu_type is None or r.gpu_type == gpu_type)]

    def refusals(self, model: str | None = None, gpu_type: str | None = None) -> list[str]:
        """``"<record>: <why>"`` for every record refused (of ``model`` and ``gpu_type``
        where given; an unreadable file names only its path and is always listed)."""
        self._load()
        return [f"{name}: {why}" for rec, name, why in self._refused
                if rec is None or ((model is None or rec.model == model) and
                                   (gpu_type is None or rec.gpu_type == gpu_type))]

    def has(self, model: str) -> bool:
        """Whether any usable record of ``model`` exists (any GPU type)."""
        return bool(self.records(model))

    def lookup(self, model: str, gpu_type: str, rng: tuple[int, int], mode: str, devices: int,
               micro_batch: float) -> Hit | None:
        """The measurement of this stage shard: a record of exactly this shard, else the
        nearest one (in log scale of the samples a device runs) of the same layout scaled
        linearly to it; None when no usable record exists. A DP shard is matched on the
        samples per device (a device of a DP stage runs the same work whatever the replica
        count); a TP shard on its width and micro-batch."""
        self._load()
        if micro_batch <= 0 or devices < 1:
            return None
        a, b = int(rng[0]), int(rng[1])
        if mode == "dp":  # a DP shard's device runs its share alone: any replica count serves
            recs = [r for (m, g, s, e, md, _), rs in self._usable.items()
                    if (m, g, s, e, md) == (model, gpu_type, a, b, "dp") for r in rs]
        else:
            recs = self._usable.get((model, gpu_type, a, b, mode, int(devices)), [])
        if not recs:
            return None
        want = micro_batch / (devices if mode == "dp" else 1)

        def share(r: StageRecord) -> float:
            return r.micro_batch / (r.devices if mode == "dp" else 1)

        best = min(recs, key=lambda r: (abs(math.log(max(share(r), 1e-12) / want)),
                                        -r.measured_at))
        scale = want / share(best)
        if abs(scale - 1.0) < 1e-9:
            return Hit(best, best.measured, 1.0)
        return Hit(best, best.measured.scaled(scale), scale)

    # -- writing -----------------------------------------------------------------------
    def put(self, record: StageRecord) -> Path:
        """Store a record (atomically; an unwritable cache is a warning, see
        :class:`~apportion.estimation.cache.DiskCache`)."""
        path = DiskCache(self.root).put(KIND, record.key(), record.value())
        self._stamp = None
        return path
