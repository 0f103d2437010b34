"""ElasticFlow's workloads: a normalised CSV (``job_id, submit_time_s, num_gpus,
duration_s, model, batch_size, iterations, deadline_s``) whose models are all models
ElasticFlow measured (its ``throughputs_*/<model>.csv`` tables).

Told apart from a user's own workload (:mod:`.workload`, the same columns) by content:
every model named is one of ElasticFlow's. Its truth is ElasticFlow's measured tables
(A100), whose preparation gives every job the A100 type — a substitution it records.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from apportion.experiments.traces.normalised import REQUIRED, load_normalised_csv
from apportion.experiments.traces.registry import Sniff, TraceFormat, register

#: ElasticFlow's measured models (its ``throughputs_*/<model>.csv`` tables).
ELASTICFLOW_MODELS = frozenset({"bert", "deepspeech2", "gpt2", "inception3", "resnet50",
                                "resnet50_cifar10", "vgg16"})


def _only_elasticflow_models(s: Sniff) -> bool:
    models = s.values("model")
    return bool(models) and models <= ELASTICFLOW_MODELS


def example(folder: Path) -> str:
    """Three jobs of ElasticFlow's measured models."""
    f = folder / "elasticflow-jobs.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s,tenant,model,batch_size,iterations,"
                 "deadline_s\n"
                 "a,0,1,3600,t,vgg16,256,20000,7200\n"
                 "b,60,2,1800,t,resnet50,128,30000,9000\n"
                 "c,120,4,900,t,bert,64,5000,9000\n")
    return str(f)


ELASTICFLOW = register(TraceFormat(
    name="elasticflow", doc="ElasticFlow's workloads (a normalised CSV of its measured models)",
    load=partial(load_normalised_csv, fmt="elasticflow"), columns=(*REQUIRED, "model"),
    detect=_only_elasticflow_models,
    detected_by="whose models are all ElasticFlow's (" + ", ".join(sorted(ELASTICFLOW_MODELS))
    + ")", priority=30, truth="elasticflow", example=example, example_cluster="crius-1280"))
