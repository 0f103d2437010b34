"""`apportion export k8s` for platforms: `--runtime-ref NAME` refers every TrainJob to the
platform's ClusterTrainingRuntime instead of writing a TrainingRuntime per job; the k8s
config's `tolerations` reach every pod of every API; `--jobs default` names the jobs
`solve-round` decides without --jobs, as `--cluster` takes bundled names. Every object is
validated against the CRDs (tests/k8s_schemas)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import validate
from test_k8s_export_cli import CLUSTER, DECISION, JOBS, run

TOLERATIONS = ("tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n"
               "  - {key: dedicated, value: ml, effect: NoExecute, tolerationSeconds: 600}\n")


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    decision = json.loads(json.dumps(DECISION))
    j3 = decision["allocations"][2]  # a plan the built-in trainer runs: 8-way DP on two nodes
    j3["stages"], j3["plan"] = 1, {"dp": 8}
    (tmp_path / "d.json").write_text(json.dumps(decision))
    (tmp_path / "k8s.yaml").write_text(TOLERATIONS)
    return tmp_path


def _docs(out: Path) -> dict[str, list[dict[str, Any]]]:
    index = json.loads((out / "index.json").read_text())
    return {job: list(yaml.safe_load_all((out / e["file"]).read_text()))
            for job, e in index["jobs"].items()}


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod spec of a job object (or runtime), wherever its API keeps them."""
    if obj["kind"] not in ("PyTorchJob", "TrainingRuntime", "JobSet"):
        return []  # the ConfigMap; a TrainJob's pods are its runtime's
    spec = obj["spec"]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "TrainingRuntime":
        spec = spec["template"]["spec"]
    return [r["template"]["spec"]["template"]["spec"] for r in spec.get("replicatedJobs", [])]


def test_runtime_ref_trainjobs(files: Path) -> None:
    out = files / "out"
    code, output = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                       str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"),
                       "--out", str(out), "--runtime-ref", "torch-distributed", "--k8s-config",
                       str(files / "k8s.yaml"))
    # j1 is placed 4 + 8 + 4: one pod shape per node is all a shared runtime gives
    assert code == 2 and "allocations[0].placement" in output and "ClusterTrainingRuntime" \
        in output, output
    assert not out.exists()
    code, output = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                       str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"),
                       "--out", str(out), "--runtime-ref", "torch-distributed", "--k8s-config",
                       str(files / "k8s.yaml"), "--skip-unsupported")
    assert code == 0, output
    index = json.loads((out / "index.json").read_text())
    assert index["runtime_ref"] == "torch-distributed" and set(index["refused"]) == {"j1"}
    assert index["jobs"]["j2"]["pinned"] == "hosts"
    assert index["jobs"]["j3"]["pinned"] == "node group t4"
    docs = _docs(out)
    for job, objs in docs.items():
        assert [d["kind"] for d in objs] == ["ConfigMap", "TrainJob"], job  # no runtime each
        for d in objs:
            assert validate(d) == [], (job, d["kind"], validate(d))
        tj = objs[-1]["spec"]
        assert tj["runtimeRef"] == {"name": "torch-distributed", "kind":
                                    "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"}
        over = tj["podSpecOverrides"][0]
        assert over["targetJobs"] == [{"name": "node"}]
        mounts = {m["name"] for m in over["containers"][0]["volumeMounts"]}
        assert mounts <= {v["name"] for v in over["volumes"]}  # every mount has its volume
        assert over["tolerations"][0] == {"operator": "Exists", "key": "nvidia.com/gpu",
                                          "effect": "NoSchedule"}
        env = {e["name"] for e in tj["trainer"]["env"]}
        assert {"APPORTION_PLAN", "APPORTION_JOB_ID", "APPORTION_CHECKPOINT_DIR"} <= env
        assert tj["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
        assert tj["trainer"]["command"][0] == "torchrun"
    j2 = docs["j2"][-1]["spec"]
    assert j2["podSpecOverrides"][0]["nodeSelector"]["kubernetes.io/hostname"] == "a100-1"
    assert j2["trainer"]["numNodes"] == 1 and j2["trainer"]["numProcPerNode"] == 4
    j3 = docs["j3"][-1]["spec"]
    assert j3["podSpecOverrides"][0]["nodeSelector"]["apportion.io/node-group"] == "t4"
    assert j3["trainer"]["numNodes"] == 2


def test_runtime_ref_needs_trainjob(files: Path) -> None:
    code, output = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                       str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"),
                       "--out", str(files / "o"), "--api", "jobset", "--runtime-ref", "rt")
    assert code == 2 and "runtime_ref" in output and "trainjob" in output, output
    code, output = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                       str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"),
                       "--out", str(files / "o"), "--runtime-ref", "Not_A_Name")
    assert code == 2 and "--runtime-ref" in output, output


@pytest.mark.parametrize("api", ["trainjob", "jobset", "pytorchjob"])
def test_tolerations_reach_every_pod(files: Path, api: str) -> None:
    out = files / api
    code, output = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                       str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"),
                       "--out", str(out), "--api", api, "--k8s-config", str(files / "k8s.yaml"),
                       "--skip-unsupported")
    assert code == 0, output
    seen = 0
    for objs in _docs(out).values():
        for d in objs:
            assert validate(d) == [], validate(d)
            for pod in _pod_specs(d):
                seen += 1
                assert pod["tolerations"] == [
                    {"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"},
                    {"operator": "Equal", "key": "dedicated", "value": "ml",
                     "effect": "NoExecute", "tolerationSeconds": 600}]
    assert seen >= 3


def test_jobs_default_as_solve_round_names_them(tmp_path: Path) -> None:
    """`solve-round` without --jobs or --cluster decides the bundled default queue on the
    default cluster; its decision exports with those names."""
    code, output = run("solve-round", "--json", str(tmp_path / "d.json"), "--time-budget", "10",
                       "--deterministic")
    assert code == 0, output
    code, output = run("export", "k8s", "--decision", str(tmp_path / "d.json"), "--cluster",
                       "default", "--jobs", "default", "--out", str(tmp_path / "k8s"),
                       "--skip-unsupported")
    assert code == 0, output
    assert json.loads((tmp_path / "k8s" / "index.json").read_text())["jobs"]
    code, output = run("export", "slurm", "--decision", str(tmp_path / "d.json"), "--cluster",
                       "default", "--jobs", "default", "--out", str(tmp_path / "slurm"),
                       "--skip-unsupported")
    assert code == 0, output
