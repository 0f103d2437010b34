"""Jobs: what users submit, plus the little runtime state a round needs."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field

from apportion.plans import Cell

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def job_dirname(job_id: str) -> str:
    """The one folder name a job's files live under: never a path, never shared.

    A job id is a name chosen by whoever submits the job, so it must never be
    joined to a path as it is (``../../x``, ``/abs``, ``./x`` and ``x`` would
    escape the work folder or share one). The folder name is a readable slug
    of the id (letters, digits, ``_ . -``; at most 48 characters, no leading
    dot) followed by 16 hex digits of the id's SHA-256, so it is always one
    path component inside the work folder and distinct ids get distinct
    folders (up to a 64-bit hash collision).
    """
    slug = _UNSAFE.sub("_", job_id)[:48].lstrip(".") or "job"
    digest = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{slug}-{digest}"


def control_characters(text: str) -> list[str]:
    """The control and format characters in ``text`` (as ``U+XXXX``), for input checks.

    Ids are printed on terminals and written into logs; an escape sequence or a
    bidirectional override in one would rewrite what an operator sees.
    """
    return sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in ("Cc", "Cf")})


def printable_id(job_id: str) -> str:
    """``job_id`` as text safe to print: non-printable characters as escapes."""
    if job_id.isprintable():
        return job_id
    return job_id.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class RunningState:
    """Where a running job is now: its cell and placement."""

    gpu_type: str
    gpus: int
    stages: int
    placement: dict[str, int] = field(default_factory=dict)
    tp: int = 1

    @property
    def cell_key(self) -> tuple[str, int, int]:
        return (self.gpu_type, self.gpus, self.stages)


WORKLOAD_KINDS = ("builtin", "torchrun", "deepspeed", "jax")


@dataclass(frozen=True)
class Workload:
    """What runs for a job (the jobs YAML ``workload`` block; its fields are a contract).

    ``builtin`` is apportion's own trainer on the job's catalog model; the other
    kinds run the user's ``command`` on every rank with torchrun's variables and
    apportion's (``APPORTION_PLAN``, ``APPORTION_CHECKPOINT_DIR``, ...), see
    ``apportion.runtime.workload``. ``image`` is for container executors.
    """

    kind: str = "builtin"
    command: tuple[str, ...] = ()
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    checkpoint_every: int | None = None  # periodic checkpoints; None: the run's default
    checkpoint_interval_s: float | None = None
    train: dict[str, object] = field(default_factory=dict)  # built-in trainers' optimiser

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "command": list(self.command), "workdir": self.workdir,
                "env": dict(self.env), "image": self.image,
                "checkpoint_every": self.checkpoint_every,
                "checkpoint_interval_s": self.checkpoint_interval_s, "train": dict(self.train)}

    @classmethod
    def from_dict(cls, d: dict[str, object] | None) -> Workload | None:
        if d is None:
            return None
        return cls(kind=str(d.get("kind", "builtin")), command=tuple(d.get("command") or ()),
                   workdir=d.get("workdir"), env=dict(d.get("env") or {}),  # type: ignore[arg-type]
                   image=d.get("image"),  # type: ignore[arg-type]
                   checkpoint_every=d.get("checkpoint_every"),  # type: ignore[arg-type]
                   checkpoint_interval_s=d.get("checkpoint_interval_s"),  # type: ignore[arg-type]
                   train=dict(d.get("train") or {}))  # type: ignore[call-overload]


@dataclass(frozen=True)
class JobSpec:
    """A training job. ``model`` is a catalog name; the global batch never changes unless
    the job gives a ``batch_range`` (then the scheduler chooses it, for goodput)."""

    id: str
    model: str
    global_batch_size: int
    iterations: int
    requested_gpus: int
    requested_gpu_type: str | None = None
    submit_time_s: float = 0.0
    tenant: str = "default"
    guaranteed: bool = False
    deadline_s: float | None = None
    backbone: str | None = None
    task: str | None = None
    accepts_sharing: bool = False
    iterations_done: int = 0
    running: RunningState | None = None
    admitted: bool = False  # a deadline job admitted earlier keeps its guarantee
    workload: Workload | None = None  # None: the built-in trainer
    priority_weight: float = 1.0  # a fairness weight (Gavel's max-min priorities)
    # how many GPUs it may be given (formulations/counts.py): an elastic job (the default:
    # its global batch never changes with its GPU count, so any count trains the same
    # model) is offered counts up to ``max_gpus`` where its rate still gains; one that must
    # keep its size (``elastic=False``) only its request
    max_gpus: int | None = None
    elastic: bool = True
    # the global batches the scheduler may run it at, (smallest, largest): its batch is then
    # a decision (Pollux's goodput; formulations/batch_options.py); None: it keeps
    # ``global_batch_size``, which counts its ``iterations``
    batch_range: tuple[int, int] | None = None
    # the gradient statistics the job last reported, (grad_sqr, grad_var): the squared norm
    # of its true gradient and the variance of one sample's gradient (their ratio is its
    # gradient noise scale; estimation/goodput/efficiency.py): its statistical efficiency at
    # any batch. Runtime state, like ``iterations_done``
    grad_stats: tuple[float, float] | None = None

    @property
    def remaining_iterations(self) -> int:
        return max(0, self.iterations - self.iterations_done)

    def wait_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.submit_time_s) if self.running is None else 0.0

    def is_current(self, cell: Cell) -> bool:
        return self.running is not None and self.running.cell_key == cell.key
