"""``apportion export k8s`` and ``apportion export kueue``: files an operator applies.

``export k8s`` reads a decision (``solve-round --json``), the cluster and the
jobs it was solved for, checks the decision with the independent validator,
and writes one YAML file per allocation (its ConfigMap, TrainingRuntime where
the API has one, and its TrainJob / JobSet / PyTorchJob) plus ``index.json``
(job id -> file, object name and kind). ``export kueue`` writes the Kueue
objects of :mod:`apportion.runtime.executors.k8s_kueue`, one file per object, numbered in
apply order, and ``label-nodes.sh``.

Everything is built and checked before the first file is written: a bad flag,
a bad file, a placement the API cannot express or a plan the job's workload
cannot run exits 2 naming the field, and nothing is written
(``--skip-unsupported`` writes the others and lists the refused in
``index.json``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from apportion.runtime.executors.k8s_config import K8sConfig
from apportion.runtime.executors.k8s_kueue import kueue_objects, node_label_commands
from apportion.runtime.executors.k8s_manifests import (
    PlacementNotExpressible,
    Target,
    job_objects,
    object_name,
)
from pydantic import ConfigDict, Field

from apportion import outputs
from apportion.cluster import Cluster
from apportion.config import (
    GpuName,
    _Strict,
    _validate,
    load_jobs,
    load_tenants,
    resolve_cluster,
)
from apportion.decision import Action, Allocation, Decision, Reason, SolveReport
from apportion.errors import InputError
from apportion.inputs import read_json
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


class _PlanEntry(_Strict):
    dp: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    micro_batches: int = Field(default=1, ge=1)
    zero_stage: int = Field(default=0, ge=0, le=3)
    offload: bool = False
    accumulation: int = Field(default=1, ge=1)
    checkpointing: bool = False
    spill_shards: int = Field(default=0, ge=0)  # a spilled plan (Hydra): ExecutionPlan's fields
    spill_budget_mib: int = Field(default=0, ge=0)


class _AllocEntry(_Strict):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True, strict=False)
    job: str = Field(min_length=1)
    gpu_type: GpuName
    gpus: int = Field(gt=0)
    stages: int = Field(default=1, gt=0)
    plan: _PlanEntry
    placement: dict[str, int] = Field(min_length=1)
    est_throughput: float = 0.0
    action: Literal["start", "keep", "resize", "migrate"] = "start"
    cpus: int = Field(default=0, ge=0)
    host_memory_gib: float = Field(default=0.0, ge=0)


class _DecisionFile(_Strict):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True, strict=False)
    allocations: list[_AllocEntry]
    pending: list[dict[str, Any]] = Field(default_factory=list)
    formulation: str = "cells"


def load_decision(path: str | Path) -> Decision:
    """A decision JSON (``solve-round --json``); errors name the file and the field."""
    src = str(path)
    data = read_json(path, "decision JSON")
    spec: _DecisionFile = _validate(_DecisionFile, data, src)
    allocs = [Allocation(a.job, a.gpu_type, a.gpus, a.stages, ExecutionPlan(**a.plan.model_dump()),
                         dict(a.placement), a.est_throughput, Action(a.action), cpus=a.cpus,
                         host_memory_gib=a.host_memory_gib) for a in spec.allocations]
    from apportion.decision import Pending

    pending = []
    for i, p in enumerate(spec.pending):
        try:
            pending.append(Pending(str(p["job"]), Reason(p["reason"]), str(p.get("detail", ""))))
        except (KeyError, ValueError) as exc:
            raise InputError(src, f"pending[{i}]", f"needs job and a known reason ({exc})") \
                from None
    return Decision(allocs, pending, SolveReport("file", "feasible", None, None, None, 0.0, False),
                    spec.formulation)


def check_decision(decision: Decision, cluster: Cluster, jobs: list[JobSpec], src: str) -> None:
    """The independent validator's verdict on a decision read from a file (exit 2 if invalid)."""
    from apportion.validator import validate

    known = {j.id for j in jobs}
    for i, a in enumerate(decision.allocations):
        if a.job not in known:
            raise InputError(src, f"allocations[{i}].job", f"{a.job!r} is not in the jobs file")
    res = validate(decision, cluster, jobs)
    if not res.ok:
        raise InputError(src, "allocations", "not a valid decision for this cluster and jobs: "
                         + "; ".join(res.violations[:5]))


def _out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "--out", "exists and is not a directory")
    if not out.parent.exists():
        raise InputError(str(out), "--out", f"directory {out.parent} does not exist")


def _write(path: Path, text: str) -> None:
    """One file of the export, by the output rules every command follows
    (:mod:`apportion.outputs`: atomic, the umask's mode, a swapped folder refused)."""
    outputs.write_text(path, text, "--out")


def dump_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, width=100)


def export_k8s(decision_path: Path, cluster_arg: str, jobs_path: Path, out: Path,
               cfg: K8sConfig, skip_unsupported: bool = False) -> dict[str, Any]:
    """Write the objects of every allocation; returns the index written to ``index.json``."""
    _out_dir(out)
    cluster = resolve_cluster(cluster_arg)
    jobs, _ = load_jobs(jobs_path)
    decision = load_decision(decision_path)
    src = str(decision_path)
    check_decision(decision, cluster, jobs, src)
    by_id = {j.id: j for j in jobs}
    target = Target(cluster, cfg, cfg.api, launch_id="export")
    files: dict[str, list[dict[str, Any]]] = {}
    index: dict[str, Any] = {"api": cfg.api, "namespace": cfg.namespace, "jobs": {},
                             "refused": {}}
    for i, a in enumerate(sorted(decision.allocations, key=lambda a: a.job)):
        try:
            docs = job_objects(by_id[a.job], a, target)
        except InputError as exc:
            if exc.source != "decision" and not isinstance(exc, PlacementNotExpressible):
                raise
            field = f"allocations[{i}].{'plan' if exc.field.endswith('.plan') else 'placement'}"
            if skip_unsupported:
                index["refused"][a.job] = exc.message
                log.warning("%s: %s: not exported: %s", src, field, exc.message)
                continue
            raise InputError(src, field, f"job {a.job}: {exc.message}") from None
        name = object_name(a.job)
        files[f"{name}.yaml"] = docs
        index["jobs"][a.job] = {"file": f"{name}.yaml", "name": name, "kind": docs[-1]["kind"],
                                "objects": [f"{d['kind']}/{d['metadata']['name']}" for d in docs]}
    out.mkdir(exist_ok=True)
    for fname, docs in files.items():
        _write(out / fname, dump_yaml(docs))
    _write(out / "index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
    return index


def export_kueue(cluster_arg: str, tenants_path: Path, out: Path,
                 cfg: K8sConfig) -> list[str]:
    """Write the Kueue objects, one numbered file each; returns the file names."""
    _out_dir(out)
    cluster = resolve_cluster(cluster_arg)
    tenants = load_tenants(tenants_path)
    objs = kueue_objects(cluster, tenants, cfg)
    names = [f"{i:02d}-{o['kind'].lower()}-{o['metadata']['name']}.yaml"
             for i, o in enumerate(objs)]
    out.mkdir(exist_ok=True)
    for fname, o in zip(names, objs):
        _write(out / fname, dump_yaml([o]))
    _write(out / "label-nodes.sh", node_label_commands(cluster, cfg))
    return names
