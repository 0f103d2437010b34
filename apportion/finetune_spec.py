"""Input schemas for fine-tuning workloads (YMIR): submissions and `solve-finetune` task files.

Two formats live here, both validated with pydantic and both reported through
:class:`~apportion.errors.InputError` naming the file and the field:

* the **submission** a user writes for one fine-tuning workload (the paper's
  figure-14 YAML template): backbone model, dataset path, batch size, learning
  rate, whether the task accepts parameter sharing (merging / transfer), the
  target metric and value, and the GPUs requested;
* the **task file** of ``apportion solve-finetune``: a ``tasks`` list (``id``,
  ``epochs``, ``epoch_time_1gpu``, ``max_gpus``, optional ``data``: the path of
  the task's samples, relative to the task file, which ``--gains auto`` embeds
  with the Task2Vec probe) and an optional ``gains`` mapping (``temporal:
  {"A->B": g}``, ``spatial: {"A||B": g}``).

Numbers of the task file are turned into exact :class:`fractions.Fraction`
values (through their decimal text, so ``0.3`` is 3/10) because the table-9
examples must come out exact; the solver works on these fractions.

This is a core module: it imports nothing from the five areas.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from apportion.config import field_path, read_yaml
from apportion.errors import InputError

log = logging.getLogger(__name__)

TEMPORAL_SEP = "->"
SPATIAL_SEP = "||"


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    """``('tasks', 1, 'max_gpus')`` -> ``tasks[1].max_gpus`` (the field naming users read)."""
    name = field_path(loc)
    return "<root>" if name == "(top level)" else name


def _raise_from_validation(source: str, exc: ValidationError, prefix: str = "") -> None:
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    name = _loc_to_field(loc)
    if prefix:
        name = prefix + ("" if name.startswith("[") else ".") + name if name != "<root>" else prefix
    raise InputError(source, name, err.get("msg", "invalid value")) from None


def _read_yaml(path: str | Path) -> Any:
    """The shared bounded, duplicate-key-refusing YAML reader (apportion.config)."""
    return read_yaml(path)


# --------------------------------------------------------------------------- task file
class _TaskRow(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    id: str = Field(min_length=1)
    epochs: float = Field(gt=0)
    epoch_time_1gpu: float = Field(gt=0)
    max_gpus: int = Field(ge=1)
    data: str | None = Field(default=None, min_length=1)  # samples for --gains auto

    @field_validator("id", mode="before")
    @classmethod
    def _id_is_text(cls, v: Any) -> Any:
        if not isinstance(v, (str, int)) or isinstance(v, bool):
            raise ValueError("must be a string")  # noqa: TRY004 - pydantic reports ValueError only
        text = str(v)
        if TEMPORAL_SEP in text or SPATIAL_SEP in text:
            raise ValueError(f"must not contain {TEMPORAL_SEP!r} or {SPATIAL_SEP!r}")
        return text

    @field_validator("epochs", "epoch_time_1gpu", mode="before")
    @classmethod
    def _finite_number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("must be a number")  # noqa: TRY004 - pydantic reports ValueError only
        if not math.isfinite(float(v)):
            raise ValueError("must be finite")
        return v

    @field_validator("max_gpus", mode="before")
    @classmethod
    def _int_only(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be an integer")  # noqa: TRY004 - pydantic reports ValueError only
        return v


class _TaskFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[_TaskRow] = Field(min_length=1)
    gains: dict[str, dict[str, float]] = Field(default_factory=dict)


@dataclass(frozen=True)
class FinetuneTask:
    """One task of a `solve-finetune` file, in exact arithmetic."""

    id: str
    epochs: Fraction
    epoch_time_1gpu: Fraction  # time units per epoch on one GPU
    max_gpus: int
    data: str | None = None  # the task's samples (``--gains auto``), as written in the file

    @property
    def work(self) -> Fraction:
        """GPU-time units of normal fine-tuning (epochs x one-GPU epoch time)."""
        return self.epochs * self.epoch_time_1gpu


@dataclass
class FinetuneProblem:
    """Tasks plus pairwise transfer gains: the input of the mode/resource formulation.

    ``temporal[(a, b)]`` is the fraction of b's epochs saved when b starts from a's
    weights; ``spatial[frozenset({a, b})]`` the fraction of epochs saved by merging.
    """

    tasks: list[FinetuneTask]
    temporal: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    spatial: dict[frozenset[str], Fraction] = field(default_factory=dict)
    source: str = "<memory>"

    def task(self, task_id: str) -> FinetuneTask:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.tasks]

    def data_path(self, task: FinetuneTask) -> Path | None:
        """Where ``task``'s samples are: its ``data`` field, relative to the task file."""
        if task.data is None:
            return None
        p = Path(task.data).expanduser()
        if p.is_absolute() or self.source.startswith("<"):
            return p
        return Path(self.source).parent / p


