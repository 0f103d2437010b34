"""Input schemas (pydantic) for cluster and jobs YAML, with errors that name the field.

Every loader raises :class:`apportion.errors.InputError` naming the file, the
field path (``jobs[3].requested_gpus``) and what is wrong; nothing else may
escape to the user. The field names here are a contract (see README).

A queue comes in two formats with the same fields (docs/formats.md): the jobs YAML,
read whole (4 MB unless ``--max-input-bytes`` says more), and **JSON lines** for large
queues, read a line at a time (:func:`load_queue`): one job a line, each validated as
it is read, an optional first line declaring the format, the count and the clock.
Why a second format: PyYAML, even libyaml's parser, took 36 s for a 100,000-job queue
(15 MB) and writing it 83 s, where a line of JSON is a C call; and a streamed file is
bounded per line and by what its header declares, so its size limit can follow the
queue (:data:`JOBS_LINES_BYTES_PER_JOB` a declared job) without ever holding the whole
text. A header that declares N jobs is refused unless exactly N follow, so a truncated
copy of a queue is refused rather than half scheduled.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from apportion.cluster import Cluster, NodeGroup
from apportion.errors import CatalogError, InputError
from apportion.gpus import canonical_gpu_name
from apportion.inputs import (  # noqa: F401 (the one reader, re-exported for its callers)
    MAX_FILE_BYTES,
    check_input_file,
    iter_lines,
    parse_json_line,
    parse_shipped_yaml,
    parse_yaml_text,
    read_head,
    read_text,
    read_yaml,
)
from apportion.jobs import JobSpec, RunningState, Workload, control_characters
from apportion.memory_guard import check_input_fits
from apportion.models import get_model

MAX_COUNT = 1_000_000


def _gpu_name(v: str) -> str:
    """A catalog GPU name or alias, canonicalised; an unknown one names the known ones."""
    try:
        return canonical_gpu_name(v)
    except CatalogError as exc:
        raise ValueError(str(exc)) from None


GpuName = Annotated[str, AfterValidator(_gpu_name)]


def _finite(v: float | None) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


#: a queue's clock: seconds, finite and not negative
Clock = Annotated[float | None, Field(default=None, ge=0), AfterValidator(_finite)]


class _Strict(BaseModel):
    # strict: YAML gives real ints and bools; "4", true or 2.0 for a count is a mistake
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True)


NODE_NAME = r"^[A-Za-z0-9_.\-]+$"
# [label key "="] label value (Kubernetes label syntax: value <= 63 characters)
NODE_LABEL = (r"^(([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?=)?"
              r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"


class NodeGroupSpec(_Strict):
    prefix: str = Field(min_length=1, max_length=128, pattern=NODE_NAME)
    count: int | None = Field(default=None, gt=0, le=100_000)
    # real host names (an imported cluster); count may then be left out
    nodes: list[Annotated[str, Field(min_length=1, max_length=253, pattern=NODE_NAME)]] | None = \
        Field(default=None, min_length=1, max_length=100_000)
    gpu_type: GpuName
    gpus_per_node: int = Field(gt=0, le=64)
    cpus_per_node: int = Field(default=32, gt=0, le=100_000)
    host_memory_gib: float = Field(default=256.0, gt=0, le=1e7)
    intra_node_link: Literal["nvlink", "pcie"] = "nvlink"
    intra_node_bandwidth_GBps: float | None = Field(default=None, gt=0, le=1e5)
    inter_node_bandwidth_GBps: float = Field(default=25.0, gt=0, le=1e5)
    # the device memory a job may use on each GPU when less than the catalog's (a MIG slice,
    # a shared GPU); None: the catalog's
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=1e5)
    # the Kubernetes node label that selects this group's GPUs: a value of
    # nvidia.com/gpu.product (GPU Feature Discovery), or KEY=VALUE for another label
    gpu_product_label: str | None = Field(default=None, max_length=317, pattern=NODE_LABEL)
    # engine annotations kept by `apportion cluster import` (raw GPU name, Slurm partitions,
    # the Kubernetes GPU product label, ...); the solver ignores them, executors may read them
    labels: dict[Annotated[str, Field(pattern=LABEL_KEY, max_length=128)],
                 Annotated[str, Field(max_length=1024, pattern=r"^[^\x00-\x1f\x7f]*$")]] = \
        Field(default_factory=dict)


class ClusterSpec(_Strict):
    name: str = Field(default="cluster", min_length=1, max_length=256)
    node_groups: list[NodeGroupSpec] = Field(min_length=1)

    @field_validator("node_groups")
    @classmethod
    def _unique_prefixes(cls, groups: list[NodeGroupSpec]) -> list[NodeGroupSpec]:
        seen: set[str] = set()
        names: set[str] = set()
        for i, g in enumerate(groups):
            if g.prefix in seen:
                raise ValueError(f"duplicate node group prefix {g.prefix!r}")
            seen.add(g.prefix)
            if g.nodes is None and g.count is None:
                raise ValueError(f"node_groups[{i}].count: required (or list the group's nodes)")
            if g.nodes is not None and g.count is not None and g.count != len(g.nodes):
                raise ValueError(f"node_groups[{i}].count: {g.count} but {len(g.nodes)} nodes "
                                 "are listed")
            for name in g.nodes or [f"{g.prefix}-{k}" for k in range(g.count or 0)]:
                if name in names:
                    raise ValueError(f"node_groups[{i}].nodes: node name {name!r} is used twice")
                names.add(name)
        return groups


class RunningSpec(_Strict):
    gpu_type: GpuName
    gpus: int = Field(gt=0, le=MAX_COUNT)
    stages: int = Field(default=1, gt=0, le=MAX_COUNT)
    placement: dict[str, int] = Field(default_factory=dict)
    tp: int = Field(default=1, gt=0, le=MAX_COUNT)

    @field_validator("placement")
    @classmethod
    def _positive_counts(cls, v: dict[str, int]) -> dict[str, int]:
        for node, k in v.items():
            if not 0 < k <= MAX_COUNT:
                raise ValueError(f"node {node!r}: GPU count {k} must be in 1..{MAX_COUNT}")
        return v

    @model_validator(mode="after")
    def _placement_holds_the_gpus(self) -> RunningSpec:
        placed = sum(self.placement.values())
        if placed != self.gpus:
            raise ValueError(f"<placement> places {placed} GPUs but gpus is {self.gpus}; a "
                             "running job's placement must list where each of its GPUs is")
        return self


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# OCI image reference characters: name components, "/", ":" tag, "@sha256:" digest
IMAGE_REF = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"


class TrainSpec(_Strict):
    """The built-in trainer's optimiser settings (``workload.train``); defaults: AdamW, 1e-3."""

    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(default=1e-3, gt=0, le=10)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    momentum: float = Field(default=0.0, ge=0, lt=1)  # sgd only
    warmup_iterations: int = Field(default=0, ge=0, le=10**9)
    grad_clip: float = Field(default=0.0, ge=0, le=1e6)  # 0: none

    @field_validator("lr", "weight_decay", "momentum", "grad_clip", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError("must be a finite number")
        return float(v)


class WorkloadSpec(_Strict):
    kind: Literal["builtin", "torchrun", "deepspeed", "jax"] = "builtin"  # = WORKLOAD_KINDS
    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=1024)
    workdir: str | None = Field(default=None, min_length=1, max_length=4096)
    env: dict[Annotated[str, Field(pattern=ENV_NAME, max_length=256)],
              Annotated[str, Field(max_length=65536)]] = Field(default_factory=dict)
    # a container image reference (registry/name:tag@digest): exported into manifests as
    # is, so no spaces, quotes or shell characters
    image: str | None = Field(default=None, min_length=1, max_length=1024, pattern=IMAGE_REF)
    # periodic checkpoints (either, whichever comes first; 0 turns one off); default: the run's
    checkpoint_every: int | None = Field(default=None, ge=0, le=10**12)
    checkpoint_interval_s: float | None = Field(default=None, ge=0, le=10**7)
    train: TrainSpec | None = None  # the built-in trainers' optimiser (no command only)

    @field_validator("checkpoint_interval_s", mode="before")
    @classmethod
    def _seconds(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v)):
            raise ValueError("must be a finite number of seconds")
        return None if v is None else float(v)

    @field_validator("command", "workdir", "env", "image")
    @classmethod
    def _printable(cls, v: Any) -> Any:
        texts = (v if isinstance(v, list) else [v] if isinstance(v, str)
                 else list(v) + list(v.values()) if isinstance(v, dict) else [])
        for t in texts:
            bad = [c for c in control_characters(t) if c not in ("U+0009", "U+000A")]
            if bad or "\0" in t:
                raise ValueError(f"contains control characters ({', '.join(bad) or 'U+0000'})")
        return v

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in v if k in RESERVED_ENV or k.startswith("APPORTION_"))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: set by apportion for every rank; a "
                             "workload cannot override it")
        return v

    def to_workload(self) -> Workload:
        return Workload(self.kind, tuple(self.command or ()), self.workdir, dict(self.env),
                        self.image, self.checkpoint_every, self.checkpoint_interval_s,
                        self.train.model_dump() if self.train is not None else {})


