"""What every trace format produces: a :class:`Trace` of :class:`SimJob` in submit order,
where it came from, and every :class:`Substitution` its loader or its adaptation made.

A substitution is anything a replay uses that the file did not say: a model name mapped
to a catalog name, a GPU type renamed or assigned, work derived from a duration, jobs
drawn by a paper's adaptation. Each is kept with the jobs it touched, so the summary of a
replay (and its stderr) can say what was read into the trace, and how many of the jobs
replayed it concerns — never a silent rewrite.

The checked CSV reader (:func:`read_trace_csv`) and the bounds on a trace's numbers are
shared by every loader: a bad number is refused naming its line and column.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apportion.env import data_root as _data_root
from apportion.errors import InputError
from apportion.inputs import (
    MAX_TRACE_BYTES,
    CsvTable,
    check_input_file,
    parse_csv_text,
    read_text,
)
from apportion.jobs import control_characters


def data_root() -> Path:
    """Where the real data lives: ``$APPORTION_DATA`` or ``<repo>/../shared/data``
    (:func:`apportion.env.data_root`, the one rule)."""
    return _data_root()


@dataclass(frozen=True)
class FinetuneInfo:
    """What a fine-tuning job of a trace fine-tunes (YMIR's submission, figure 14):
    the backbone, the task (dataset), the hyper-parameters its convergence curve is
    measured under, and the target metric value that ends it."""

    backbone: str
    task: str
    lr: str  # as the measured curves key it ("4e-5")
    steps: str  # gradient steps (accumulation) of the curves' key ("8")
    target: float
    accepts_sharing: bool = True


@dataclass(frozen=True)
class SimJob:
    """One job of a trace, as the simulator and the policies see it.

    ``job_type`` is the ground-truth key (Gavel job type, Crius
    ``model_params_batch``, Morphling application); ``model`` is an apportion
    catalog name when one matches (the optimising policy needs it).
    ``iterations`` may be fractional (Gavel and Crius count steps)."""

    job_id: str
    submit_s: float
    gpus: int
    iterations: float
    job_type: str
    model: str | None = None
    batch: int = 1
    gpu_type: str | None = None
    tenant: str = "default"
    guaranteed: bool = False
    deadline_s: float | None = None
    duration_s: float | None = None
    priority_weight: float = 1.0
    plan: str | None = None
    cpus: int | None = None
    finetune: FinetuneInfo | None = None  # a fine-tuning job (YMIR): backbone, task, target
    # elasticity where the trace says it (``max_gpus`` and ``elastic`` columns): the most
    # GPUs the job may be given, and whether it may run on another count than its own
    max_gpus: int | None = None
    elastic: bool = True
    # the global batches a scheduler may choose for it, (smallest, largest); None: its
    # ``batch`` is fixed (every trace but Pollux's, and Pollux's ncf)
    batch_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class Substitution:
    """One thing a replay uses that the trace file did not say, and the jobs it concerns.

    ``field`` is what was replaced (``model``, ``gpu_type``, ``iterations``, or several
    for an adaptation), ``original`` what the file said (``(none)`` where it said
    nothing), ``replacement`` what the replay uses, ``why`` the reason in a few words."""

    field: str
    original: str
    replacement: str
    why: str
    jobs: tuple[str, ...] = ()


class SubstitutionLog:
    """Collects a loader's substitutions job by job, grouped by (field, original,
    replacement): one :class:`Substitution` per distinct pair (the same pair for 2,000
    jobs is one line)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str, str], list[str]] = {}

    def add(self, field_name: str, original: Any, replacement: Any, why: str,
            job_id: str) -> None:
        """Record that ``job_id``'s ``field_name`` is ``replacement`` where the file said
        ``original`` (nothing is recorded where the two read the same)."""
        a, b = _shown(original), _shown(replacement)
        if a != b:
            self._groups.setdefault((field_name, a, b, why), []).append(job_id)

    def substitutions(self) -> list[Substitution]:
        return [Substitution(f, a, b, why, tuple(ids))
                for (f, a, b, why), ids in self._groups.items()]


def _shown(value: Any) -> str:
    return "(none)" if value is None or value == "" else str(value)


