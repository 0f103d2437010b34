"""A user's own workload: a normalised CSV of their jobs, with their models, replayed on
their own measured throughputs.

Columns (a contract, docs/evaluation.md): ``job_id, submit_time_s, num_gpus, model,
batch_size`` and ``iterations`` or ``duration_s`` (or both); optional ``gpu_type``,
``tenant``, ``deadline_s``, ``max_gpus`` and ``elastic`` (``true`` / ``false``: whether the job
may run on other GPU counts than its own; true where not given). ``model`` is any name: a catalog model (``bert-1.3b``) or one
the catalog lacks (``cifar10``), which the round schedules from the rates the view gives,
as the baselines do. The rates are the ground truth of the replay:

* ``--tables FILE`` (the measured iteration-times CSV ``solve-round --tables`` reads:
  ``model, gpu_type, gpus, iter_time_s[, global_batch_size]``, interpolated between
  measured GPU counts), or
* without it, apportion's analytic model, which knows catalog models only.

A job with ``iterations`` runs that many; one with only ``duration_s`` and a ``gpu_type``
runs what that duration is worth at its GPU type and count under the truth's rates (a
substitution the summary records). Nothing is read into the file: a job without work, a
model the truth cannot rate on the cluster, a GPU type the catalog lacks, are each
refused by name. A catalog alias of a GPU type (``a100``) is renamed to the catalog's
name, and that is recorded.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from apportion.experiments.traces.base import (
    ANY_SECONDS,
    ITERATIONS,
    MAX_TRACE_SECONDS,
    POSITIVE_COUNT,
    SECONDS,
    SimJob,
    Substitution,
    SubstitutionLog,
    Trace,
    elasticity,
    read_trace_csv,
    sorted_jobs,
)
from apportion.experiments.traces.registry import Preparation, TraceFormat, register

from apportion.errors import CatalogError, InputError
from apportion.gpus import canonical_gpu_name
from apportion.jobs import control_characters

COLUMNS = ("job_id", "submit_time_s", "num_gpus", "model", "batch_size")
WORK = ("iterations", "duration_s")
_DURATION = {"minimum": 0.0, "maximum": MAX_TRACE_SECONDS}


def load_workload(path: str | Path) -> Trace:
    """Read a user's workload, refusing (line and column named) what it cannot replay as
    written."""
    p = Path(path)
    src = str(p)
    _, table = read_trace_csv(
        p, COLUMNS, "job_id",
        {"submit_time_s": SECONDS, "num_gpus": POSITIVE_COUNT, "batch_size": POSITIVE_COUNT,
         "iterations": ITERATIONS, "duration_s": _DURATION, "deadline_s": ANY_SECONDS,
         "max_gpus": POSITIVE_COUNT},
        optional=frozenset({"iterations", "duration_s", "deadline_s", "max_gpus"}))
    jobs: list[SimJob] = []
    subs = SubstitutionLog()
    for i, r in table.iter():
        model = (r.get("model") or "").strip()
        if not model:
            raise InputError(src, table.where(i, "model"), "is empty: each job names its model")
        bad = control_characters(model)
        if bad:
            raise InputError(src, table.where(i, "model"),
                             f"contains control characters ({', '.join(bad)})")
        iters = table.optional_number(i, "iterations", **ITERATIONS)
        dur = table.optional_number(i, "duration_s", **_DURATION)
        given = (r.get("gpu_type") or "").strip() or None
        gpu_type = None
        if given is not None:
            try:
                gpu_type = canonical_gpu_name(given)
            except CatalogError as exc:
                raise InputError(src, table.where(i, "gpu_type"), str(exc)) from None
        if not iters and not (dur and gpu_type):
            raise InputError(src, table.where(i, "iterations"), "the job's work is unknown: "
                             "give its iterations, or its duration_s and the gpu_type it ran "
                             "on (its iterations are then that duration at the truth's rate)")
        dl = table.optional_number(i, "deadline_s", **ANY_SECONDS)
        top, elastic = elasticity(table, i)
        j = SimJob(job_id=r["job_id"], submit_s=float(table.number(i, "submit_time_s")),
                   gpus=int(table.number(i, "num_gpus")), iterations=float(iters or 0.0),
                   job_type=model, model=model, batch=int(table.number(i, "batch_size")),
                   gpu_type=gpu_type, tenant=(r.get("tenant") or "").strip() or "default",
                   deadline_s=None if dl is None else float(dl),
                   duration_s=None if dur is None else float(dur), max_gpus=top,
                   elastic=elastic)
        jobs.append(j)
        subs.add("gpu_type", given, gpu_type, "the catalog's name of the type", j.job_id)
    notes = []
    unordered = sum(1 for a, b in itertools.pairwise(jobs) if b.submit_s < a.submit_s)
    if unordered:
        notes.append(f"{unordered} submit times out of order (sorted)")
    return Trace(p.stem, sorted_jobs(jobs), src, notes, "workload", subs.substitutions())


def iterations_from_durations(trace: Trace, prep: Preparation) -> Trace:
    """Each job given only a duration runs what that duration is worth at its GPU type
    and count under the replay's truth; one the truth cannot rate there is refused."""
    out, derived = [], []
    for j in trace.jobs:
        if j.iterations > 0:
            out.append(j)
            continue
        if j.gpu_type is None or not j.duration_s:  # the loader refuses these; a hand-made
            raise InputError(trace.source or trace.name, f"job {j.job_id}",  # trace may not
                             "no iterations, and no duration_s and gpu_type to derive them")
        rate = float(prep.truth.rate(j, j.gpu_type, j.gpus))
        if rate <= 0:
            raise InputError(trace.source or trace.name, f"job {j.job_id}", f"its duration_s "
                             f"cannot become iterations: the {prep.truth_name} truth has no "
                             f"rate for model {j.model} (batch {j.batch}) on {j.gpus} "
                             f"{j.gpu_type}; give its iterations, or rates for it")
        out.append(replace(j, iterations=float(max(1.0, round(j.duration_s * rate)))))
        derived.append(j.job_id)
    if not derived:
        return trace
    sub = Substitution("iterations", "(none)", "duration_s x the rate at its gpu_type and "
                       "num_gpus", f"the job gives a duration, not iterations: its work is "
                       f"that duration at the {prep.truth_name} truth's rate", tuple(derived))
    return trace.derived(out, note="iterations from duration", substitutions=[sub])


def example(folder: Path) -> str:
    """Three jobs of catalog models (the analytic truth rates them without a table)."""
    f = folder / "my-workload.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s,model,batch_size,iterations,"
                 "gpu_type\n"
                 "a,0,2,,bert-0.76b,64,400,\n"
                 "b,30,4,,wresnet-0.5b,256,300,A40\n"
                 "c,60,1,600,bert-0.76b,64,,A10\n")
    return str(f)


WORKLOAD = register(TraceFormat(
    name="workload", doc="your own workload: a normalised CSV of your models, replayed on "
    "your measured rates (--tables) or, for catalog models, the analytic model",
    load=load_workload, columns=COLUMNS, any_of=WORK, priority=20, truth="analytic",
    prepare=iterations_from_durations, coverage="every", example=example))