class CustomModelSpec(_Strict):
    """An inline model (not in the catalog): what the estimators need, in four numbers."""

    name: str = Field(default="custom", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    family: Literal["gpt", "bert", "llama"] = "gpt"
    layers: int = Field(gt=0, le=10_000)
    hidden_size: int = Field(ge=8, le=1_000_000)
    sequence_length: int = Field(gt=0, le=10_000_000)
    parameters: int = Field(gt=0, le=10**15)
    heads: int | None = Field(default=None, gt=0, le=100_000)

    @field_validator("parameters", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        """A whole number however it is written: YAML reads ``1.3e+9`` as a float and
        ``1.3e9`` (no exponent sign) as text; both mean 1,300,000,000."""
        if isinstance(v, str):
            try:
                v = float(v.strip().replace("_", ""))
            except ValueError:
                return v  # pydantic names the field and the value
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            return int(v)
        return v

    def catalog_name(self) -> str:
        from apportion.models import custom_model_name

        return custom_model_name(self.name, self.family, self.layers, self.hidden_size,
                                 self.sequence_length, self.parameters, self.heads)


class MeasuredModelSpec(_Strict):
    """A model known only by its measurements (``model: {measured: my-resnet}``): the
    catalog lacks it and no estimator can describe it, so it is scheduled from the rates
    the round's rate source gives it (``--estimator tables`` rows for ``my-resnet``), its
    data-parallel plan, as the baselines schedule every job. Written out so that a
    misspelt catalog name is still refused here, naming the catalog."""

    measured: str = Field(min_length=1, max_length=256)

    def catalog_name(self) -> str:
        return self.measured


def _model_tag(v: Any) -> str:
    if isinstance(v, dict):
        return "#measured" if "measured" in v else "#spec"
    return "#name"


# a catalog name, an inline spec, or a measured-only model; errors name the spec's own
# fields ("#" tags are dropped)
ModelField = Annotated[Annotated[str, Tag("#name")] | Annotated[CustomModelSpec, Tag("#spec")]
                       | Annotated[MeasuredModelSpec, Tag("#measured")],
                       Discriminator(_model_tag)]


# torchrun's variables and apportion's, given to every rank (issue contract)
RESERVED_ENV = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT"})


class JobEntry(_Strict):
    id: str = Field(min_length=1, max_length=256)
    model: ModelField  # a catalog name, an inline spec, or {measured: name}
    global_batch_size: int = Field(gt=0, le=MAX_COUNT)
    iterations: int = Field(gt=0, le=10**12)
    requested_gpus: int = Field(gt=0, le=MAX_COUNT)
    requested_gpu_type: GpuName | None = None
    submit_time_s: float = Field(default=0.0, ge=0)
    tenant: str = Field(default="default", min_length=1, max_length=256)
    guaranteed: bool = False
    deadline_s: float | None = Field(default=None, gt=0)
    backbone: str | None = Field(default=None, min_length=1, max_length=256)
    task: str | None = Field(default=None, min_length=1, max_length=256)
    accepts_sharing: bool = False
    iterations_done: int = Field(default=0, ge=0, le=10**12)
    running: RunningSpec | None = None
    admitted: bool = False
    workload: WorkloadSpec | None = None
    # elasticity (formulations/counts.py): the most GPUs it may be given, and whether it may
    # be given any other count than its request at all (default: it may)
    max_gpus: int | None = Field(default=None, gt=0, le=MAX_COUNT)
    elastic: bool = True
    # the global batches the scheduler may run it at, [smallest, largest] (its batch is then
    # a decision: Pollux's goodput); its iterations stay counted at global_batch_size
    batch_range: list[int] | None = None
    # its gradient statistics, [grad_sqr, grad_var per sample], where known before it runs
    grad_stats: list[float] | None = None

    @field_validator("batch_range")
    @classmethod
    def _range(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or not 0 < v[0] <= v[1] <= MAX_COUNT):
            raise ValueError(f"must be [smallest, largest] with 0 < smallest <= largest <= "
                             f"{MAX_COUNT}, got {list(v)}")
        return v

    @field_validator("grad_stats")
    @classmethod
    def _stats(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) != 2 or not all(math.isfinite(x) and x >= 0 for x in v)):
            raise ValueError(f"must be [grad_sqr, grad_var], finite and non-negative, got "
                             f"{list(v)}")
        return v

    @field_validator("workload")
    @classmethod
    def _complete_workload(cls, v: WorkloadSpec | None) -> WorkloadSpec | None:
        # deepspeed / jax without a command run apportion's own DeepSpeed / JAX trainer
        if v is not None and v.kind == "torchrun" and not v.command:
            raise ValueError(f"command: kind {v.kind!r} needs a command (a list of strings)")
        if v is not None and v.kind == "builtin" and v.command:
            raise ValueError("command: kind 'builtin' runs apportion's trainer; a command needs "
                             "kind torchrun, deepspeed or jax")
        if v is not None and v.command and v.train is not None:
            raise ValueError("train: sets the built-in trainers' optimiser; a user command sets "
                             "its own (pass settings through env)")
        return v

    @field_validator("id", "tenant", "backbone", "task", mode="before")
    @classmethod
    def _nfc(cls, v: Any) -> Any:
        """One spelling per name: NFC and NFD forms of ``é`` are one id, not two jobs."""
        return unicodedata.normalize("NFC", v) if isinstance(v, str) else v

    @field_validator("id", "tenant", "backbone", "task")
    @classmethod
    def _no_control_characters(cls, v: str | None) -> str | None:
        bad = control_characters(v) if v is not None else []
        if bad:
            raise ValueError(f"contains control characters ({', '.join(bad)}); ids are printed "
                             "and logged, so only printable text is accepted")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | CustomModelSpec | MeasuredModelSpec) -> str:
        try:
            if isinstance(v, (CustomModelSpec, MeasuredModelSpec)):
                return v.catalog_name()
            return get_model(v).name
        except CatalogError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("submit_time_s", "deadline_s")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _max_gpus_covers_request(self) -> JobEntry:
        if self.max_gpus is not None and self.max_gpus < self.requested_gpus:
            raise ValueError(f"<max_gpus> {self.max_gpus} is below the job's requested_gpus "
                             f"{self.requested_gpus}: the request is always a count it may "
                             "run on; raise max_gpus or lower requested_gpus")
        return self

    @model_validator(mode="after")
    def _done_within_iterations(self) -> JobEntry:
        if self.iterations_done > self.iterations:
            raise ValueError(f"<iterations_done> {self.iterations_done} is more than the job's "
                             f"{self.iterations} iterations")
        if self.batch_range is not None and not (
                self.batch_range[0] <= self.global_batch_size <= self.batch_range[1]):
            raise ValueError(f"<global_batch_size> {self.global_batch_size} is outside "
                             f"batch_range {list(self.batch_range)}: its iterations are "
                             "counted at global_batch_size, one of the batches it may run")
        if self.iterations_done == self.iterations:  # a round would start it on GPUs
            raise ValueError(f"<iterations_done> {self.iterations_done} is all of the job's "
                             f"{self.iterations} iterations: the job is complete, so there is "
                             "nothing to schedule; remove it from the queue")
        return self


