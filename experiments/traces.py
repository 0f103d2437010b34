"""Job traces: loaders for the real public traces and the papers' adaptations.

Every loader returns a :class:`Trace`: a list of :class:`SimJob` in submit order
plus where it came from. Four source formats are read:

* the normalised CSV of ``../shared/data/traces/`` (``job_id, submit_time_s,
  num_gpus, duration_s`` plus optional ``tenant, model, gpu_type, batch_size,
  iterations, deadline_s``), generically: any CSV with those leading columns;
* Gavel's 10-field tab-separated ``.trace`` (job_type, command, working
  directory, num_steps_arg, needs_data_dir, total_steps, scale_factor,
  priority_weight, SLO, arrival_time);
* Crius's adapted traces (``job_id, submission_time, num_iteration,
  model_name, deadline, batch_size, num_gpu, gpu_type``);
* Morphling's workloads (``name, submission_time, duration, application,
  num_gpus, num_cpus, bandwidth, exec_plan, steps, is_sla``);
* YMIR's fine-tuning workloads (Titan's FMTrace samples: ``name,
  submission_time, application, num_gpus, target_batch_size, target_lr,
  target_gradient_steps, target_metric``): :func:`load_finetune_workload`.
  Their iterations to target are ground truth, filled in by
  :class:`apportion.experiments.finetune_truth.FinetuneTruth`.

Raw cluster traces (Philly, ITP) carry no model, batch or GPU type: the
papers' adaptations assign them, seeded and documented here:

* :func:`adapt_crius` (Crius section 8.1): a model drawn uniformly from Crius
  table 2 (Wide-ResNet, BERT, MoE at their sizes), a global batch size drawn
  from the model's table-2 list, a GPU count drawn from the Crius trace's own
  mix (1: 5 %, 2: 15 %, 4: 37 %, 8: 33 %, 16: 10 %, measured on
  ``simulate_trace_philly.csv``), a preferred GPU type drawn from the same
  trace's mix (A40 40 %, A10 24 %, A100 18 %, V100 17 %), and iterations =
  duration x the measured throughput of that configuration (ground truth), so
  the job would take its traced duration on what it asked for.
* :func:`morphling_downsample` (Morphling section 7.3): the busiest 12 hours
  of a trace (the window with the most submissions), down-sampled uniformly to
  about 406 jobs (the paper's count); each job gets a random Table-1
  model; a GPU count the model cannot use is replaced by the nearest feasible
  one with the duration rescaled to keep the GPU-hours.
* :func:`synthetic` : Poisson arrivals with a size mix and a model mix.

Only paths are stored; large files are read from ``data_root()``
(``$APPORTION_DATA`` or ``../shared/data`` next to the repository).
"""

from __future__ import annotations

import csv
import io
import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from apportion.errors import InputError
from apportion.inputs import (
    MAX_FIELD_CHARS,
    MAX_TRACE_BYTES,
    CsvTable,
    check_input_file,
    parse_csv_text,
    parse_number,
    read_head,
    read_text,
)
from apportion.jobs import control_characters

log = logging.getLogger(__name__)


def data_root() -> Path:
    """Where the real data lives: ``$APPORTION_DATA`` or ``<repo>/../shared/data``
    (:func:`apportion.env.data_root`, the one rule)."""
    from apportion.env import data_root as root

    return root()


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


#: What :func:`load_any` can tell a trace file is, from its content (never its path):
#: ``gavel`` (Gavel's .trace), ``gavel-csv`` (a normalised CSV of Gavel job types, with
#: ``total_steps``), ``crius``, ``morphling``, ``elasticflow`` (a normalised CSV of
#: ElasticFlow's models), ``raw`` (a cluster trace without models: Philly, ITP),
#: ``synthetic``. The ground truth of a simulation follows it.
FORMATS = ("gavel", "gavel-csv", "crius", "morphling", "elasticflow", "raw", "synthetic",
           "finetune")
