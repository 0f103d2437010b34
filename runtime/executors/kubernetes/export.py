"""``apportion export k8s`` and ``apportion export kueue``: files an operator applies.

``export k8s`` reads a decision (``solve-round --json``), the cluster and the
jobs it was solved for, checks the decision with the independent validator,
and writes one YAML file per allocation (its ConfigMap, TrainingRuntime where
the API has one and no ``runtime_ref`` names the platform's ClusterTrainingRuntime, and its
TrainJob / JobSet / PyTorchJob) plus ``index.json``
(job id -> file, object name and kind). ``export kueue`` writes the Kueue
objects of :mod:`apportion.runtime.executors.kubernetes.kueue`, one file per object, numbered in
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
from typing import Any

import yaml
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.kueue import (
    kueue_objects,
    local_queues,
    node_label_commands,
)
from apportion.runtime.executors.kubernetes.manifests import (
    PlacementNotExpressible,
    Target,
    job_objects,
    object_name,
)

from apportion import outputs
from apportion.config import load_tenants, resolve_cluster, resolve_jobs
from apportion.decision_file import check_decision, load_decision
from apportion.errors import InputError

log = logging.getLogger(__name__)


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
    jobs, _ = resolve_jobs(jobs_path)
    decision = load_decision(decision_path)
    src = str(decision_path)
    check_decision(decision, cluster, jobs, src)
    by_id = {j.id: j for j in jobs}
    target = Target(cluster, cfg, cfg.api, launch_id="export")
    files: dict[str, list[dict[str, Any]]] = {}
    index: dict[str, Any] = {"api": cfg.api, "namespace": cfg.namespace, "jobs": {},
                             "refused": {}}
    if cfg.runtime_ref:
        index["runtime_ref"] = cfg.runtime_ref
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
        pinned = docs[-1]["metadata"]["annotations"].get("apportion/pinned")
        if pinned:  # runtime_ref: hosts, or the node group a multi-node job is held to
            index["jobs"][a.job]["pinned"] = pinned
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
    lqs = local_queues(tenants)
    if cfg.queue and cfg.queue not in lqs:
        log.warning("the settings' queue %r is no LocalQueue `export kueue` writes (%s): jobs "
                    "exported with it are never admitted; name a tenant's queue, or use "
                    "--queue-per-tenant", cfg.queue, ", ".join(sorted(lqs)))
    names = [f"{i:02d}-{o['kind'].lower()}-{o['metadata']['name']}.yaml"
             for i, o in enumerate(objs)]
    out.mkdir(exist_ok=True)
    for fname, o in zip(names, objs):
        _write(out / fname, dump_yaml([o]))
    _write(out / "label-nodes.sh", node_label_commands(cluster, cfg))
    return names