@dataclass
class Trace:
    name: str
    jobs: list[SimJob]
    source: str = ""
    notes: list[str] = field(default_factory=list)
    format: str = ""  # the registered trace format's name (apportion.experiments.traces)
    substitutions: list[Substitution] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.jobs)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([j.__dict__ for j in self.jobs])

    def derived(self, jobs: list[SimJob], *, name: str | None = None,
                note: str | None = None,
                substitutions: Iterable[Substitution] = ()) -> Trace:
        """This trace with other jobs (same source and format), one more note and more
        substitutions: what an adaptation or a ground truth's preparation returns."""
        return replace(self, name=self.name if name is None else name, jobs=jobs,
                       notes=self.notes + ([note] if note else []),
                       substitutions=self.substitutions + list(substitutions))

    def window(self, start_s: float, end_s: float, rebase: bool = True) -> Trace:
        """Jobs submitted in ``[start_s, end_s)``, submit times rebased to 0."""
        js = [j for j in self.jobs if start_s <= j.submit_s < end_s]
        if rebase:
            js = [replace(j, submit_s=j.submit_s - start_s,
                          deadline_s=None if j.deadline_s is None else j.deadline_s - start_s)
                  for j in js]
        return self.derived(js, name=f"{self.name}[{start_s:.0f}:{end_s:.0f}]",
                            note=f"window {start_s:.0f}-{end_s:.0f} s")

    def at_load(self, load: float) -> Trace:
        """The same jobs arriving ``load`` times as fast (submit times divided by ``load``,
        each deadline as far after its submission as before): a load sweep's trace, the way
        Gavel and Pollux vary the arrival rate over one workload."""
        js = [replace(j, submit_s=j.submit_s / load,
                      deadline_s=None if j.deadline_s is None
                      else j.submit_s / load + (j.deadline_s - j.submit_s))
              for j in self.jobs]
        return self.derived(js, note=f"arrivals at {load:g}x the trace's rate")

    def head(self, n: int) -> Trace:
        return self.derived(self.jobs[:n], name=f"{self.name}[:{n}]", note=f"first {n}")

    def substitution_report(self) -> list[dict[str, Any]]:
        """The substitutions as the summary JSON keeps them: each with the number of this
        trace's jobs it concerns (jobs a window or ``--max-jobs`` left out are not
        counted; a substitution that concerns none is left out) and the first few ids."""
        ids = {j.job_id for j in self.jobs}
        out = []
        for s in self.substitutions:
            mine = [j for j in s.jobs if j in ids]
            if mine:
                out.append({"field": s.field, "from": s.original, "to": s.replacement,
                            "why": s.why, "jobs": len(mine), "first_jobs": mine[:3]})
        return out

    def substitution_lines(self, pairs: int = 6) -> list[str]:
        """:meth:`substitution_report` as lines for stderr: one per field and reason, with
        its pairs (at most ``pairs`` shown) and the jobs they concern."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in self.substitution_report():
            groups.setdefault((r["field"], r["why"]), []).append(r)
        out = []
        for (field_name, why), rs in groups.items():
            shown = ", ".join(f"{r['from']} -> {r['to']}" + (f" ({r['jobs']})" if len(rs) > 1
                                                             else "") for r in rs[:pairs])
            more = f" and {len(rs) - pairs} more" if len(rs) > pairs else ""
            n = sum(r["jobs"] for r in rs)
            out.append(f"{field_name} {shown}{more} for {n} job{'s' if n != 1 else ''}: {why}")
        return out


def sorted_jobs(jobs: list[SimJob]) -> list[SimJob]:
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def check_trace_file(path: Path) -> None:
    """An existing regular file (a FIFO or a device is refused before it is opened)."""
    if not path.exists() and not path.is_symlink():
        raise InputError(str(path), "(file)", "no such trace file")
    check_input_file(path, "trace")


#: Bounds on a trace's numbers: past them a replay's arithmetic overflows or means nothing
#: (a year is 3.2e7 s; the biggest public trace has 10^5 jobs of at most 2,048 GPUs).
MAX_TRACE_SECONDS = 1e12
MAX_TRACE_GPUS = 1_000_000
MAX_TRACE_ITERATIONS = 1e15
SECONDS = {"minimum": 0.0, "maximum": MAX_TRACE_SECONDS}
ANY_SECONDS = {"minimum": -MAX_TRACE_SECONDS, "maximum": MAX_TRACE_SECONDS}
GPUS = {"integer": True, "minimum": 0, "maximum": MAX_TRACE_GPUS}
POSITIVE_COUNT = {"integer": True, "minimum": 1, "maximum": MAX_TRACE_GPUS}
ITERATIONS = {"minimum": 0.0, "maximum": MAX_TRACE_ITERATIONS}


def read_trace_csv(p: Path, required: tuple[str, ...], id_column: str,
                   numbers: dict[str, dict[str, Any]],
                   optional: frozenset[str] = frozenset()) -> tuple[str, CsvTable]:
    """A trace CSV's text, checked field by field by the one input reader.

    The reader refuses what is not a bounded, UTF-8, regular file with sane fields;
    here every number a loader converts is checked as text (``abc``, ``inf``, a
    thousand digits, out of bounds: exit 2 naming the line and column) and job ids
    must be present, printable and unique (two jobs of one id would share one
    record in every per-job table). Only then is the text typed, by the same pandas
    parser as before, so a valid trace gives exactly the numbers it always gave.
    ``optional`` numeric columns may be empty.
    """
    check_trace_file(p)
    src = str(p)
    text = read_text(p, "trace", max_bytes=MAX_TRACE_BYTES)
    table = parse_csv_text(text, src, required=required)
    seen: dict[str, int] = {}
    present = [(c, b) for c, b in numbers.items() if c in table.header]
    for i, row in table.iter():
        for col, bounds in present:
            if col in optional and not (row.get(col) or "").strip():
                continue
            table.number(i, col, **bounds)
        jid = row.get(id_column) or ""
        if not jid.strip():
            raise InputError(src, table.where(i, id_column), "a job id is required")
        bad = control_characters(jid)
        if bad:
            raise InputError(src, table.where(i, id_column),
                             f"contains control characters ({', '.join(bad)})")
        if jid in seen:
            raise InputError(src, table.where(i, id_column), f"duplicate job id {jid!r} (first "
                             f"on line {seen[jid]}): each job needs its own id")
        seen[jid] = table.lines[i]
    return text, table


_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def elasticity(table: CsvTable, i: int) -> tuple[int | None, bool]:
    """Row ``i``'s optional ``max_gpus`` and ``elastic`` columns (a trace that has them):
    ``(max_gpus or None, elastic)``, elastic unless the row says ``false`` (or ``no``,
    ``0``); a value that is neither, or a ``max_gpus`` below the row's ``num_gpus``, is
    refused naming its line and column."""
    top = table.optional_number(i, "max_gpus", **POSITIVE_COUNT)
    if top is not None and (need := table.optional_number(i, "num_gpus", **GPUS)) is not None \
            and top < need:
        raise InputError(table.source, table.where(i, "max_gpus"),
                         f"{int(top)} is below the job's num_gpus {int(need)}: the request is "
                         "always a count it may run on")
    text = (table.rows[i].get("elastic") or "").strip().lower()
    if text and text not in _TRUE | _FALSE:
        raise InputError(table.source, table.where(i, "elastic"),
                         f"{table.rows[i]['elastic']!r} is not true or false")
    return (None if top is None else int(top)), text not in _FALSE


def busiest_window(trace: Trace, hours: float, by: str = "jobs") -> tuple[float, float]:
    """Start and end of the ``hours`` window with the most jobs (or GPU-hours) submitted."""
    if not trace.jobs:
        return 0.0, hours * 3600
    t = np.array([j.submit_s for j in trace.jobs])
    w = (np.ones(len(t)) if by == "jobs"
         else np.array([j.gpus * (j.duration_s or 0.0) for j in trace.jobs]))
    span = hours * 3600.0
    csum = np.concatenate([[0.0], np.cumsum(w)])
    ends = np.searchsorted(t, t + span, side="left")
    load = csum[ends] - csum[np.arange(len(t))]
    i = int(np.argmax(load))
    return float(t[i]), float(t[i] + span)


def with_iterations(trace: Trace, truth: Any, gpu_type: str | None = None) -> Trace:
    """Iterations = duration x measured throughput at the job's GPUs (and type); a job
    the truth cannot rate there, or without a duration, is left out."""
    out = []
    for j in trace.jobs:
        t = gpu_type or j.gpu_type
        rate = truth.rate(j, t, j.gpus) if t else 0.0
        if rate <= 0 or not j.duration_s:
            continue
        out.append(replace(j, iterations=float(max(1.0, round(j.duration_s * rate)))))
    return trace.derived(out, note="iterations from duration")


def is_missing(value: Any) -> bool:
    """A pandas cell with nothing in it (None or NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))