#: ElasticFlow's measured models (its ``throughputs_*/<model>.csv`` tables).
ELASTICFLOW_MODELS = frozenset({"bert", "deepspeech2", "gpt2", "inception3", "resnet50",
                                "resnet50_cifar10", "vgg16"})


@dataclass
class Trace:
    name: str
    jobs: list[SimJob]
    source: str = ""
    notes: list[str] = field(default_factory=list)
    format: str = ""  # one of FORMATS, detected from the content

    def __len__(self) -> int:
        return len(self.jobs)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([j.__dict__ for j in self.jobs])

    def window(self, start_s: float, end_s: float, rebase: bool = True) -> Trace:
        """Jobs submitted in ``[start_s, end_s)``, submit times rebased to 0."""
        js = [j for j in self.jobs if start_s <= j.submit_s < end_s]
        if rebase:
            js = [replace(j, submit_s=j.submit_s - start_s,
                          deadline_s=None if j.deadline_s is None else j.deadline_s - start_s)
                  for j in js]
        return Trace(f"{self.name}[{start_s:.0f}:{end_s:.0f}]", js, self.source,
                     self.notes + [f"window {start_s:.0f}-{end_s:.0f} s"], self.format)

    def head(self, n: int) -> Trace:
        return Trace(f"{self.name}[:{n}]", self.jobs[:n], self.source, self.notes + [f"first {n}"],
                     self.format)


def _sorted(jobs: list[SimJob]) -> list[SimJob]:
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def _check_file(path: Path) -> None:
    """An existing regular file (a FIFO or a device is refused before it is opened)."""
    if not path.exists() and not path.is_symlink():
        raise InputError(str(path), "(file)", "no such trace file")
    check_input_file(path, "trace")


#: Bounds on a trace's numbers: past them a replay's arithmetic overflows or means nothing
#: (a year is 3.2e7 s; the biggest public trace has 10^5 jobs of at most 2,048 GPUs).
MAX_TRACE_SECONDS = 1e12
MAX_TRACE_GPUS = 1_000_000
MAX_TRACE_ITERATIONS = 1e15
_SECONDS = {"minimum": 0.0, "maximum": MAX_TRACE_SECONDS}
_ANY_SECONDS = {"minimum": -MAX_TRACE_SECONDS, "maximum": MAX_TRACE_SECONDS}
_GPUS = {"integer": True, "minimum": 0, "maximum": MAX_TRACE_GPUS}
_POSITIVE_COUNT = {"integer": True, "minimum": 1, "maximum": MAX_TRACE_GPUS}
_ITERATIONS = {"minimum": 0.0, "maximum": MAX_TRACE_ITERATIONS}