class FinishedEntry(_Strict):
    """A fine-tuning job that has finished and whose weights remain: a queued sibling (the
    same backbone) may start from them (a transfer option of apportion's round)."""

    id: str = Field(min_length=1, max_length=256)
    backbone: str = Field(min_length=1, max_length=256)
    task: str = Field(min_length=1, max_length=256)
    model: str | None = Field(default=None, min_length=1, max_length=256)
    global_batch_size: int = Field(default=1, gt=0, le=MAX_COUNT)

    @field_validator("id", "backbone", "task")
    @classmethod
    def _printable(cls, v: str) -> str:
        bad = control_characters(v)
        if bad:
            raise ValueError(f"contains control characters ({', '.join(bad)})")
        return unicodedata.normalize("NFC", v)


class JobsSpec(_Strict):
    jobs: list[JobEntry]
    now_s: Clock = None
    # finished fine-tuning jobs whose weights a queued sibling may start from
    finished: list[FinishedEntry] = Field(default_factory=list)

    @field_validator("jobs")
    @classmethod
    def _unique_ids(cls, jobs: list[JobEntry]) -> list[JobEntry]:
        seen: set[str] = set()
        for i, j in enumerate(jobs):
            if j.id in seen:
                raise ValueError(f"jobs[{i}].id: duplicate job id {j.id!r}")
            seen.add(j.id)
        return jobs

    @model_validator(mode="after")
    def _finished_apart(self) -> JobsSpec:
        ids = {j.id for j in self.jobs}
        seen: set[str] = set()
        for i, f in enumerate(self.finished):
            if f.id in ids or f.id in seen:
                raise ValueError(f"<finished> [{i}].id: {f.id!r} is already a job of the file")
            seen.add(f.id)
        return self


