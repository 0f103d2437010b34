"""Traces by name: the bundled data sets, the generated families and files, one door.

``load_trace(name_or_path, seed)`` is what ``simulate --trace`` and ``compare --trace``
read: a bundled name (:data:`BUNDLED`, files under ``APPORTION_DATA``), a generated
family (``synthetic[:N]``, ``fm-generated[:N[:backbone]]``, YMIR's workload recipe) or
a path. A file that exists is always the file: a generated family's name never shadows
it (``synthetic_mine.csv`` is read, not generated), and its format is detected from its
content by the registered formats (:func:`apportion.experiments.traces.load_any`): a
file none detects is refused. Bad counts exit 2 naming the flag.
"""

from __future__ import annotations

from pathlib import Path

from apportion.experiments.finetune_truth import generated_trace
from apportion.experiments.traces import Trace, data_root, load_any, synthetic

from apportion.errors import InputError
from apportion.memory_guard import check_trace_fits

# generated jobs a family may ask for: enough for any replay, never a memory exhaustion
MAX_GENERATED_JOBS = 1_000_000

BUNDLED = {
    "philly": "traces/philly.csv",
    "itp": "traces/itp.csv",
    "gavel-msr": "traces/gavel_msr_seed0.csv",
    "elasticflow-philly": "traces/elasticflow_philly_103959.csv",
    "gavel-max-min-fairness": "gavel/max_min_fairness.trace",
    "gavel-minimize-makespan": "gavel/minimize_makespan.trace",
    "gavel-small": "gavel/small_test.trace",
    "gavel-medium": "gavel/medium_test.trace",
    "gavel-artifact": "gavel/artifact_evaluation.trace",
    "crius-philly": "crius/traces/simulate_trace_philly.csv",
    "crius-venus": "crius/traces/simulate_trace_venus.csv",
    "crius-pai": "crius/traces/simulate_trace_pai.csv",
    "crius-runtime": "crius/traces/runtime_trace.csv",
    "morphling-base": "morphling/workloads/workload-base.csv",
    "morphling-bp": "morphling/workloads/workload-bp.csv",
    "morphling-mt": "morphling/workloads/workload-mt.csv",
    **{f"fm-{load}-{fm}": f"titan-finetune/traces/FM-{load}-{fm}/workload-0.csv"
       for load in ("1", "1.5", "2") for fm in ("roberta-base", "roberta-large")},
    # Pollux's 8 workloads at 0.5x-2x job load (its pollux_reference figures' rows)
    **{f"pollux-{load}-{n}": f"pollux/{folder}/workload-{n}.csv"
       for load, folder in (("0.5", "workloads-0.5"), ("1.0", "workloads"),
                            ("1.5", "workloads-1.5"), ("2.0", "workloads-2.0"))
       for n in range(1, 9)},
}


#: the generated families a ``--trace`` name may ask for, and what each makes
GENERATED = {"synthetic[:N]": "generated: Poisson arrivals of catalog models (synthetic "
             "format; --seed)",
             "fm-generated[:N[:backbone]]": "generated: YMIR's fine-tuning workload recipe "
             "(finetune format; --seed)"}


def _count(spec: str, part: str, default: int) -> int:
    if part == "":
        return default
    try:
        n = int(part)
    except ValueError:
        raise InputError(spec, "--trace", f"the job count {part!r} is not a whole "
                         "number") from None
    if not 1 <= n <= MAX_GENERATED_JOBS:
        raise InputError(spec, "--trace", f"the job count must be 1 to "
                         f"{MAX_GENERATED_JOBS:,}, got {n}")
    return n


def generated_family(s: str) -> str | None:
    """The generated family ``s`` names (``synthetic`` or ``fm-generated``), or None."""
    for fam in ("synthetic", "fm-generated"):
        if s == fam or s.startswith(fam + ":"):
            return fam
    return None


def load_trace(name_or_path: str | Path, seed: int = 0) -> Trace:
    """A bundled name (see ``BUNDLED``; ``synthetic`` or ``synthetic:N``; ``fm-generated``
    or ``fm-generated:N[:backbone]``, YMIR's workload recipe) or a file path."""
    s = str(name_or_path)
    if Path(s).exists():  # a file is the file, whatever its name looks like
        check_trace_fits(s, s)
        return load_any(Path(s))
    if seed < 0:
        raise InputError("--seed", "seed", f"must be >= 0, got {seed}")
    fam = generated_family(s)
    if fam == "synthetic":
        return synthetic(n=_count(s, s.partition(":")[2], 200), seed=seed)
    if fam == "fm-generated":
        parts = s.split(":")
        if len(parts) > 3:
            raise InputError(s, "--trace", "expected fm-generated[:N[:backbone]]")
        return generated_trace(_count(s, parts[1] if len(parts) > 1 else "", 120),
                               parts[2] if len(parts) > 2 else "roberta-base", seed)
    if s in BUNDLED:
        path = data_root() / BUNDLED[s]
        if not path.exists():
            raise InputError(s, "--trace", f"the bundled trace needs {path}, which is missing: "
                             "set APPORTION_DATA to the folder of the data sets")
        check_trace_fits(path, s)
        return load_any(path)
    p = Path(s)
    if not p.exists():
        raise InputError(s, "--trace", "neither a file nor a bundled trace name; names: "
                         + ", ".join(sorted(BUNDLED) + list(GENERATED)))
    return load_any(p)
