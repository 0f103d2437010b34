"""Crius's adapted traces (``job_id, submission_time, num_iteration, model_name, deadline,
batch_size, num_gpu, gpu_type``) and Crius's adaptation of a raw cluster trace.

A job's ground-truth key is Crius's ``model_params_batch`` (``bert_2.6B_256``, its
prof_database's); its ``model`` is the catalog name of the same model (``bert-2.6b``),
which the optimising policies' estimators read, and its GPU type the catalog's
(``a40`` -> ``A40``). Both mappings are substitutions, recorded with the jobs they
concern.

:func:`adapt_crius` (Crius section 8.1): a model drawn uniformly from Crius table 2
(Wide-ResNet, BERT, MoE at their sizes), a global batch size drawn from the model's
table-2 list, a GPU count drawn from the Crius trace's own mix (1: 5 %, 2: 15 %, 4: 37 %,
8: 33 %, 16: 10 %, measured on ``simulate_trace_philly.csv``), a preferred GPU type drawn
from the same trace's mix (A40 40 %, A10 24 %, A100 18 %, V100 17 %), and iterations =
duration x the measured throughput of that configuration (ground truth), so the job
would take its traced duration on what it asked for.
"""

from __future__ import annotations

import io
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

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
    read_trace_csv,
    sorted_jobs,
)
from apportion.experiments.traces.registry import TraceFormat, register

CRIUS_TYPES = {"a100": "A100-40GB", "a40": "A40", "a10": "A10", "v100": "V100-32GB",
               "h100": "H100-80GB", "l20": None}
_SIZE_TO_CATALOG = {"500M": "0.5b", "690M": "0.69b", "760M": "0.76b", "1B": "1b", "1.3B": "1.3b",
                    "2B": "2b", "2.4B": "2.4b", "2.6B": "2.6b", "4B": "4b", "6.7B": "6.7b",
                    "6.8B": "6.8b", "10B": "10b", "27B": "27b"}
_FAMILY = {"wide_resnet": "wresnet", "bert": "bert", "moe": "moe"}
COLUMNS = ("job_id", "submission_time", "num_iteration", "model_name", "batch_size", "num_gpu")


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
    text, _ = read_trace_csv(p, COLUMNS, "job_id", {
        "submission_time": SECONDS, "num_iteration": ITERATIONS, "batch_size": POSITIVE_COUNT,
        "num_gpu": POSITIVE_COUNT, "deadline": ANY_SECONDS}, optional=frozenset({"deadline"}))
    df = pd.read_csv(io.StringIO(text), dtype={"job_id": str, "model_name": str})
    t0 = float(df["submission_time"].min()) if len(df) else 0.0
    jobs = []
    subs = SubstitutionLog()
    for r in df.itertuples(index=False):
        gt = CRIUS_TYPES.get(str(r.gpu_type).lower()) if hasattr(r, "gpu_type") else None
        dl = getattr(r, "deadline", None)
        j = SimJob(
            job_id=str(r.job_id), submit_s=float(r.submission_time) - t0, gpus=int(r.num_gpu),
            iterations=float(r.num_iteration), job_type=crius_key(r.model_name, int(r.batch_size)),
            model=crius_catalog_name(r.model_name), batch=int(r.batch_size), gpu_type=gt,
            deadline_s=None if dl is None or pd.isna(dl) else float(dl) - t0)
        jobs.append(j)
        subs.add("model", r.model_name, j.model, "the catalog's name of Crius's model, for the "
                 "policies' estimators; the truth reads Crius's own key", j.job_id)
        if hasattr(r, "gpu_type"):
            subs.add("gpu_type", r.gpu_type, gt, "the catalog's name" if gt else
                     "no type of Crius's measured tables: the job prefers none", j.job_id)
    return Trace(p.stem, sorted_jobs(jobs), str(p), [f"submit times rebased by {t0:.0f} s"],
                 "crius", subs.substitutions())


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
    Draws that no GPU type can run (out of memory everywhere) are redrawn. Every job
    kept is a substitution (what it runs was drawn, not traced), recorded as one."""
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
    drawn = Substitution(
        "model, batch_size, num_gpus, gpu_type, iterations", "(none: a cluster trace)",
        f"drawn by Crius's adaptation (section 8.1, seed {seed})",
        "the trace carries no models; Crius's table-2 models, the Crius trace's GPU mixes, "
        "iterations = duration x the measured rate", tuple(j.job_id for j in out))
    return replace(trace.derived(out, name=f"{trace.name}-crius-s{seed}",
                                 note=f"adapt_crius seed={seed}", substitutions=[drawn]),
                   format="crius")


def example(folder: Path) -> str:
    """Three jobs of Crius's measured models."""
    f = folder / "crius-jobs.csv"
    f.write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,"
                 "num_gpu,gpu_type\n"
                 "a,100,300,bert__760M,5000,128,1,a40\n"
                 "b,160,200,wide_resnet__500M,9000,256,2,a10\n"
                 "c,220,100,moe__690M,9000,256,4,a40\n")
    return str(f)


CRIUS = register(TraceFormat(
    name="crius", doc="Crius's adapted traces (model_name per job, its measured models)",
    load=load_crius_trace, columns=("submission_time", "num_iteration", "model_name"),
    truth="crius", example=example))