class TenantEntry(_Strict):
    name: str = Field(min_length=1, max_length=256)
    quota_gpus: int = Field(ge=0, le=MAX_COUNT)

    @field_validator("name", mode="before")
    @classmethod
    def _nfc(cls, v: Any) -> Any:
        """The spelling jobs' tenants are normalised to (NFC), so quotas match them."""
        return unicodedata.normalize("NFC", v) if isinstance(v, str) else v


class TenantsSpec(_Strict):
    tenants: list[TenantEntry]

    @field_validator("tenants")
    @classmethod
    def _unique_names(cls, tenants: list[TenantEntry]) -> list[TenantEntry]:
        seen: set[str] = set()
        for i, t in enumerate(tenants):
            if t.name in seen:
                raise ValueError(f"tenants[{i}].name: duplicate tenant {t.name!r}")
            seen.add(t.name)
        return tenants


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------
def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as users read it: ``jobs[3].requested_gpus``."""
    out = ""
    for part in loc:
        if isinstance(part, str) and part.startswith("#"):  # a union branch's tag
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _validate(model: type[BaseModel], data: Any, source: str, prefix: str = "") -> Any:
    """``data`` validated as ``model``; a refusal names the first problem's field path,
    under ``prefix`` (``line 7, jobs[5]``: an entry validated on its own) where given."""
    try:
        return _validate_top(model, data, source)
    except InputError as exc:
        if not prefix:
            raise
        where = exc.field
        where = prefix if where == "(top level)" else f"{prefix}.{where}"
        raise InputError(source, where, exc.message) from None


def _validate_top(model: type[BaseModel], data: Any, source: str) -> Any:
    if not isinstance(data, dict):
        raise InputError(source, "(top level)", f"expected a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # the first problem, and how many there are: a list of problems costs about 2 µs
        # each to build, and a document can hold millions
        err = exc.errors(include_url=False, include_input=False)[0]
        loc = field_path(tuple(err["loc"]))
        msg = err["msg"]
        msg = msg.removeprefix("Value error, ")
        if msg.startswith(loc + ": "):
            msg = msg[len(loc) + 2:]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        nmore = exc.error_count() - 1
        if nmore:
            msg += f" (and {nmore} more problem{'s' if nmore > 1 else ''})"
        # a list-level validator names its own element inside the message
        if msg.startswith(loc + "[") and ": " in msg:
            loc, msg = msg.split(": ", 1)
        # a model-level validator names its field first ("<placement> ...")
        m = _FIELD_FIRST.match(msg)
        if err["type"] == "value_error" and m:
            loc = f"{loc}.{m.group(1)}" if loc != "(top level)" else m.group(1)
            msg = msg[m.end():]
        raise InputError(source, loc, msg) from None


_FIELD_FIRST = re.compile(r"^<([a-z_]+)> ")  # a model validator names its field
_LINK_DEFAULT_GBPS = {"nvlink": 300.0, "pcie": 32.0}


def cluster_from_data(data: Any, source: str) -> Cluster:
    spec: ClusterSpec = _validate(ClusterSpec, data, source)
    groups = [
        NodeGroup(
            prefix=g.prefix, count=len(g.nodes) if g.nodes else int(g.count or 0),
            gpu_type=g.gpu_type, gpus_per_node=g.gpus_per_node,
            cpus_per_node=g.cpus_per_node, host_memory_gib=g.host_memory_gib,
            intra_node_link=g.intra_node_link,
            intra_node_bandwidth_GBps=g.intra_node_bandwidth_GBps
            or _LINK_DEFAULT_GBPS[g.intra_node_link],
            inter_node_bandwidth_GBps=g.inter_node_bandwidth_GBps,
            names=tuple(g.nodes or ()), gpu_product_label=g.gpu_product_label,
            labels=tuple(sorted(g.labels.items())), gpu_memory_gib=g.gpu_memory_gib,
        )
        for g in spec.node_groups
    ]
    return Cluster(spec.name, groups)


def _job_of(e: JobEntry) -> JobSpec:
    running = None
    if e.running is not None:
        r = e.running
        running = RunningState(r.gpu_type, r.gpus, r.stages, dict(r.placement), r.tp)
    return JobSpec(
        id=e.id, model=e.model, global_batch_size=e.global_batch_size,
        iterations=e.iterations, requested_gpus=e.requested_gpus,
        requested_gpu_type=e.requested_gpu_type, submit_time_s=e.submit_time_s,
        tenant=e.tenant, guaranteed=e.guaranteed, deadline_s=e.deadline_s,
        backbone=e.backbone, task=e.task, accepts_sharing=e.accepts_sharing,
        iterations_done=e.iterations_done, running=running, admitted=e.admitted,
        workload=e.workload.to_workload() if e.workload is not None else None,
        max_gpus=e.max_gpus, elastic=e.elastic,
        batch_range=None if e.batch_range is None else (e.batch_range[0], e.batch_range[1]),
        grad_stats=None if e.grad_stats is None else (e.grad_stats[0], e.grad_stats[1]),
    )


def jobs_from_data(data: Any, source: str) -> tuple[list[JobSpec], float]:
    """Jobs plus the round's clock (``now_s``, default: the latest submit time)."""
    spec: JobsSpec = _validate(JobsSpec, data, source)
    jobs = [_job_of(e) for e in spec.jobs]
    now = spec.now_s if spec.now_s is not None else max((j.submit_time_s for j in jobs), default=0.0)
    return jobs, now


