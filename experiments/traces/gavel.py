"""Gavel's traces: its 10-field tab-separated ``.trace`` files, and normalised CSVs of its
job types (``total_steps`` per job, as ``gavel_msr_seed0.csv``). Both replay on Gavel's
measured throughputs (26 job types x V100/P100/K80 x 1-8 GPUs), keyed by the job type.

The ``.trace`` fields: job_type, command, working directory, num_steps_arg,
needs_data_dir, total_steps, scale_factor, priority_weight, SLO, arrival_time.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from apportion.experiments.traces.base import (
    MAX_TRACE_GPUS,
    MAX_TRACE_ITERATIONS,
    MAX_TRACE_SECONDS,
    SECONDS,
    SimJob,
    Trace,
    check_trace_file,
)
from apportion.experiments.traces.normalised import REQUIRED, load_normalised_csv
from apportion.experiments.traces.registry import Sniff, TraceFormat, register

from apportion.errors import InputError
from apportion.inputs import MAX_FIELD_CHARS, MAX_TRACE_BYTES, parse_number, read_text


def load_gavel_trace(path: str | Path) -> Trace:
    """Gavel's 10-field trace: one job per line, ``total_steps`` steps at ``scale_factor`` GPUs."""
    p = Path(path)
    check_trace_file(p)
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
                                     **SECONDS))
        jobs.append(SimJob(job_id=f"{i:05d}", submit_s=arrival, gpus=sf, iterations=float(steps),
                           job_type=f[0], priority_weight=prio,
                           deadline_s=None if slo < 0 else arrival + slo))
    return Trace(p.stem, jobs, str(p), format="gavel")  # Gavel keeps file order for ties


def _is_gavel_trace(s: Sniff) -> bool:
    """Ten tab-separated fields on the first line, or a ``.trace`` file (Gavel's own name
    for them; the loader then checks every line's fields)."""
    return s.path.suffix == ".trace" or s.first_line.count("\t") == 9


def example(folder: Path) -> str:
    """Two jobs of Gavel's measured types, a .trace file."""
    f = folder / "small.trace"
    f.write_text("ResNet-18 (batch size 128)\tpython3 main.py\tcifar10\t--num_steps\t1\t2000"
                 "\t1\t1\t-1.000000\t0\n"
                 "Transformer (batch size 128)\tpython3 train.py\ttranslation\t-step\t1\t346"
                 "\t2\t1\t-1.000000\t60\n")
    return str(f)


def example_csv(folder: Path) -> str:
    """Two jobs of Gavel's measured types as a normalised CSV."""
    f = folder / "gavel-jobs.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s,tenant,model,total_steps,"
                 "v100_est_duration_s\n"
                 "a,0,1,,t,ResNet-18 (batch size 128),2000,400\n"
                 "b,60,2,,t,Transformer (batch size 128),346,300\n")
    return str(f)


GAVEL = register(TraceFormat(
    name="gavel", doc="Gavel's .trace files (job type, steps, scale factor, arrival)",
    load=load_gavel_trace, detect=_is_gavel_trace,
    detected_by="10 tab-separated fields a line (Gavel's .trace)", truth="gavel",
    example=example, example_cluster="4:4:4"))

GAVEL_CSV = register(TraceFormat(
    name="gavel-csv", doc="a normalised CSV of Gavel's job types (model: the job type)",
    load=partial(load_normalised_csv, fmt="gavel-csv"), columns=REQUIRED,
    any_of=("total_steps", "v100_est_duration_s"), priority=40, truth="gavel",
    example=example_csv, example_cluster="4:4:4"))
