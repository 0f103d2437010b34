"""The trace format check: a format keeps the registry's promises (detection from content,
loading, a short replay of its example)."""

from __future__ import annotations

import csv
import io
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from apportion.errors import InputError
from apportion.experiments import trace_catalog, truths
from apportion.experiments.harness import prepare_one
from apportion.experiments.traces import (
    COVERAGE,
    Trace,
    TraceFormat,
    detect,
    formats,
    load_any,
)
from apportion.testing.failures import check, expect


@check
def check_trace_format(fmt: Any, sample: str | None = None, cluster: str | None = None,
                       tables: str | None = None, replay: bool = True,
                       folder: str | None = None) -> Trace:
    """A trace format keeps the registry's promises, on ``sample`` (a ``--trace``
    argument: a file of the format, or a generated family's name) or, without one, on the
    trace its ``example`` writes:

    * it is registered (``fmt``: its name, or the :class:`TraceFormat`), declares how it
      is detected and loaded, and names registered truths;
    * the registry detects the sample as this format and no other, from its content (a
      copy under a neutral name too), and a header missing any of its columns is not
      detected as it;
    * loading gives a trace of this format with jobs (unique ids, whole positive GPU
      counts, finite times and work), the same twice, whose substitutions concern its jobs;
    * with ``replay``, a short replay on ``cluster`` (default: the format's
      ``example_cluster``; ``tables``: measured iteration times as its truth) finishes
      jobs, and its summary names the format and carries the trace's substitutions.

    Raises :class:`AssertionError` naming what failed; returns the trace loaded."""
    every = formats()
    name = fmt.name if isinstance(fmt, TraceFormat) else str(fmt)
    expect(name in every, f"{name!r} is not a registered trace format (register() it, or "
           f"declare it in the apportion.trace_formats entry points): {sorted(every)}")
    f = every[name]
    expect(not isinstance(fmt, TraceFormat) or fmt is f,
           f"{name}: another format is registered under its name")
    expect(name and name == name.strip() and " " not in name, f"{name!r}: not a usable name")
    expect(f.doc.strip(), f"{name}: no doc (apportion traces shows it)")
    expect(callable(f.load), f"{name}: load is not callable")
    expect(f.coverage in COVERAGE, f"{name}: coverage {f.coverage!r} not one of {COVERAGE}")
    expect(f.generated or f.columns or f.any_of or f.detect is not None,
           f"{name}: declares no detection (columns, any_of or detect)")
    names = truths.truth_names()
    expect(callable(f.truth) or f.truth in names,
           f"{name}: truth {f.truth!r} is not a registered ground truth ({', '.join(names)})")
    for t in f.truths or ():
        expect(t in names, f"{name}: truths names {t!r}, not a registered ground truth")
    expect(f.truths is None or callable(f.truth) or f.truth in f.truths,
           f"{name}: its own truth {f.truth!r} is not among the truths it allows")
    work = Path(folder or tempfile.mkdtemp(prefix="apportion-trace-check-"))
    expect(sample is not None or f.example is not None,
           f"{name}: no example to check (give sample=, or declare example)")
    arg = str(sample) if sample is not None else str(f.example(work))  # type: ignore[misc]
    if f.generated:
        trace = trace_catalog.load_trace(arg)
        expect(trace.format == name, f"{name}: {arg} generated a {trace.format!r} trace")
    else:
        trace = _check_trace_file(f, Path(arg), work)
    _check_trace_jobs(name, trace)
    if replay:
        where = cluster or f.example_cluster
        try:
            run = prepare_one(arg, where, "fcfs", max_jobs=8, tables=tables,
                              sim_options={"deterministic": True})
        except Exception as exc:  # the check names what failed
            raise AssertionError(f"{name}: {arg} does not replay on {where}: {exc}") from exc
        res = run()
        s = res.summary
        expect(s.get("trace_format") == name, f"{name}: the summary's trace_format is "
               f"{s.get('trace_format')!r}")
        expect(s.get("finished", 0) >= 1, f"{name}: no job of {arg} finished on {where} "
               f"({s.get('jobs')} jobs, truth {s.get('truth')})")
        expect(s.get("substitutions") == run.trace.substitution_report(),
               f"{name}: the summary's substitutions are not the trace's")
    return trace


def _check_trace_file(f: TraceFormat, path: Path, work: Path) -> Trace:
    """Detection and loading of a file of format ``f`` (see :func:`check_trace_format`)."""
    name = f.name
    expect(path.is_file(), f"{name}: the sample {path} is not a file")
    got = detect(path).name
    expect(got == name, f"{name}: {path} is detected as {got!r}")
    neutral = work / "renamed-sample.data"  # no telling suffix, another folder
    if neutral.resolve() != path.resolve():
        shutil.copyfile(path, neutral)
        got = detect(neutral).name
        expect(got == name, f"{name}: a copy named {neutral.name} is detected as {got!r} "
               "(detection must read the content, not the name)")
    text = path.read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    header = next(csv.reader([first]), [])
    for col in f.columns:
        if col not in header:
            continue
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow([c if c != col else f"{col}_x"
                                                     for c in header])
        variant = work / f"without-{col}.csv"
        variant.write_text(out.getvalue() + "\n" + rest, encoding="utf-8")
        try:
            other = detect(variant).name
        except InputError:
            continue  # refused by name: never read as this format
        expect(other != name, f"{name}: a file without column {col} is still detected as it")
    trace = load_any(path)
    expect(trace.format == name, f"{name}: load_any gave a {trace.format!r} trace")
    again = load_any(path)
    expect(again.jobs == trace.jobs, f"{name}: two loads of {path} differ")
    return trace


def _check_trace_jobs(name: str, trace: Trace) -> None:
    """The jobs of a loaded trace are replayable as they are (see :func:`check_trace_format`)."""
    jobs = trace.jobs
    expect(jobs, f"{name}: the sample has no jobs")
    ids = [j.job_id for j in jobs]
    expect(len(set(ids)) == len(ids), f"{name}: job ids are not unique")
    for j in jobs:
        expect(isinstance(j.gpus, int) and j.gpus >= 1, f"{name}: job {j.job_id} asks for "
               f"{j.gpus!r} GPUs")
        expect(math.isfinite(j.submit_s) and math.isfinite(j.iterations) and j.iterations >= 0,
               f"{name}: job {j.job_id} has submit {j.submit_s!r}, iterations {j.iterations!r}")
        expect(isinstance(j.batch, int) and j.batch >= 1, f"{name}: job {j.job_id} has batch "
               f"{j.batch!r}")
    for sub in trace.substitutions:
        expect(sub.field and sub.why, f"{name}: a substitution without its field or reason")
        expect(set(sub.jobs) <= set(ids), f"{name}: a substitution names jobs not in the trace")


__all__ = ["check_trace_format"]