def finished_from_data(data: Any, source: str) -> list[JobSpec]:
    """The jobs file's ``finished`` fine-tuning jobs, as records a sibling's transfer names
    (their weights exist; nothing of them is scheduled)."""
    spec: JobsSpec = _validate(JobsSpec, data, source)
    return [JobSpec(id=f.id, model=f.model or f.backbone, global_batch_size=f.global_batch_size,
                    iterations=1, requested_gpus=1, backbone=f.backbone, task=f.task,
                    accepts_sharing=True) for f in spec.finished]



# ---------------------------------------------------------------------------
# Queues: the jobs YAML, or JSON lines streamed
# ---------------------------------------------------------------------------
#: what a JSON-lines queue's first line says it is (``{"format": "apportion-jobs", ...}``)
JOBS_LINES_FORMAT = "apportion-jobs"
#: file names read as JSON lines whatever their first line
JOBS_LINES_SUFFIXES = (".jsonl", ".ndjson")
#: the size a JSON-lines queue may have when it declares no count and no option says more
#: (it is streamed: no copy of it is held; about 400,000 jobs of 150 bytes)
MAX_JOBS_LINES_BYTES = 64 * 2**20
#: what a declared job adds to that limit (a job line is about 150 bytes, with a workload
#: command and environment about 1 KB; one line alone may hold MAX_LINE_BYTES)
JOBS_LINES_BYTES_PER_JOB = 4096
#: the most jobs a header may declare (the memory guard refuses far fewer on real machines)
MAX_DECLARED_JOBS = 100_000_000


