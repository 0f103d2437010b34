"""YMIR's fine-tuning workloads (Titan's FMTrace samples: ``name, submission_time,
application, num_gpus, target_batch_size, target_lr, target_gradient_steps,
target_metric``), one fine-tuning job (``backbone@task``) per row.

Iterations are left at 0: how many a job needs to reach its target is ground truth
(:meth:`apportion.experiments.finetune_truth.FinetuneTruth.with_iterations`, the
fine-tuning truth's preparation), so the format's only truth is ``finetune``. Its GPU
type is V100's, the type of the throughput profiles (recorded as a substitution).
"""

from __future__ import annotations

from pathlib import Path

from apportion.experiments.traces.base import (
    POSITIVE_COUNT,
    SECONDS,
    FinetuneInfo,
    SimJob,
    SubstitutionLog,
    Trace,
    read_trace_csv,
    sorted_jobs,
)
from apportion.experiments.traces.registry import TraceFormat, register

from apportion.errors import InputError

FINETUNE_COLUMNS = ("name", "submission_time", "application", "num_gpus", "target_batch_size",
                    "target_lr", "target_gradient_steps", "target_metric")
#: GPU type of the throughput profiles the fine-tuning replays use (YMIR simulates on V100)
FINETUNE_GPU = "V100-32GB"


def load_finetune_workload(path: str | Path) -> Trace:
    """A Titan/YMIR workload CSV: one fine-tuning job per row (``backbone@task``).

    Iterations are left at 0: how many a job needs to reach its target is ground
    truth (:meth:`apportion.experiments.finetune_truth.FinetuneTruth.with_iterations`)."""
    p = Path(path)
    _, table = read_trace_csv(p, FINETUNE_COLUMNS, "name", {
        "submission_time": SECONDS, "num_gpus": POSITIVE_COUNT,
        "target_batch_size": POSITIVE_COUNT,
        "target_metric": {"minimum": -1e12, "maximum": 1e12}})
    jobs = []
    subs = SubstitutionLog()
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
        subs.add("gpu_type", None, FINETUNE_GPU, "the fine-tuning throughput profiles are "
                 "V100's", r["name"])
    return Trace(f"{p.parent.name}" if p.stem.startswith("workload") else p.stem,
                 sorted_jobs(jobs), str(p), format="finetune",
                 substitutions=subs.substitutions())


def example(folder: Path) -> str:
    """Two fine-tuning jobs of Titan's FMTrace sample."""
    f = folder / "finetune-jobs.csv"
    f.write_text(",".join(FINETUNE_COLUMNS) + "\n"
                 "roberta-base@mrpc-0,45,roberta-base@mrpc,1,128,1e-3,8,0.9071803852889667\n"
                 "roberta-base@qnli-1,786,roberta-base@qnli,2,128,4e-5,8,0.9031667581914699\n")
    return str(f)


FINETUNE = register(TraceFormat(
    name="finetune", doc="YMIR's fine-tuning workloads (backbone@task, target metric per job)",
    load=load_finetune_workload, columns=FINETUNE_COLUMNS, truth="finetune",
    truths=("finetune",), why="its jobs' work is iterations to a target metric, which only "
    "the fine-tuning truth's measured curves give", example=example, example_cluster="4:0:0"))
