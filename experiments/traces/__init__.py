"""Job traces: one module per format, each registered with how it is detected, loaded and
given its ground truth (:mod:`.registry`).

Every loader returns a :class:`Trace`: a list of :class:`SimJob` in submit order, where it
came from, and every substitution it made (:class:`Substitution`: a model mapped, a GPU
type renamed, jobs drawn by a paper's adaptation). The built-in formats:

* ``gavel`` — Gavel's 10-field tab-separated ``.trace`` (:mod:`.gavel`), and
  ``gavel-csv``, a normalised CSV of Gavel's job types;
* ``crius`` — Crius's adapted traces (:mod:`.crius`);
* ``morphling`` — Morphling's workloads (:mod:`.morphling`);
* ``finetune`` — YMIR's fine-tuning workloads (:mod:`.finetune`), their iterations to
  target filled in by :class:`apportion.experiments.finetune_truth.FinetuneTruth`;
* ``elasticflow`` — a normalised CSV of ElasticFlow's measured models (:mod:`.elasticflow`);
* ``raw`` — a cluster trace without models (Philly, ITP: :mod:`.raw`), given Crius's
  adaptation (:func:`adapt_crius`, seeded and documented in :mod:`.crius`);
  :func:`morphling_downsample` is Morphling's;
* ``workload`` — a user's own workload with their own models and measured rates
  (:mod:`.workload`);
* ``pollux`` — Pollux's workloads (:mod:`.pollux`), on its measured step times and
  gradient statistics, the batch a decision where the job allows it;
* ``synthetic`` — generated (:func:`synthetic`).

A file is detected by its content, never its path (:func:`detect`); a file no format
detects is refused by name. Plug-ins add formats through the ``apportion.trace_formats``
entry-point group: a :class:`TraceFormat` whose loader reads its files with
:func:`read_trace_csv` (the bounded reader: every number checked, ids unique) and the
bounds ``SECONDS``, ``POSITIVE_COUNT``, ``ITERATIONS``, ``ANY_SECONDS``. Only paths are
stored; large files are read from ``data_root()`` (``$APPORTION_DATA`` or
``../shared/data`` next to the repository).
"""

from __future__ import annotations

from apportion.experiments.traces.base import (
    ANY_SECONDS,
    ITERATIONS,
    MAX_TRACE_GPUS,
    MAX_TRACE_ITERATIONS,
    MAX_TRACE_SECONDS,
    POSITIVE_COUNT,
    SECONDS,
    FinetuneInfo,
    SimJob,
    Substitution,
    SubstitutionLog,
    Trace,
    busiest_window,
    data_root,
    read_trace_csv,
    sorted_jobs,
    with_iterations,
)
from apportion.experiments.traces.crius import (
    CRIUS_GPU_MIX,
    CRIUS_TABLE2,
    CRIUS_TYPE_MIX,
    CRIUS_TYPES,
    adapt_crius,
    crius_catalog_name,
    crius_key,
    load_crius_trace,
)
from apportion.experiments.traces.elasticflow import ELASTICFLOW_MODELS
from apportion.experiments.traces.finetune import (
    FINETUNE_COLUMNS,
    FINETUNE_GPU,
    load_finetune_workload,
)
from apportion.experiments.traces.gavel import load_gavel_trace
from apportion.experiments.traces.morphling import (
    MORPHLING_FEASIBLE_GPUS,
    MORPHLING_MODELS,
    load_morphling_workload,
    morphling_downsample,
)
from apportion.experiments.traces.normalised import REQUIRED, load_normalised_csv
from apportion.experiments.traces.pollux import load_pollux_workload
from apportion.experiments.traces.raw import RAW
from apportion.experiments.traces.registry import (
    COVERAGE,
    ENTRY_POINT_GROUP,
    Preparation,
    Sniff,
    TraceFormat,
    detect,
    detect_format,
    formats,
    load_any,
    load_plugins,
    register,
    trace_format,
)
from apportion.experiments.traces.synthetic import synthetic
from apportion.experiments.traces.workload import load_workload

#: the built-in formats' names (plug-ins add theirs: :func:`formats`); each module above
#: registers its format when imported
FORMATS = ("gavel", "gavel-csv", "crius", "morphling", "elasticflow", RAW.name, "synthetic",
           "finetune", "workload", "pollux")

__all__ = [
    "ANY_SECONDS",
    "COVERAGE",
    "CRIUS_GPU_MIX",
    "CRIUS_TABLE2",
    "CRIUS_TYPES",
    "CRIUS_TYPE_MIX",
    "ELASTICFLOW_MODELS",
    "ENTRY_POINT_GROUP",
    "FINETUNE_COLUMNS",
    "FINETUNE_GPU",
    "FORMATS",
    "ITERATIONS",
    "MAX_TRACE_GPUS",
    "MAX_TRACE_ITERATIONS",
    "MAX_TRACE_SECONDS",
    "MORPHLING_FEASIBLE_GPUS",
    "MORPHLING_MODELS",
    "POSITIVE_COUNT",
    "REQUIRED",
    "SECONDS",
    "FinetuneInfo",
    "Preparation",
    "SimJob",
    "Sniff",
    "Substitution",
    "SubstitutionLog",
    "Trace",
    "TraceFormat",
    "adapt_crius",
    "busiest_window",
    "crius_catalog_name",
    "crius_key",
    "data_root",
    "detect",
    "detect_format",
    "formats",
    "load_any",
    "load_crius_trace",
    "load_finetune_workload",
    "load_gavel_trace",
    "load_morphling_workload",
    "load_normalised_csv",
    "load_pollux_workload",
    "load_plugins",
    "load_workload",
    "morphling_downsample",
    "read_trace_csv",
    "register",
    "sorted_jobs",
    "synthetic",
    "trace_format",
    "with_iterations",
]