class JobsLinesHeader(_Strict):
    """The optional first line of a JSON-lines queue: what it is, how many jobs follow
    (exactly that many must), and the round's clock."""

    format: Literal["apportion-jobs"]
    version: Literal[1] = 1
    jobs: int | None = Field(default=None, ge=0, le=MAX_DECLARED_JOBS)
    now_s: Clock = None


@dataclass
class Queue:
    """A queue file's jobs, the round's clock, and per job whether the file gave its
    ``submit_time_s`` (``submit`` stamps the others with the store's clock)."""

    jobs: list[JobSpec]
    now_s: float
    timed: list[bool]
    format: str = "yaml"  # yaml | jsonl
    #: the YAML's ``finished`` fine-tuning jobs (a sibling's transfer source; never run)
    finished: list[JobSpec] = field(default_factory=list)


def _first_line(path: str | Path) -> str:
    head = read_head(path, "jobs", 4096)
    return head.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def queue_format(path: str | Path) -> str:
    """``jsonl`` for a JSON-lines queue (a ``.jsonl``/``.ndjson`` name, or a first line
    that is the header), else ``yaml``: a YAML file never starts with that header (the jobs
    schema refuses a ``format`` key), so no valid file of one format is read as the other."""
    if str(path).lower().endswith(JOBS_LINES_SUFFIXES):
        return "jsonl"
    line = _first_line(path)
    if line.startswith("{") and f'"{JOBS_LINES_FORMAT}"' in line:
        try:
            first = json.loads(line)
        except ValueError:
            return "yaml"
        if isinstance(first, dict) and first.get("format") == JOBS_LINES_FORMAT:
            return "jsonl"
    return "yaml"


def _header_of(text: str, source: str, number: int) -> JobsLinesHeader | None:
    data = parse_json_line(text, source, number)
    if isinstance(data, dict) and "format" in data:
        return _validate(JobsLinesHeader, data, source, f"line {number} (header)")
    return None