def _read_trace_csv(p: Path, required: tuple[str, ...], id_column: str,
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
    _check_file(p)
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


# ---------------------------------------------------------------------------
# Normalised CSV
# ---------------------------------------------------------------------------
REQUIRED = ("job_id", "submit_time_s", "num_gpus", "duration_s")


def load_normalised_csv(path: str | Path, limit: int | None = None) -> Trace:
    """Read a normalised CSV; optional columns fill the matching SimJob fields.

    Jobs without a duration and without iterations are dropped (logged)."""
    p = Path(path)
    text, _ = _read_trace_csv(
        p, REQUIRED, "job_id",
        {"submit_time_s": _SECONDS, "num_gpus": _GPUS, "duration_s": _ANY_SECONDS,
         "iterations": _ITERATIONS, "total_steps": _ITERATIONS,
         "v100_est_duration_s": _ANY_SECONDS, "batch_size": _POSITIVE_COUNT,
         "deadline_s": _ANY_SECONDS},
        optional=frozenset({"duration_s", "iterations", "total_steps", "v100_est_duration_s",
                            "deadline_s"}))
    try:
        df = pd.read_csv(io.StringIO(text), nrows=limit, dtype={"job_id": str})
    except Exception as exc:  # noqa: BLE001 (pandas raises many types for bad CSV)
        raise InputError(str(p), "(file)", f"not a readable CSV: {exc}") from None
    jobs: list[SimJob] = []
    dropped = 0
    has = set(df.columns)
    for r in df.itertuples(index=False):
        d = r._asdict()
        dur = d.get("duration_s")
        dur = None if dur is None or (isinstance(dur, float) and math.isnan(dur)) else float(dur)
        iters = d.get("iterations", d.get("total_steps"))
        iters = None if iters is None or (isinstance(iters, float) and math.isnan(iters)) else float(iters)
        if dur is None and "v100_est_duration_s" in has:
            dur = float(d["v100_est_duration_s"])
        gpus = int(d["num_gpus"])
        if gpus <= 0 or ((dur is None or dur <= 0) and not iters):
            dropped += 1
            continue
        model = d.get("model") if "model" in has else None
        dl = d.get("deadline_s") if "deadline_s" in has else None
        jobs.append(SimJob(
            job_id=str(d["job_id"]), submit_s=float(d["submit_time_s"]), gpus=gpus,
            iterations=iters or 0.0, job_type=str(model) if model is not None else "unknown",
            model=None, batch=int(d["batch_size"]) if "batch_size" in has else 1,
            gpu_type=str(d["gpu_type"]) if "gpu_type" in has and isinstance(d["gpu_type"], str) else None,
            tenant=str(d.get("tenant", d.get("cluster", "default"))),
            deadline_s=None if dl is None or (isinstance(dl, float) and math.isnan(dl)) else float(dl),
            duration_s=dur))
    notes = []
    if dropped:
        log.info("%s: dropped %d jobs without duration or GPUs", p, dropped)
        notes.append(f"dropped {dropped} rows with zero or missing duration or GPUs")
    unordered = sum(1 for a, b in itertools.pairwise(jobs) if b.submit_s < a.submit_s)
    if unordered:
        log.info("%s: %d submit times out of order; sorted", p, unordered)
        notes.append(f"{unordered} submit times out of order (sorted)")
    return Trace(p.stem, _sorted(jobs), str(p), notes, _normalised_format(df))


def _normalised_format(df: pd.DataFrame) -> str:
    """Which measured tables a normalised CSV's jobs belong to, from its columns and models."""
    cols = set(df.columns)
    if cols & {"total_steps", "v100_est_duration_s"}:
        return "gavel-csv"
    if "model" in cols:
        models = {str(m) for m in df["model"].dropna().unique()}
        if models and models <= ELASTICFLOW_MODELS:
            return "elasticflow"
    return "raw"


# ---------------------------------------------------------------------------
# Gavel .trace
# ---------------------------------------------------------------------------
def load_gavel_trace(path: str | Path) -> Trace:
    """Gavel's 10-field trace: one job per line, ``total_steps`` steps at ``scale_factor`` GPUs."""
    p = Path(path)
    _check_file(p)
    src = str(p)
    jobs = []
    for i, line in enumerate(read_text(p, "trace", max_bytes=MAX_TRACE_BYTES).splitlines()):
        if not line.strip():
            continue
        where = f"line {i + 1}"
        f = line.split("\t")
        if len(f) != 10:
            raise InputError(src, where, f"expected 10 tab-separated fields, got {len(f)}")
        if any(len(x) > MAX_FIELD_CHARS for x in f):
            raise InputError(src, where, f"a field of more than {MAX_FIELD_CHARS} characters")
        steps = int(parse_number(f[5], src, f"{where}, field 6 (total_steps)", integer=True,
                                 minimum=1, maximum=MAX_TRACE_ITERATIONS))
        sf = int(parse_number(f[6], src, f"{where}, field 7 (scale_factor)", integer=True,
                              minimum=1, maximum=MAX_TRACE_GPUS))
        prio = float(parse_number(f[7], src, f"{where}, field 8 (priority_weight)",
                                  minimum=0.0, maximum=1e6))
        slo = float(parse_number(f[8], src, f"{where}, field 9 (SLO)",
                                 minimum=-MAX_TRACE_SECONDS, maximum=MAX_TRACE_SECONDS))
        arrival = float(parse_number(f[9], src, f"{where}, field 10 (arrival_time)",
                                     **_SECONDS))
        jobs.append(SimJob(job_id=f"{i:05d}", submit_s=arrival, gpus=sf, iterations=float(steps),
                           job_type=f[0], priority_weight=prio,
                           deadline_s=None if slo < 0 else arrival + slo))
    return Trace(p.stem, jobs, str(p), format="gavel")  # Gavel keeps file order for ties


# ---------------------------------------------------------------------------
# Crius's adapted traces
# ---------------------------------------------------------------------------
CRIUS_TYPES = {"a100": "A100-40GB", "a40": "A40", "a10": "A10", "v100": "V100-32GB",
               "h100": "H100-80GB", "l20": None}
_SIZE_TO_CATALOG = {"500M": "0.5b", "690M": "0.69b", "760M": "0.76b", "1B": "1b", "1.3B": "1.3b",
                    "2B": "2b", "2.4B": "2.4b", "2.6B": "2.6b", "4B": "4b", "6.7B": "6.7b",
                    "6.8B": "6.8b", "10B": "10b", "27B": "27b"}
_FAMILY = {"wide_resnet": "wresnet", "bert": "bert", "moe": "moe"}


def crius_catalog_name(model_name: str) -> str | None:
    """``bert__2.6B`` -> ``bert-2.6b`` (None when the catalog has no such size)."""
    fam, _, size = model_name.partition("__")
    if fam not in _FAMILY or size not in _SIZE_TO_CATALOG:
        return None
    return f"{_FAMILY[fam]}-{_SIZE_TO_CATALOG[size]}"


def crius_key(model_name: str, batch: int) -> str:
    """Ground-truth key of Crius's prof_database: ``bert_2.6B_256``."""
    fam, _, size = model_name.partition("__")
    return f"{fam}_{size}_{batch}"


def load_crius_trace(path: str | Path) -> Trace:
    p = Path(path)
    need = ("job_id", "submission_time", "num_iteration", "model_name", "batch_size", "num_gpu")
    text, _ = _read_trace_csv(p, need, "job_id", {
        "submission_time": _SECONDS, "num_iteration": _ITERATIONS, "batch_size": _POSITIVE_COUNT,
        "num_gpu": _POSITIVE_COUNT, "deadline": _ANY_SECONDS}, optional=frozenset({"deadline"}))
    df = pd.read_csv(io.StringIO(text), dtype={"job_id": str, "model_name": str})
    t0 = float(df["submission_time"].min()) if len(df) else 0.0
    jobs = []
    for r in df.itertuples(index=False):
        gt = CRIUS_TYPES.get(str(r.gpu_type).lower()) if hasattr(r, "gpu_type") else None
        dl = getattr(r, "deadline", None)
        jobs.append(SimJob(
            job_id=str(r.job_id), submit_s=float(r.submission_time) - t0, gpus=int(r.num_gpu),
            iterations=float(r.num_iteration), job_type=crius_key(r.model_name, int(r.batch_size)),
            model=crius_catalog_name(r.model_name), batch=int(r.batch_size), gpu_type=gt,
            deadline_s=None if dl is None or pd.isna(dl) else float(dl) - t0))
    return Trace(p.stem, _sorted(jobs), str(p), [f"submit times rebased by {t0:.0f} s"],
                 "crius")


# ---------------------------------------------------------------------------
# Morphling workloads
# ---------------------------------------------------------------------------
MORPHLING_MODELS = {"vit": "vit-86m", "roberta": "roberta-355m", "bert": "bert-336m",
                    "t5": "t5-1.2b", "gpt2": "gpt2-1.5b", "llama7": "llama2-7b",
                    "llama30": "llama-30b"}


def _morphling_batch(app: str) -> int:
    """Global batch per Morphling model from its artifact's validation scripts (LLaMA-30B
    takes LLaMA-7B's, as the artifact's own profile does)."""
    from apportion.experiments.bench.morphling_data import MODELS

    key = "llama7" if app == "llama30" else app
    return MODELS[key].batch if key in MODELS else 8


def load_morphling_workload(path: str | Path) -> Trace:
    p = Path(path)
    text, _ = _read_trace_csv(
        p, ("name", "submission_time", "duration", "application", "num_gpus", "num_cpus",
            "exec_plan", "steps"), "name",
        {"submission_time": _SECONDS, "duration": _ANY_SECONDS, "num_gpus": _POSITIVE_COUNT,
         "num_cpus": _POSITIVE_COUNT, "steps": _ITERATIONS,
         "is_sla": {"integer": True, "minimum": 0, "maximum": 1}})
    df = pd.read_csv(io.StringIO(text), dtype={"exec_plan": str, "name": str,
                                               "application": str})
    jobs = []
    for r in df.itertuples(index=False):
        app = str(r.application)
        sla = int(getattr(r, "is_sla", 0)) == 1
        jobs.append(SimJob(
            job_id=str(r.name), submit_s=float(r.submission_time), gpus=int(r.num_gpus),
            iterations=float(r.steps), job_type=app, model=MORPHLING_MODELS.get(app),
            batch=_morphling_batch(app), gpu_type="A800-80GB", tenant="A" if sla else "B", guaranteed=sla,
            duration_s=float(r.duration), plan=str(r.exec_plan), cpus=int(r.num_cpus)))
    return Trace(p.stem, _sorted(jobs), str(p), format="morphling")


# ---------------------------------------------------------------------------
# YMIR / Titan fine-tuning workloads
# ---------------------------------------------------------------------------
FINETUNE_COLUMNS = ("name", "submission_time", "application", "num_gpus", "target_batch_size",
                    "target_lr", "target_gradient_steps", "target_metric")
#: GPU type of the throughput profiles the fine-tuning replays use (YMIR simulates on V100)
FINETUNE_GPU = "V100-32GB"


def load_finetune_workload(path: str | Path) -> Trace:
    """A Titan/YMIR workload CSV: one fine-tuning job per row (``backbone@task``).

    Iterations are left at 0: how many a job needs to reach its target is ground
    truth (:meth:`apportion.experiments.finetune_truth.FinetuneTruth.with_iterations`)."""
    p = Path(path)
    _, table = _read_trace_csv(p, FINETUNE_COLUMNS, "name", {
        "submission_time": _SECONDS, "num_gpus": _POSITIVE_COUNT,
        "target_batch_size": _POSITIVE_COUNT,
        "target_metric": {"minimum": -1e12, "maximum": 1e12}})
    jobs = []
    for i, r in table.iter():
        for c in FINETUNE_COLUMNS:
            if not (r.get(c) or "").strip():
                raise InputError(str(p), table.where(i, c), "required value missing")
        backbone, sep, task = r["application"].partition("@")
        if not sep or not backbone or not task:
            raise InputError(str(p), table.where(i, "application"), "must look like "
                             "backbone@task")
        submit, gpus = float(table.number(i, "submission_time")), int(table.number(i, "num_gpus"))
        batch = int(table.number(i, "target_batch_size"))
        target = float(table.number(i, "target_metric"))
        jobs.append(SimJob(job_id=r["name"], submit_s=submit, gpus=gpus, iterations=0.0,
                           job_type=r["application"], batch=batch, gpu_type=FINETUNE_GPU,
                           finetune=FinetuneInfo(backbone, task, r["target_lr"],
                                                 r["target_gradient_steps"], target)))
    return Trace(f"{p.parent.name}" if p.stem.startswith("workload") else p.stem, _sorted(jobs),
                 str(p), format="finetune")


# ---------------------------------------------------------------------------
# Adaptations
# ---------------------------------------------------------------------------
CRIUS_TABLE2 = {  # family -> (sizes as in prof_database keys, batch sizes)
    "wide_resnet": (["500M", "1B", "2B", "4B", "6.8B"], [256, 512, 1024]),
    "bert": (["760M", "1.3B", "2.6B", "6.7B"], [128, 256, 512]),
    "moe": (["690M", "1.3B", "2.4B", "10B", "27B"], [256, 512, 1024]),
}
CRIUS_GPU_MIX = {1: 0.05, 2: 0.15, 4: 0.37, 8: 0.33, 16: 0.10}
CRIUS_TYPE_MIX = {"A40": 0.40, "A10": 0.24, "A100-40GB": 0.18, "V100-32GB": 0.18}


def adapt_crius(trace: Trace, truth: Any, seed: int = 0, max_iterations: float = 1e7) -> Trace:
    """Crius 8.1: model, batch, GPU count and type at random; iterations from duration.

    ``truth`` is a ground truth (:mod:`apportion.experiments.groundtruth`) giving
    the measured throughput used to turn the traced duration into iterations.
    Draws that no GPU type can run (out of memory everywhere) are redrawn."""
    rng = np.random.default_rng(seed)
    families = list(CRIUS_TABLE2)
    counts, pc = zip(*CRIUS_GPU_MIX.items())
    types, pt = zip(*CRIUS_TYPE_MIX.items())
    out = []
    for j in trace.jobs:
        dur = j.duration_s or 0.0
        if dur <= 0:
            continue
        for _ in range(50):
            fam = families[rng.integers(len(families))]
            sizes, batches = CRIUS_TABLE2[fam]
            size = sizes[rng.integers(len(sizes))]
            batch = int(batches[rng.integers(len(batches))])
            gpus = int(counts[rng.choice(len(counts), p=np.array(pc) / sum(pc))])
            gtype = str(types[rng.choice(len(types), p=np.array(pt) / sum(pt))])
            key = f"{fam}_{size}_{batch}"
            probe = SimJob(j.job_id, j.submit_s, gpus, 1.0, key, batch=batch)
            rate = truth.rate(probe, gtype, gpus)
            if rate > 0:
                break
        else:
            continue
        name = f"{fam}__{size}"
        iters = min(max_iterations, max(1.0, math.ceil(dur * rate)))
        out.append(replace(j, gpus=gpus, iterations=float(iters), job_type=key,
                           model=crius_catalog_name(name), batch=batch, gpu_type=gtype))
    return Trace(f"{trace.name}-crius-s{seed}", out, trace.source,
                 trace.notes + [f"adapt_crius seed={seed}"], "crius")


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


MORPHLING_FEASIBLE_GPUS = {  # GPU counts each model can use on 8-GPU A800 nodes (workloads)
    "vit": [1, 2, 4, 8], "roberta": [1, 2, 4, 8], "bert": [1, 2, 4, 8], "t5": [1, 2, 4, 8],
    "gpt2": [1, 2, 4, 5, 8, 16], "llama7": [4, 8, 16, 24, 32], "llama30": [16, 24, 32, 40, 48],
}


def morphling_downsample(trace: Trace, cluster_gpus: int = 64, source_gpus: int = 2490,
                         hours: float = 12.0, seed: int = 0, target_jobs: int | None = 406) -> Trace:
    """Morphling 7.3: busiest ``hours`` (most submissions), down-sampled, Table-1 models.

    The paper samples "proportionally to the cluster sizes" and gets 406 jobs;
    Philly's busiest 12 hours hold far fewer than 406 x 2490/64 jobs, so the
    sampling rate is set to reach ``target_jobs`` (default 406); with
    ``target_jobs=None`` it is ``cluster_gpus / source_gpus`` (Philly's 2,490
    GPUs, Jeon et al. ATC'19)."""
    rng = np.random.default_rng(seed)
    s, e = busiest_window(trace, hours)
    win = trace.window(s, e)
    rate = (min(1.0, target_jobs / max(1, len(win.jobs))) if target_jobs
            else cluster_gpus / source_gpus)
    keep = rng.random(len(win.jobs)) < rate
    apps = list(MORPHLING_FEASIBLE_GPUS)
    out = []
    for j, k in zip(win.jobs, keep):
        if not k:
            continue
        app = apps[rng.integers(len(apps))]
        ok = MORPHLING_FEASIBLE_GPUS[app]
        gpus = min(ok, key=lambda g: (abs(g - j.gpus), g))
        dur = (j.duration_s or 0.0) * j.gpus / gpus
        out.append(replace(j, gpus=gpus, duration_s=dur, job_type=app,
                           model=MORPHLING_MODELS[app], gpu_type="A800-80GB"))
    return Trace(f"{trace.name}-morphling-s{seed}", out, trace.source,
                 trace.notes + [f"busiest {hours} h from {s:.0f} s, sampled {cluster_gpus}/{source_gpus}"],
                 "morphling")


def with_iterations(trace: Trace, truth: Any, gpu_type: str | None = None) -> Trace:
    """Iterations = duration x measured throughput at the job's GPUs (and type)."""
    out = []
    for j in trace.jobs:
        t = gpu_type or j.gpu_type
        rate = truth.rate(j, t, j.gpus) if t else 0.0
        if rate <= 0 or not j.duration_s:
            continue
        out.append(replace(j, iterations=float(max(1.0, round(j.duration_s * rate)))))
    return Trace(trace.name, out, trace.source, trace.notes + ["iterations from duration"],
                 trace.format)


def synthetic(n: int = 200, rate_per_h: float = 20.0, seed: int = 0,
              sizes: dict[int, float] | None = None,
              models: dict[str, float] | None = None,
              iterations: tuple[float, float] = (500.0, 5000.0),
              gpu_types: list[str] | None = None) -> Trace:
    """Poisson arrivals (``rate_per_h``), GPU counts and catalog models from mixes.

    ``job_type`` is the catalog model name, so the analytic ground truth applies."""
    rng = np.random.default_rng(seed)
    sizes = sizes or {1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15}
    models = models or {"bert-0.76b": 0.3, "moe-0.69b": 0.2, "wresnet-0.5b": 0.3, "bert-1.3b": 0.2}
    sk, sp = zip(*sizes.items())
    mk, mp = zip(*models.items())
    t = 0.0
    jobs = []
    for i in range(n):
        t += float(rng.exponential(3600.0 / rate_per_h))
        m = str(mk[rng.choice(len(mk), p=np.array(mp) / sum(mp))])
        g = int(sk[rng.choice(len(sk), p=np.array(sp) / sum(sp))])
        it = float(round(math.exp(rng.uniform(math.log(iterations[0]), math.log(iterations[1])))))
        gt = gpu_types[rng.integers(len(gpu_types))] if gpu_types else None
        jobs.append(SimJob(f"syn-{i:05d}", round(t, 3), g, it, m, model=m, batch=256, gpu_type=gt))
    return Trace(f"synthetic-n{n}-s{seed}", jobs, "synthetic", [f"poisson {rate_per_h}/h"],
                 "synthetic")


def detect_format(path: str | Path) -> str:
    """The format of a trace file from its first line: ``gavel`` (10 tab-separated fields, or
    a ``.trace`` file), ``crius``, ``morphling``, or ``csv`` (a normalised CSV, told apart by
    its columns and models once read, see :func:`load_normalised_csv`)."""
    p = Path(path)
    _check_file(p)
    head = read_head(p, "trace").decode("utf-8", "replace")  # the loader decodes strictly
    first = head.splitlines()[0] if head else ""
    if p.suffix == ".trace" or first.count("\t") == 9:
        return "gavel"
    header = next(csv.reader([first]), [])
    cols = {c.strip().lstrip("\ufeff") for c in header}
    if {"submission_time", "num_iteration", "model_name"} <= cols:
        return "crius"
    if {"name", "application", "exec_plan"} <= cols:
        return "morphling"
    if set(FINETUNE_COLUMNS) <= cols:
        return "finetune"
    return "csv"


def load_any(path: str | Path) -> Trace:
    """Detect the format of a file by its content (:func:`detect_format`) and load it."""
    fmt = detect_format(path)
    if fmt == "gavel":
        return load_gavel_trace(path)
    if fmt == "crius":
        return load_crius_trace(path)
    if fmt == "morphling":
        return load_morphling_workload(path)
    if fmt == "finetune":
        return load_finetune_workload(path)
    return load_normalised_csv(path)
