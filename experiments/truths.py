"""Ground truths by name: what a trace format's ``truth`` and ``--truth`` name.

Each :class:`TruthKind` builds its truth for a replay's cluster (and the user's
``--tables``), may prepare a trace for it (ElasticFlow measured A100s only, so every job
runs on that type; the fine-tuning truth fills in each job's iterations to target), and
says, where it rates none of a trace's jobs, what would. A truth is ``general`` when it
rates any trace's jobs by their job type or model; the fine-tuning truth rates only
fine-tuning jobs, so only a format that names it may use it.

The truths themselves live in :mod:`apportion.experiments.groundtruth` (and the
fine-tuning one in :mod:`apportion.experiments.finetune_truth`); this module is the one
place their names are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from apportion.experiments import groundtruth as gt
from apportion.experiments.finetune_truth import FinetuneTruth
from apportion.experiments.pollux_truth import PolluxTruth
from apportion.experiments.traces import SimJob, SubstitutionLog, Trace

from apportion.errors import InputError


@dataclass(frozen=True)
class TruthInputs:
    """What building a truth may read: the replay's cluster and ``--tables``."""

    cluster: Any
    tables: Path | None = None


@dataclass(frozen=True)
class TruthKind:
    """A ground truth by name: ``make`` builds it (a :class:`~apportion.experiments.
    groundtruth.GroundTruth`), ``prepare`` readies a trace for it, ``general`` says it rates
    any trace's jobs, ``hint`` what would rate jobs it rates nowhere."""

    name: str
    doc: str
    make: Callable[[TruthInputs], gt.GroundTruth]
    prepare: Callable[[Trace, Any], Trace] | None = None
    general: bool = True
    hint: Callable[[Any, Sequence[SimJob]], str] | None = None


TRUTHS: dict[str, TruthKind] = {}


def register_truth(kind: TruthKind) -> None:
    TRUTHS[kind.name] = kind


def truth_names() -> list[str]:
    return list(TRUTHS)


def general_truths() -> tuple[str, ...]:
    """The truths that rate any trace's jobs: what ``--truth`` may choose for a format
    that names no list of its own."""
    return tuple(n for n, k in TRUTHS.items() if k.general)


def make_truth(name: str, inputs: TruthInputs) -> gt.GroundTruth:
    kind = TRUTHS.get(name)
    if kind is None:
        raise InputError(name, "--truth", f"unknown ground truth; choose "
                         f"{', '.join(TRUTHS)}")
    return kind.make(inputs)


def prepare_for(name: str, trace: Trace, truth: Any) -> Trace:
    """``trace`` as the truth ``name`` replays it (unchanged where it needs nothing)."""
    kind = TRUTHS.get(name)
    return kind.prepare(trace, truth) if kind and kind.prepare else trace


def hint(name: str, truth: Any, jobs: Sequence[SimJob]) -> str:
    """What would rate ``jobs`` that truth ``name`` rates nowhere (may be empty)."""
    kind = TRUTHS.get(name)
    return kind.hint(truth, jobs) if kind and kind.hint else ""


# -- the truths -----------------------------------------------------------------------
#: the type of ElasticFlow's measured throughputs its replays run on
ELASTICFLOW_GPU = "A100-40GB"


def _on_a100(trace: Trace, truth: Any) -> Trace:
    """ElasticFlow measured A100s only: every job runs on that type (recorded)."""
    subs = SubstitutionLog()
    for j in trace.jobs:
        subs.add("gpu_type", j.gpu_type, ELASTICFLOW_GPU, "ElasticFlow's rates "
                 "are measured on A100s", j.job_id)
    return replace(trace, jobs=[replace(j, gpu_type=ELASTICFLOW_GPU)
                                for j in trace.jobs],
                   substitutions=trace.substitutions + subs.substitutions())


def _to_target(trace: Trace, truth: Any) -> Trace:
    """Each fine-tuning job's iterations to its target (the truth's measured curves)."""
    t = truth.with_iterations(trace)
    subs = SubstitutionLog()
    for j in t.jobs:
        subs.add("iterations", None, "to target", "samples to the target metric on the "
                 "measured curves / the batch", j.job_id)
    return replace(t, substitutions=t.substitutions + subs.substitutions())


def _tables(inputs: TruthInputs) -> Any:
    if inputs.tables is None:
        raise InputError("--truth", "truth", "the tables truth is the user's measured "
                         "iteration times: give them with --tables FILE")
    return gt.TablesTruth.from_csv(inputs.tables)


def _catalog_hint(truth: Any, jobs: Sequence[SimJob]) -> str:
    return ("the analytic truth rates catalog models only (`apportion models` lists them): "
            "give the jobs' measured iteration times with --tables FILE (model, gpu_type, "
            "gpus, iter_time_s[, global_batch_size])")


def _tables_hint(truth: Any, jobs: Sequence[SimJob]) -> str:
    return str(truth.explain(jobs))


register_truth(TruthKind("gavel", "Gavel's measured throughputs (26 job types, V100/P100/K80)",
                         lambda i: gt.GavelTruth()))
register_truth(TruthKind("crius", "Crius's prof_database (best Alpa-tuned plans, "
                         "A100/A40/A10/V100)", lambda i: gt.CriusTruth()))
register_truth(TruthKind("morphling", "Morphling's measured plans and placements (A800)",
                         lambda i: gt.MorphlingTruth()))
register_truth(TruthKind("elasticflow", "ElasticFlow's iterations/s by model, batch, GPUs "
                         "(A100)", lambda i: gt.ElasticFlowTruth(), prepare=_on_a100))
register_truth(TruthKind("analytic", "apportion's analytic model (catalog models; not "
                         "measured)", lambda i: gt.AnalyticTruth(i.cluster),
                         hint=_catalog_hint))
register_truth(TruthKind("tables", "your measured iteration times (--tables FILE)", _tables,
                         hint=_tables_hint))
register_truth(TruthKind("finetune", "YMIR's fine-tuning curves and V100 throughputs",
                         lambda i: FinetuneTruth(), prepare=_to_target, general=False))
register_truth(TruthKind("pollux", "Pollux's measured step times x statistical efficiency "
                         "from its logged gradient statistics (T4)",
                         lambda i: PolluxTruth.for_cluster(i.cluster), general=False))
