"""``apportion export slurm``: the batch scripts the Slurm executor would submit, to read and resubmit.

For every allocation of a decision (``solve-round --json``), checked by the independent
validator against the cluster and the jobs it was solved for, the submission of
:mod:`.slurm_submit` (the same function ``apportion run --executor slurm`` calls):

* ``DIR/<job>.sbatch``: ``#!/bin/bash``, a header naming the job, its GPUs and plan and
  where ``--time`` came from, every option as an ``#SBATCH`` line (components of an uneven
  placement after ``#SBATCH hetjob``), and the ``srun`` step; ``sbatch DIR/<job>.sbatch``
  submits it as the executor would;
* the job's folder ``WORKDIR/<job>/`` (``--workdir``, default ``DIR``; on storage every
  node sees): the node agents' launch file and, for the built-in trainer, its config;
* ``DIR/index.json``: job -> script, folder, nodes, ``--time`` and its source.

What Slurm would answer is not asked: GRES types come from the cluster file (an imported
cluster's ``gpu_type_raw``, else the catalog name in lower case) or from ``--slurm-nodes``
(a saved ``scontrol show node -o``, which also caps CPUs and memory as the executor does);
the first node's name is the rendezvous address. Everything is built and checked before
the first file is written: bad input, or a plan the job's workload cannot run, exits 2
naming the field and writes nothing (``--skip-unsupported`` writes the others and lists
the refused in ``index.json``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from apportion.runtime.executors.slurm import batch
from apportion.runtime.executors.slurm import submit
from apportion.runtime.executors.slurm.commands import parse_records
from apportion.runtime.executors.slurm.nodes import (
    MEMORY_HEADROOM,
    NodeLimits,
    cap_requests,
    limits_from_records,
)
from apportion.runtime.workload import plan_supported

from apportion import outputs
from apportion.cluster import Cluster
from apportion.config import resolve_cluster, resolve_jobs
from apportion.decision_file import check_decision, load_decision
from apportion.errors import InputError
from apportion.inputs import read_text
from apportion.jobs import job_dirname

log = logging.getLogger(__name__)
LAUNCH_ID = "export"


def _limits(cluster: Cluster, nodes_file: Path | None) -> tuple[dict[str, dict[str, str]],
                                                               dict[str, NodeLimits]]:
    """scontrol's records and limits per node: from the saved file, else the cluster file's
    own figures (what `cluster import --from slurm` copied from Slurm)."""
    if nodes_file is not None:
        text = read_text(nodes_file, "scontrol show node -o output")
        records = {r["NodeName"]: r for r in parse_records(text) if r.get("NodeName")}
        missing = sorted(n for n in cluster.nodes if n not in records)
        if len(missing) == len(cluster.nodes):
            raise InputError(str(nodes_file), "NodeName", "names none of the cluster's nodes "
                             f"({', '.join(sorted(cluster.nodes)[:5])}, ...): is it `scontrol "
                             "show node -o` of this cluster?")
        return records, limits_from_records(records.values())
    return {}, {n: NodeLimits(n, node.cpus, int(node.host_memory_gib * 1024), node.gpus)
                for n, node in cluster.nodes.items()}


def export_slurm(decision_path: Path, cluster_arg: str, jobs_path: Path, out: Path,
                 workdir: Path | None = None, partition: str | None = None,
                 sbatch_args: list[str] | None = None, limit_s: float | None = None,
                 margin: float = submit.TIME_MARGIN, python: str = "python3",
                 grace_s: float = 60.0, nodes_file: Path | None = None,
                 skip_unsupported: bool = False) -> dict[str, Any]:
    """Write one batch script per allocation (see the module docstring); returns the index."""
    outputs.check_output_dir(out, "--out")
    if workdir is not None:
        outputs.check_output_dir(workdir, "--workdir")
    cluster = resolve_cluster(cluster_arg)
    jobs, _ = resolve_jobs(jobs_path)
    decision = load_decision(decision_path)
    check_decision(decision, cluster, jobs, str(decision_path))
    records, limits = _limits(cluster, nodes_file)
    root = (workdir or out).absolute()
    by_id = {j.id: j for j in jobs}
    subs = []
    refused: dict[str, str] = {}
    for i, a in enumerate(sorted(decision.allocations, key=lambda a: a.job)):
        job = by_id[a.job]
        kind = job.workload.kind if job.workload is not None else "builtin"
        why = plan_supported(kind, a.plan, "cuda")  # Slurm's nodes hold the GPUs
        if why is not None:
            msg = f"job {a.job}: the {kind} workload cannot run plan {a.plan.label()}: {why}"
            if not skip_unsupported:
                raise InputError(str(decision_path), f"allocations[{i}].plan", msg)
            refused[a.job] = msg
            log.warning("%s: not exported: %s", decision_path, msg)
            continue
        c = cluster.nodes
        nodes = sorted(a.placement)
        asked = batch.node_requests(a, {n: c[n].cpus for n in nodes},
                                    {n: c[n].host_memory_gib for n in nodes},
                                    {n: c[n].gpus for n in nodes})
        subs.append(submit.build(
            job, a, root, launch_id=LAUNCH_ID, action="start",
            master_addr=records.get(nodes[0], {}).get("NodeAddr") or nodes[0],
            gres_types={n: submit.gres_type_for(n, a.gpu_type, records.get(n), cluster)
                        for n in nodes},
            requests=cap_requests(asked, a.placement, limits, MEMORY_HEADROOM),
            partition=partition, options=sbatch_args or [], python=python, grace_s=grace_s,
            limit_s=limit_s, margin=margin,
            script_file=out.absolute() / f"{job_dirname(a.job)}.sbatch",
            written_by="apportion export slurm"))
    index: dict[str, Any] = {"workdir": str(root), "jobs": {}, "refused": refused}
    out.mkdir(parents=True, exist_ok=True)
    for sub in subs:
        job = sub.launch["job"]
        sub.jobdir.mkdir(parents=True, exist_ok=True)
        if sub.config is not None:
            outputs.write_json(sub.jobdir / "config.json", sub.config, "--workdir")
        outputs.write_json(sub.launch_file, sub.launch, "--workdir")
        outputs.write_text(sub.script_file, sub.script, "--out")
        index["jobs"][job] = {"script": sub.script_file.name, "jobdir": str(sub.jobdir),
                              "nodes": [n["name"] for n in sub.launch["nodes"]],
                              "components": len(sub.components), "time": sub.time,
                              "time_source": sub.time_source}
        if sub.time is None:
            log.warning("job %s: no --time (%s)", job, sub.time_source)
    outputs.write_text(out / "index.json", json.dumps(index, indent=2, sort_keys=True) + "\n",
                       "--out")
    return index
