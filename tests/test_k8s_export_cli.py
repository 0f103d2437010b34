"""`apportion export k8s` and `apportion export kueue`: files that pass the schemas; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from k8s_schemas import validate
from typer.testing import CliRunner

from apportion.cli import app

CLUSTER = """name: my-cluster
node_groups:
  - prefix: a100
    count: 4
    gpu_type: A100-40GB
    gpus_per_node: 8
    cpus_per_node: 96
    host_memory_gib: 1024
  - prefix: t4
    nodes: [t4-node-a, t4-node-b]
    gpu_type: Tesla-T4
    gpus_per_node: 4
    cpus_per_node: 32
    host_memory_gib: 128
"""
JOBS = """jobs:
  - {id: j1, model: gpt-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 16}
  - {id: j2, model: bert-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 4,
     tenant: vision, guaranteed: true}
  - {id: j3, model: vit-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 8}
"""
DECISION = {"formulation": "cells", "solver": {"backend": "highs"}, "allocations": [
    {"job": "j1", "gpu_type": "A100-40GB", "gpus": 16, "stages": 1, "plan": {"dp": 16},
     "placement": {"a100-1": 4, "a100-2": 8, "a100-3": 4}, "est_throughput": 10.0},
    {"job": "j2", "gpu_type": "A100-40GB", "gpus": 4, "stages": 1, "plan": {"dp": 2, "tp": 2},
     "placement": {"a100-1": 4}, "est_throughput": 3.0, "cpus": 40, "host_memory_gib": 200},
    {"job": "j3", "gpu_type": "T4", "gpus": 8, "stages": 2, "plan": {"dp": 2, "tp": 2, "pp": 2},
     "placement": {"t4-node-a": 4, "t4-node-b": 4}, "est_throughput": 1.0}],
    "pending": []}


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    (tmp_path / "d.json").write_text(json.dumps(DECISION))
    (tmp_path / "tenants.yaml").write_text("tenants: [{name: vision, quota_gpus: 12}, "
                                           "{name: nlp, quota_gpus: 9}]\n")
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def export(tmp: Path, *extra: str) -> tuple[int, str]:
    return run("export", "k8s", "--decision", str(tmp / "d.json"), "--cluster",
               str(tmp / "cluster.yaml"), "--jobs", str(tmp / "jobs.yaml"), "--out",
               str(tmp / "out"), *extra)


def test_refused_plan_exits_2_and_writes_nothing(files: Path) -> None:
    code, out = export(files)
    assert code == 2 and "allocations[2].plan" in out and "pipeline and tensor" in out
    assert not (files / "out").exists()


@pytest.mark.parametrize("api", ["trainjob", "jobset", "pytorchjob"])
def test_export_writes_valid_objects(files: Path, api: str) -> None:
    code, out = export(files, "--api", api, "--queue-per-tenant", "--namespace", "training",
                       "--image", "registry.example/apportion-worker:0.1.0-cuda",
                       "--skip-unsupported")
    assert code == 0, out
    index = json.loads((files / "out" / "index.json").read_text())
    assert set(index["jobs"]) == {"j1", "j2"} and set(index["refused"]) == {"j3"}
    for job, entry in index["jobs"].items():
        docs = list(yaml.safe_load_all((files / "out" / entry["file"]).read_text()))
        assert [f"{d['kind']}/{d['metadata']['name']}" for d in docs] == entry["objects"]
        for d in docs:
            assert validate(d) == [], (job, d["kind"])
            assert d["metadata"]["namespace"] == "training"
        queue = docs[-1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert queue == ("vision" if job == "j2" else "default")  # export kueue's LocalQueues


def test_bad_flags_and_files_exit_2_naming_the_field(files: Path) -> None:
    cases = [
        (("--api", "mpijob"), "--api"),
        (("--namespace", "Bad_NS"), "namespace"),
        (("--image", "has space"), "image"),
        (("--queue", "UPPER"), "queue"),
    ]
    for extra, needle in cases:
        code, out = export(files, *extra)
        assert code == 2 and needle in out, (extra, out)
    d = json.loads(json.dumps(DECISION))
    d["allocations"][0]["placement"]["a100-9"] = 4
    (files / "d.json").write_text(json.dumps(d))
    code, out = export(files, "--skip-unsupported")
    assert code == 2 and "allocations" in out and "a100-9" in out
    d["allocations"][0] = {k: v for k, v in DECISION["allocations"][0].items() if k != "plan"}
    (files / "d.json").write_text(json.dumps(d))
    code, out = export(files)
    assert code == 2 and "allocations[0].plan" in out
    (files / "d.json").write_text("{oops")
    code, out = export(files)
    assert code == 2 and "malformed JSON" in out
    (files / "k.yaml").write_text("reserve: {cpus: -1}\n")
    (files / "d.json").write_text(json.dumps(DECISION))
    code, out = export(files, "--k8s-config", str(files / "k.yaml"))
    assert code == 2 and "reserve.cpus" in out
    (files / "k.yaml").write_text("namespace: x\nbogus: 1\n")
    code, out = export(files, "--k8s-config", str(files / "k.yaml"))
    assert code == 2 and "bogus" in out and "unknown field" in out
    (files / "out").write_text("a file")
    code, out = export(files, "--skip-unsupported")
    assert code == 2 and "--out" in out
    assert not (files / "out").is_dir()


def test_export_kueue(files: Path) -> None:
    code, out = run("export", "kueue", "--cluster", str(files / "cluster.yaml"), "--tenants",
                    str(files / "tenants.yaml"), "--out", str(files / "kq"), "--namespace",
                    "training")
    assert code == 0, out
    objs = [yaml.safe_load(p.read_text()) for p in sorted((files / "kq").glob("*.yaml"))]
    for o in objs:
        assert validate(o) == [], o["metadata"]["name"]
    kinds = [o["kind"] for o in objs]
    assert kinds.index("ResourceFlavor") > kinds.index("Topology")
    flavors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceFlavor"}
    assert {f["spec"]["nodeLabels"]["nvidia.com/gpu.product"] for f in flavors.values()} == {
        "NVIDIA-A100-SXM4-40GB", "Tesla-T4"}
    cqs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterQueue"}
    assert set(cqs) == {"apportion-vision", "apportion-nlp", "apportion-default",
                        "apportion-unreserved"}

    def gpus(cq: dict) -> dict[str, int]:
        return {f["name"]: next(r["nominalQuota"] for r in f["resources"]
                                if r["name"] == "nvidia.com/gpu")
                for f in cq["spec"]["resourceGroups"][0]["flavors"]}

    assert sum(gpus(cqs["apportion-vision"]).values()) == 12
    assert sum(gpus(cqs["apportion-nlp"]).values()) == 9
    total = {f: sum(gpus(cq)[f] for cq in cqs.values()) for f in flavors}
    assert total == {"gpu-a100-40gb": 32, "gpu-t4": 8}  # the whole cluster, once
    lqs = [o for o in objs if o["kind"] == "LocalQueue"]
    assert {q["spec"]["clusterQueue"] for q in lqs} == set(cqs) - {"apportion-unreserved"}
    assert {q["metadata"]["name"] for q in lqs} == {"vision", "nlp", "default"}
    assert all(q["metadata"]["namespace"] == "training" for q in lqs)
    assert (files / "kq" / "label-nodes.sh").read_text().count("kubectl label node") == 2


def test_export_kueue_bad_tenants_exit_2(files: Path) -> None:
    (files / "tenants.yaml").write_text("tenants: [{name: a, quota_gpus: -3}]\n")
    code, out = run("export", "kueue", "--cluster", str(files / "cluster.yaml"), "--tenants",
                    str(files / "tenants.yaml"), "--out", str(files / "kq"))
    assert code == 2 and "tenants[0].quota_gpus" in out and not (files / "kq").exists()


def test_crius_sim_kueue_objects_validate(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("tenants: [{name: a, quota_gpus: 500}, "
                                     "{name: b, quota_gpus: 300}]\n")
    code, out = run("export", "kueue", "--cluster", "crius-sim", "--tenants",
                    str(tmp_path / "t.yaml"), "--out", str(tmp_path / "kq"))
    assert code == 0, out
    for p in (tmp_path / "kq").glob("*.yaml"):
        o = yaml.safe_load(p.read_text())
        assert validate(o) == [], p.name


@pytest.mark.parametrize("api", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.parametrize("round_", ["default", "held-out-1280"])
def test_every_api_exports_every_allocation_of_a_plain_round(tmp_path: Path, api: str,
                                                             round_: str) -> None:
    """What a plain ``solve-round`` decides can be exported, every allocation, by every API,
    and every object passes the real schemas (the round carries the workloads' plan
    filter: the PP+TP plans the built-in workload refuses are never chosen)."""
    from importlib import resources

    if round_ == "default":
        cluster = "crius-testbed"
        jobs = tmp_path / "jobs.yaml"
        jobs.write_text(resources.files("apportion").joinpath("data/default_jobs.yaml")
                        .read_text())
    else:
        from apportion.experiments.bench.rounds import write_instance

        c, jobs = write_instance(120, 1280, 4, 7, tmp_path)
        cluster = str(c)
    code, out = run("solve-round", "--cluster", cluster, "--jobs", str(jobs), "--json",
                    str(tmp_path / "d.json"), "--time-budget", "10", "--no-isolate")
    assert code == 0, out
    placed = json.loads((tmp_path / "d.json").read_text())["allocations"]
    assert placed
    code, out = run("export", "k8s", "--decision", str(tmp_path / "d.json"), "--cluster",
                    cluster, "--jobs", str(jobs), "--out", str(tmp_path / "out"), "--api", api)
    assert code == 0, out
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert set(index["jobs"]) == {a["job"] for a in placed} and not index["refused"]
    for entry in index["jobs"].values():
        for d in yaml.safe_load_all((tmp_path / "out" / entry["file"]).read_text()):
            assert validate(d) == [], d["kind"]
