"""Morphling's workloads (``name, submission_time, duration, application, num_gpus,
num_cpus, bandwidth, exec_plan, steps, is_sla``) and Morphling's down-sampling of a raw
cluster trace (section 7.3).

A job's ground-truth key is its application (``vit``), whose measured iteration times per
execution plan and placement are Morphling's (A800 nodes); its ``model`` is the catalog's
name of the same model (``vit-86m``), its batch the artifact's validation scripts' and its
GPU type A800-80GB: each recorded as a substitution, since the workload says none of them.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from apportion.experiments.traces.base import (
    ANY_SECONDS,
    ITERATIONS,
    POSITIVE_COUNT,
    SECONDS,
    SimJob,
    Substitution,
    SubstitutionLog,
    Trace,
    busiest_window,
    read_trace_csv,
    sorted_jobs,
)
from apportion.experiments.traces.registry import TraceFormat, register

MORPHLING_MODELS = {"vit": "vit-86m", "roberta": "roberta-355m", "bert": "bert-336m",
                    "t5": "t5-1.2b", "gpt2": "gpt2-1.5b", "llama7": "llama2-7b",
                    "llama30": "llama-30b"}
#: the GPU type of Morphling's testbed (8 x 8 A800 80 GB), the only one it measured
MORPHLING_GPU = "A800-80GB"
COLUMNS = ("name", "submission_time", "duration", "application", "num_gpus", "num_cpus",
           "exec_plan", "steps")


def _morphling_batch(app: str) -> int:
    """Global batch per Morphling model from its artifact's validation scripts (LLaMA-30B
    takes LLaMA-7B's, as the artifact's own profile does)."""
    from apportion.experiments.bench.morphling_data import MODELS  # the artifact's, on use

    key = "llama7" if app == "llama30" else app
    return MODELS[key].batch if key in MODELS else 8


def load_morphling_workload(path: str | Path) -> Trace:
    p = Path(path)
    text, _ = read_trace_csv(
        p, COLUMNS, "name",
        {"submission_time": SECONDS, "duration": ANY_SECONDS, "num_gpus": POSITIVE_COUNT,
         "num_cpus": POSITIVE_COUNT, "steps": ITERATIONS,
         "is_sla": {"integer": True, "minimum": 0, "maximum": 1}})
    df = pd.read_csv(io.StringIO(text), dtype={"exec_plan": str, "name": str,
                                               "application": str})
    jobs = []
    subs = SubstitutionLog()
    for r in df.itertuples(index=False):
        app = str(r.application)
        sla = int(getattr(r, "is_sla", 0)) == 1
        j = SimJob(
            job_id=str(r.name), submit_s=float(r.submission_time), gpus=int(r.num_gpus),
            iterations=float(r.steps), job_type=app, model=MORPHLING_MODELS.get(app),
            batch=_morphling_batch(app), gpu_type=MORPHLING_GPU, tenant="A" if sla else "B",
            guaranteed=sla, duration_s=float(r.duration), plan=str(r.exec_plan),
            cpus=int(r.num_cpus))
        jobs.append(j)
        subs.add("model", app, j.model, "the catalog's name of Morphling's model, for the "
                 "policies' estimators; the truth reads the application", j.job_id)
        subs.add("batch_size", None, j.batch, "the batch of Morphling's validation scripts",
                 j.job_id)
        subs.add("gpu_type", None, j.gpu_type, "Morphling measured A800 nodes only", j.job_id)
    return Trace(p.stem, sorted_jobs(jobs), str(p), format="morphling",
                 substitutions=subs.substitutions())


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
                           model=MORPHLING_MODELS[app], gpu_type=MORPHLING_GPU))
    why = ("the trace carries no models; a Table-1 model, the nearest count it can use, "
           "the GPU-hours kept")
    drawn = Substitution("model, num_gpus, gpu_type, duration_s", "(none: a cluster trace)",
                         f"drawn by Morphling's down-sampling (section 7.3, seed {seed})", why,
                         tuple(j.job_id for j in out))
    return replace(trace, name=f"{trace.name}-morphling-s{seed}", jobs=out,
                   notes=[*trace.notes, (f"busiest {hours} h from {s:.0f} s, sampled "
                                         f"{cluster_gpus}/{source_gpus}")],
                   format="morphling", substitutions=trace.substitutions + [drawn])


def example(folder: Path) -> str:
    """Two jobs of Morphling's base workload."""
    f = folder / "morphling-jobs.csv"
    f.write_text("name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,"
                 "exec_plan,steps,is_sla\n"
                 "vit-0,0,3163.091667,vit,2,16,0,zero-dp,37239,0\n"
                 "bert-1,60,1200,bert,4,32,0,zero-dp,8000,1\n")
    return str(f)


MORPHLING = register(TraceFormat(
    name="morphling", doc="Morphling's workloads (application, execution plan, SLA per job)",
    load=load_morphling_workload, columns=("name", "application", "exec_plan"),
    truth="morphling", example=example, example_cluster="morphling-64"))