def declared_jobs(path: str | Path) -> int | None:
    """The count a JSON-lines queue's header declares (None: not JSON lines, or no count),
    read from its first line alone: a queue too large for the machine is refused before
    any of it is read (:func:`apportion.memory_guard.check_round_fits`)."""
    if queue_format(path) != "jsonl":
        return None
    line = _first_line(path)
    if not line.startswith("{"):
        return None
    header = _header_of(line, str(path), 1)
    return None if header is None else header.jobs


def jobs_lines_limit(declared: int | None) -> int:
    """The size a JSON-lines queue may have: :data:`MAX_JOBS_LINES_BYTES`, or
    :data:`JOBS_LINES_BYTES_PER_JOB` per declared job where that is more."""
    return max(MAX_JOBS_LINES_BYTES, (declared or 0) * JOBS_LINES_BYTES_PER_JOB)


def load_jobs_lines(path: str | Path, max_bytes: int | None = None) -> Queue:
    """A JSON-lines queue, read and validated a line at a time (see the module's
    docstring): each non-empty line one job entry of the jobs YAML's fields, the first
    line optionally the header. A refusal names the line and the job's field
    (``line 7, jobs[5].requested_gpus``)."""
    src = str(path)
    header: JobsLinesHeader | None = None
    declared: int | None = None
    jobs: list[JobSpec] = []
    timed: list[bool] = []
    seen: set[str] = set()
    # the limit: the option's, else what the header declares (read once more below)
    limit = max_bytes if max_bytes is not None else jobs_lines_limit(declared_jobs(path))
    lines = 0
    for number, text in iter_lines(path, "JSON-lines jobs", max_bytes=limit):
        lines += 1
        if not text.strip():
            continue
        if lines == 1 and text.lstrip().startswith("{") and '"format"' in text:
            header = _header_of(text, src, number)
            if header is not None:
                declared = header.jobs
                continue
        i = len(jobs)
        if declared is not None and i >= declared:
            raise InputError(src, f"line {number}", f"more jobs than the {declared} the "
                             "header declares")
        data = parse_json_line(text, src, number)
        if isinstance(data, dict) and "format" in data:
            raise InputError(src, f"line {number}", "a header line (\"format\") is only "
                             "read as the file's first line")
        entry: JobEntry = _validate(JobEntry, data, src, f"line {number}, jobs[{i}]")
        if entry.id in seen:
            raise InputError(src, f"line {number}, jobs[{i}].id",
                             f"duplicate job id {entry.id!r}")
        seen.add(entry.id)
        jobs.append(_job_of(entry))
        timed.append("submit_time_s" in data)
    if lines == 0:
        raise InputError(src, "(file)", "an empty file: a JSON-lines queue has a job a line "
                         "(and optionally a header line first)")
    if declared is not None and len(jobs) != declared:
        raise InputError(src, "(file)", f"the header declares {declared} jobs but the "
                         f"file holds {len(jobs)} (a truncated copy?)")
    now = header.now_s if header is not None and header.now_s is not None else \
        max((j.submit_time_s for j in jobs), default=0.0)
    return Queue(jobs, now, timed, "jsonl")


def load_queue(path: str | Path, max_bytes: int | None = None) -> Queue:
    """A queue file in either format (:func:`queue_format`). ``max_bytes``: the largest
    file read (``--max-input-bytes``); None: the format's own limit (4 MB of YAML; for
    JSON lines 64 MB or what its header declares). A file this machine could not hold once
    read is refused before it is read (:func:`apportion.memory_guard.check_input_fits`)."""
    check_input_fits(path, "jobs")
    if queue_format(path) == "jsonl":
        return load_jobs_lines(path, max_bytes)
    data = read_yaml(path, max_bytes=MAX_FILE_BYTES if max_bytes is None else max_bytes)
    jobs, now = jobs_from_data(data, str(path))
    raw = data.get("jobs", []) if isinstance(data, dict) else []
    timed = [isinstance(r, dict) and "submit_time_s" in r for r in raw]
    finished = finished_from_data(data, str(path)) if isinstance(data, dict) and \
        data.get("finished") else []
    return Queue(jobs, now, timed, "yaml", finished)


def load_tenants(path: str | Path) -> dict[str, int]:
    """Tenant quotas (GPUs for guaranteed jobs) from ``tenants: [{name, quota_gpus}]``."""
    spec: TenantsSpec = _validate(TenantsSpec, read_yaml(path), str(path))
    return {t.name: t.quota_gpus for t in spec.tenants}


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_data(read_yaml(path), str(path))


