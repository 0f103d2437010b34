"""The operator's round every policy and formulation check runs on: a small heterogeneous
cluster (two A40 nodes of four GPUs, one A100 node of eight) and a queue of catalog jobs."""

from __future__ import annotations

from dataclasses import replace

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec, RunningState

CLUSTER = Cluster("conformance", [NodeGroup("a40", 2, "A40", 4, 32, 256.0),
                                  NodeGroup("a100", 1, "A100-40GB", 8, 64, 512.0)])
MODELS = ("bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b")


def queue(n: int = 7, running: int = 0) -> list[JobSpec]:
    """``n`` catalog jobs of 1, 2 and 4 GPUs; the first ``running`` (at most 2) running on
    the A40 nodes."""
    jobs = [JobSpec(f"j{i}", MODELS[i % len(MODELS)], 64, 1000 + 100 * i, [1, 2, 4][i % 3],
                    submit_time_s=float(i)) for i in range(n)]
    for i in range(min(running, 2)):
        g = jobs[i].requested_gpus
        jobs[i] = replace(jobs[i], running=RunningState("A40", g, 1, {f"a40-{i}": g}))
    return jobs


__all__ = ["CLUSTER", "MODELS", "queue"]
