"""Atomic training checkpoints: model, optimizer, data position and RNG state.

Reconfiguration is checkpoint -> stop -> relaunch -> resume, so a checkpoint
must be complete (a resumed job continues the *same* loss trajectory) and
atomic (a worker killed half-way through writing must leave the previous
checkpoint intact). Files are written to a temporary name in the same folder,
fsynced and renamed over the old one; ``os.replace`` is atomic on POSIX.

The data position is stored as the number of global samples consumed: the
data stream is keyed by global sample index (see ``torch_nets.batch``), so a
job that resumes on a different worker count reads exactly the samples it
would have read had it never been reconfigured.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from apportion.runtime.workload import ENV_TORCH_WEIGHTS_ONLY

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_DIR_NAME = "checkpoint"  # = workload.CHECKPOINT_DIR_NAME (APPORTION_CHECKPOINT_DIR)


def job_checkpoint(jobdir: str | Path) -> Path:
    """The built-in trainer's checkpoint file inside a job folder (its checkpoint directory)."""
    return Path(jobdir) / CHECKPOINT_DIR_NAME / CHECKPOINT_NAME


@dataclass
class TrainState:
    """Everything a resumed worker needs beyond the config."""

    iteration: int = 0  # iterations completed
    samples_seen: int = 0  # global samples consumed (data-loader position)
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(path: str | Path, state: TrainState) -> None:
    """Write ``state`` atomically to ``path``."""
    payload = {"iteration": state.iteration, "samples_seen": state.samples_seen,
               "model": state.model, "optimizer": state.optimizer, "rng": state.rng,
               "meta": state.meta}
    _atomic_write(Path(path), lambda fh: torch.save(payload, fh))
    log.info("checkpoint at iteration %d written to %s", state.iteration, path)


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be trusted: it is reported, never used."""


def load(path: str | Path) -> TrainState | None:
    """The checkpoint at ``path``, or ``None`` when there is none yet.

    Loaded with ``weights_only=True``: torch's restricted unpickler accepts
    tensors and plain containers only, so a planted or damaged file cannot run
    code. A file that does not load, or does not hold a checkpoint's fields,
    raises :class:`CheckpointError` naming the file; the worker then fails with
    that reason instead of training from a state it cannot trust.
    """
    p = Path(path)
    if not p.exists():
        return None
    try:
        raw = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, EOFError, RuntimeError, ...
        raise CheckpointError(f"{p}: not a loadable checkpoint (refused by the weights-only "
                              f"loader): {type(exc).__name__}: {str(exc)[:300]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict) or not isinstance(
            raw.get("optimizer"), dict):
        raise CheckpointError(f"{p}: not an apportion checkpoint (expected a dict with model "
                              "and optimizer state)")
    try:
        iteration, samples = int(raw["iteration"]), int(raw["samples_seen"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{p}: bad iteration or samples_seen field: {exc}") from None
    if iteration < 0 or samples < 0:
        raise CheckpointError(f"{p}: negative iteration or samples_seen")
    return TrainState(iteration, samples, raw["model"], raw["optimizer"],
                      raw.get("rng", {}) or {}, raw.get("meta", {}) or {})


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write a small JSON file (progress reports)."""
    data = json.dumps(obj, sort_keys=True).encode()
    _atomic_write(Path(path), lambda fh: fh.write(data))


def read_json(path: str | Path) -> Any | None:
    p = Path(path)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:  # cannot happen with atomic writes; be defensive with user files
        return None


# -- checkpoints written by other engines: tensors only, never code ---------------------
# torch reads ENV_TORCH_WEIGHTS_ONLY on every ``torch.load`` and then loads weights only,
# whatever the caller passed: DeepSpeed's checkpoint engines call ``weights_only=False``
_FORCE_PICKLE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
# the plain data classes DeepSpeed pickles into its checkpoints (loss scaler, ZeRO stage,
# fragment addresses): module path and name, imported only where DeepSpeed is installed
DEEPSPEED_SAFE_GLOBALS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def force_weights_only() -> None:
    """Make every ``torch.load`` of this process load tensors and plain containers only.

    A worker's checkpoint folder is predictable and may be writable by others; a
    pickle planted there must never run. Set before any engine loads, and a job's own
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is dropped (torch refuses both at once)."""
    os.environ.pop(_FORCE_PICKLE, None)
    os.environ[ENV_TORCH_WEIGHTS_ONLY] = "1"


def deepspeed_safe_globals() -> list[Any]:
    """DeepSpeed's checkpoint data classes, for torch's weights-only unpickler."""
    import importlib

    found = []
    for module, name in DEEPSPEED_SAFE_GLOBALS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed version: not written by it
            continue
    return found


def deepspeed_tag(ckdir: str | Path) -> str | None:
    """The tag DeepSpeed's ``latest`` file names in ``ckdir``, checked: one plain folder
    name inside ``ckdir`` (a planted ``latest`` cannot point the loader elsewhere), every
    file in it loadable as tensors. ``None`` when there is no checkpoint yet;
    :class:`CheckpointError` naming the file otherwise."""
    ck = Path(ckdir)
    latest = ck / "latest"
    if not latest.exists():
        return None
    if latest.is_symlink() or not latest.is_file():
        raise CheckpointError(f"{latest}: not a regular file")
    tag = latest.read_text(encoding="utf-8", errors="replace").strip()
    if (not tag or len(tag) > 255 or tag in (".", "..") or "/" in tag or "\\" in tag
            or "\0" in tag):
        raise CheckpointError(f"{latest}: names {tag[:80]!r}, not a folder of {ck}")
    folder = ck / tag
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(f"{folder}: the checkpoint {latest} names is not a folder")
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        for f in sorted(folder.iterdir()):
            if f.is_symlink() or not f.is_file():
                raise CheckpointError(f"{f}: not a regular file in a checkpoint")
            try:
                torch.load(f, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - UnpicklingError, EOFError, ...
                raise CheckpointError(f"{f}: not a loadable checkpoint (refused by the "
                                      f"weights-only loader): {type(exc).__name__}: "
                                      f"{str(exc)[:300]}") from None
    return tag


def load_deepspeed(engine: Any, ckdir: str | Path, **kwargs: Any) -> tuple[Any, Any] | None:
    """``engine.load_checkpoint`` that loads tensors only: the tag checked
    (:func:`deepspeed_tag`), every ``torch.load`` of the process forced to weights only
    (DeepSpeed passes ``weights_only=False``), DeepSpeed's data classes allowed. Returns
    what ``load_checkpoint`` returns, or ``None`` when there is no checkpoint yet.
    For apportion's DeepSpeed trainer and users' DeepSpeed scripts alike."""
    tag = deepspeed_tag(ckdir)
    if tag is None:
        return None
    force_weights_only()
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        try:
            return engine.load_checkpoint(str(ckdir), tag=tag, **kwargs)
        except Exception as exc:
            if isinstance(exc, torch.serialization.pickle.UnpicklingError) or \
                    "Weights only load failed" in str(exc):
                raise CheckpointError(f"{Path(ckdir) / tag}: refused by the weights-only "
                                      f"loader: {str(exc)[:300]}") from None
            raise