def load_jobs(path: str | Path, max_bytes: int | None = None) -> tuple[list[JobSpec], float]:
    """The jobs of a queue file (YAML or JSON lines: :func:`load_queue`) and its clock."""
    q = load_queue(path, max_bytes)
    return q.jobs, q.now_s


def check_running(jobs: list[JobSpec], cluster: Cluster, source: str) -> None:
    """Each ``running`` block fits ``cluster``: its GPU type and nodes exist, each node is of
    that type and holds the GPUs placed on it. Without this a stale jobs file would be
    planned as if the job ran on GPUs that are not there."""
    types = cluster.gpu_types
    for i, j in enumerate(jobs):
        r = j.running
        if r is None:
            continue
        where = f"jobs[{i}].running"
        if r.gpu_type not in types:
            raise InputError(source, f"{where}.gpu_type", f"{r.gpu_type} is not in cluster "
                             f"{cluster.name} (it has {', '.join(types)})")
        for node, k in sorted(r.placement.items()):
            n = cluster.nodes.get(node)
            if n is None:
                raise InputError(source, f"{where}.placement", f"node {node!r} is not in "
                                 f"cluster {cluster.name}")
            if n.gpu_type != r.gpu_type:
                raise InputError(source, f"{where}.placement", f"node {node!r} has "
                                 f"{n.gpu_type} GPUs, not {r.gpu_type}")
            if k > n.gpus:
                raise InputError(source, f"{where}.placement", f"node {node!r} has {n.gpus} "
                                 f"GPUs, {k} placed on it")


#: The bundled clusters by their one canonical name, and the other spellings accepted
#: everywhere a cluster name is (solve-round, estimate, run, simulate, compare).
CLUSTER_ALIASES = {"crius-sim": "crius-1280", "crius": "crius-1280", "default": "crius-testbed",
                   "morphling": "morphling-64"}


def bundled_clusters() -> list[str]:
    """Canonical names of the clusters shipped in ``apportion/data/clusters``."""
    folder = resources.files("apportion").joinpath("data/clusters")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def cluster_names_help() -> str:
    """The bundled names and their aliases, for ``--help``."""
    alias: dict[str, list[str]] = {}
    for a, c in CLUSTER_ALIASES.items():
        alias.setdefault(c, []).append(a)
    return ", ".join(n + (f" (alias {', '.join(alias[n])})" if n in alias else "")
                     for n in bundled_clusters())


def canonical_cluster_name(name: str) -> str | None:
    """The canonical bundled name for ``name`` (itself or an alias), or None."""
    name = CLUSTER_ALIASES.get(name, name)
    return name if name in bundled_clusters() else None


def resolve_cluster(arg: str | Path) -> Cluster:
    """A cluster from a YAML path, or from a bundled name or alias (:data:`CLUSTER_ALIASES`)."""
    p = Path(arg)
    name = canonical_cluster_name(str(arg))
    if name is not None and not p.exists():
        text = resources.files("apportion").joinpath(f"data/clusters/{name}.yaml").read_text()
        return cluster_from_data(parse_shipped_yaml(text), f"<bundled cluster {name}>")
    if p.exists() or str(arg).endswith((".yaml", ".yml")) or "/" in str(arg):
        return load_cluster(p)
    raise InputError(str(arg), "--cluster", "neither a file nor a bundled cluster; bundled: "
                     + cluster_names_help())


#: the jobs files shipped by name: what ``solve-round`` decides without ``--jobs``
JOBS_NAMES = ("default",)


def resolve_jobs(arg: str | Path, max_bytes: int | None = None) -> tuple[list[JobSpec], float]:
    """Jobs from a queue file (YAML or JSON lines), or the bundled ``default`` (the dozen
    Crius jobs ``solve-round`` decides without ``--jobs``), so a decision of ``solve-round``
    exports with the same names it was solved with; a file of that name wins."""
    p = Path(arg)
    if str(arg) in JOBS_NAMES and not p.exists():
        return default_jobs()
    return load_jobs(p, max_bytes)


def default_cluster() -> Cluster:
    """Crius's physical testbed: 16 x 2 A40 and 16 x 2 A10 nodes on InfiniBand."""
    text = resources.files("apportion").joinpath("data/default_cluster.yaml").read_text()
    return cluster_from_data(parse_shipped_yaml(text), "<embedded default cluster>")


def default_jobs() -> tuple[list[JobSpec], float]:
    """A dozen queued jobs drawn from Crius's table-2 models."""
    text = resources.files("apportion").joinpath("data/default_jobs.yaml").read_text()
    return jobs_from_data(parse_shipped_yaml(text), "<embedded default jobs>")