def _exact(value: float | str | Fraction) -> Fraction:
    """Decimal-exact fraction: 0.3 -> 3/10 (not the binary float's 5404319552844595/2**54)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    return Fraction(repr(float(value))) if not isinstance(value, str) else Fraction(value)


def parse_finetune_problem(data: Any, source: str = "<memory>") -> FinetuneProblem:
    """Validate a task-file mapping (already parsed YAML) into a :class:`FinetuneProblem`."""
    if not isinstance(data, dict):
        raise InputError(source, "<root>", "must be a mapping with a 'tasks' list")
    try:
        spec = _TaskFile.model_validate(data)
    except ValidationError as exc:
        _raise_from_validation(source, exc)
        raise  # unreachable; keeps type checkers calm
    ids: list[str] = []
    for i, row in enumerate(spec.tasks):
        if row.id in ids:
            raise InputError(source, f"tasks[{i}].id", f"duplicate task id {row.id!r}")
        ids.append(row.id)
    tasks = [FinetuneTask(r.id, _exact(r.epochs), _exact(r.epoch_time_1gpu), r.max_gpus, r.data)
             for r in spec.tasks]
    temporal: dict[tuple[str, str], Fraction] = {}
    spatial: dict[frozenset[str], Fraction] = {}
    for kind, table in spec.gains.items():
        if kind not in ("temporal", "spatial"):
            raise InputError(source, f"gains.{kind}", "unknown gain kind; use 'temporal' or 'spatial'")
        sep = TEMPORAL_SEP if kind == "temporal" else SPATIAL_SEP
        for key, value in table.items():
            fname = f"gains.{kind}.{key}"
            parts = [p.strip() for p in str(key).split(sep)]
            if len(parts) != 2 or not all(parts):
                raise InputError(source, fname, f"key must look like 'A{sep}B'")
            a, b = parts
            for p in (a, b):
                if p not in ids:
                    raise InputError(source, fname, f"unknown task id {p!r}")
            if a == b:
                raise InputError(source, fname, "a task cannot transfer to itself")
            if not math.isfinite(float(value)) or not -1.0 <= float(value) < 1.0:
                raise InputError(source, fname, "gain must be a fraction in [-1, 1)")
            g = _exact(value)
            if kind == "temporal":
                temporal[(a, b)] = g
            else:
                pair = frozenset((a, b))
                if pair in spatial:
                    raise InputError(source, fname, "pair given twice")
                spatial[pair] = g
    return FinetuneProblem(tasks, temporal, spatial, source)


def load_finetune_problem(path: str | Path) -> FinetuneProblem:
    """Read and validate a `solve-finetune` task file."""
    return parse_finetune_problem(_read_yaml(path), str(path))


def problem_from_lists(
    tasks: list[tuple[str, float, float, int]],
    temporal: dict[str, float] | None = None,
    spatial: dict[str, float] | None = None,
) -> FinetuneProblem:
    """Convenience builder (tests, experiments): ``[(id, epochs, epoch_time, max_gpus)]``."""
    data: dict[str, Any] = {
        "tasks": [
            {"id": i, "epochs": e, "epoch_time_1gpu": t, "max_gpus": m} for i, e, t, m in tasks
        ],
        "gains": {},
    }
    if temporal:
        data["gains"]["temporal"] = dict(temporal)
    if spatial:
        data["gains"]["spatial"] = dict(spatial)
    return parse_finetune_problem(data)


# --------------------------------------------------------------------------- submission
class TargetSpec(BaseModel):
    """The stopping criterion: a validation metric and the value to reach."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(min_length=1)  # accuracy, f1, pearson, bleu, ...
    value: float
    higher_is_better: bool = True


class FinetuneSubmission(BaseModel):
    """One fine-tuning workload as a user submits it (the paper's figure-14 template)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)  # the foundation-model backbone, e.g. roberta-base
    dataset: str = Field(min_length=1)  # path of the fine-tuning dataset
    batch_size: int = Field(ge=1)
    learning_rate: float = Field(gt=0, lt=1)
    accept_sharing: bool = False  # may be merged with / transferred from sibling tasks
    target: TargetSpec
    gpus: int = Field(default=1, ge=1)  # requested GPUs
    max_epochs: float = Field(default=10, gt=0)
    petl: str = "full"  # full fine-tuning, or adapter / lora / prompt (unified PETL)
    submit_time: float = Field(default=0.0, ge=0)

    @field_validator("target")
    @classmethod
    def _metric_range(cls, v: TargetSpec) -> TargetSpec:
        if not math.isfinite(v.value):
            raise ValueError("target value must be finite")
        return v

    @property
    def backbone(self) -> str:
        return self.model.split("@")[0]

    @property
    def task(self) -> str:
        return Path(self.dataset).name or self.dataset


def parse_submissions(data: Any, source: str = "<memory>") -> list[FinetuneSubmission]:
    """One workload mapping, or ``{workloads: [...]}``; names must be unique."""
    if isinstance(data, dict) and "workloads" in data:
        rows = data["workloads"]
        if not isinstance(rows, list) or not rows:
            raise InputError(source, "workloads", "must be a non-empty list")
        prefix = "workloads"
    elif isinstance(data, dict):
        rows, prefix = [data], ""
    else:
        raise InputError(source, "<root>", "must be a workload mapping or {workloads: [...]}")
    out: list[FinetuneSubmission] = []
    for i, row in enumerate(rows):
        where = f"{prefix}[{i}]" if prefix else ""
        if not isinstance(row, dict):
            raise InputError(source, where or "<root>", "must be a mapping")
        try:
            sub = FinetuneSubmission.model_validate(row)
        except ValidationError as exc:
            _raise_from_validation(source, exc, where)
            raise
        if any(s.name == sub.name for s in out):
            raise InputError(source, f"{where}.name" if where else "name",
                             f"duplicate workload name {sub.name!r}")
        out.append(sub)
    return out


def load_submissions(path: str | Path) -> list[FinetuneSubmission]:
    """Read and validate a submission YAML (one workload or a ``workloads`` list)."""
    return parse_submissions(_read_yaml(path), str(path))
