"""Kubernetes as its operators write it: Kueue v1beta2 (v1beta1 on request), queue names that
line up between `export k8s` and `export kueue`, Kubeflow Trainer v2's conventions and
numNodes, requests that leave each node's system reserve, gang schedulers (Volcano, KAI), and
the cluster import reading each node's allocatable.

Everything goes through the commands (typer's CliRunner) or the executor against the API
server double, and every object is validated against the shipped CRDs (k8s_schemas).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import yaml
from apportion.runtime.executors.kubernetes.client import K8sClient
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.manifests import object_name
from apportion.runtime.executors.kubernetes.executor import KubernetesExecutor
from k8s_schemas import validate
from k8s_schemas.server import ApiServerDouble
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster
from apportion.config import cluster_from_data, load_cluster
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

CLUSTER = """name: ops
node_groups:
  - {prefix: a100, count: 4, gpu_type: A100-40GB, gpus_per_node: 8, cpus_per_node: 96,
     host_memory_gib: 1024}
"""
JOBS = """jobs:
  - {id: wide, model: gpt-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 24,
     tenant: team-a}
  - {id: uneven, model: gpt-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 4,
     tenant: team-a}
  - {id: half-a, model: gpt-tiny, global_batch_size: 64, iterations: 100, requested_gpus: 4}
"""
TENANTS = "tenants: [{name: default, quota_gpus: 16}, {name: team-a, quota_gpus: 8}]\n"


def _alloc(job: str, placement: dict[str, int], **kw: object) -> dict:
    g = sum(placement.values())
    return {"job": job, "gpu_type": "A100-40GB", "gpus": g, "stages": 1, "plan": {"dp": g},
            "placement": placement, "est_throughput": 1.0, **kw}


# a 3-node job, and two jobs sharing a100-3 half and half
DECISION = {"formulation": "cells", "pending": [], "allocations": [
    _alloc("wide", {"a100-0": 8, "a100-1": 8, "a100-2": 8}),
    _alloc("uneven", {"a100-3": 4}),
    _alloc("half-a", {"a100-3": 4})]}
DECISION_UNEVEN = {"formulation": "cells", "allocations": [
    _alloc("wide", {"a100-0": 8, "a100-1": 4, "a100-2": 4, "a100-3": 8})], "pending": [
    {"job": "uneven", "reason": "no-capacity"}, {"job": "half-a", "reason": "no-capacity"}]}


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    (tmp_path / "d.json").write_text(json.dumps(DECISION))
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def export_k8s(tmp: Path, out: str = "k8s", decision: str = "d.json", cluster: str | None = None,
               *extra: str) -> dict[str, list[dict]]:
    code, text = run("export", "k8s", "--decision", str(tmp / decision), "--cluster",
                     cluster or str(tmp / "cluster.yaml"), "--jobs", str(tmp / "jobs.yaml"),
                     "--out", str(tmp / out), *extra)
    assert code == 0, text
    index = json.loads((tmp / out / "index.json").read_text())
    docs = {}
    for job, entry in index["jobs"].items():
        docs[job] = list(yaml.safe_load_all((tmp / out / entry["file"]).read_text()))
        assert [f"{d['kind']}/{d['metadata']['name']}" for d in docs[job]] == entry["objects"]
        for d in docs[job]:
            assert validate(d) == [], (job, d["kind"], validate(d))
    return docs


def export_kueue(tmp: Path, *extra: str, out: str = "kueue") -> list[dict]:
    code, text = run("export", "kueue", "--cluster", str(tmp / "cluster.yaml"), "--tenants",
                     str(tmp / "tenants.yaml"), "--out", str(tmp / out), *extra)
    assert code == 0, text
    objs = [yaml.safe_load(p.read_text()) for p in sorted((tmp / out).glob("*.yaml"))]
    for o in objs:
        assert validate(o) == [], (o["kind"], validate(o))
    return objs


# -- Kueue's API version -----------------------------------------------------------------------
def test_kueue_objects_are_v1beta2_by_default(files: Path) -> None:
    objs = export_kueue(files)
    kueue = [o for o in objs if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {o["kind"] for o in kueue} == {"Topology", "ResourceFlavor", "ClusterQueue",
                                          "LocalQueue"}
    assert {o["apiVersion"] for o in kueue} == {"kueue.x-k8s.io/v1beta2"}
    for cq in (o for o in kueue if o["kind"] == "ClusterQueue"):
        assert cq["spec"]["cohortName"] == "apportion" and "cohort" not in cq["spec"]
        old = dict(cq, spec={**{k: v for k, v in cq["spec"].items() if k != "cohortName"},
                             "cohort": "apportion"})
        assert validate(old)  # v1beta1's field is refused by v1beta2: the check has teeth


@pytest.mark.parametrize("how", ["flag", "settings"])
def test_kueue_v1beta1_on_request_for_older_kueue(files: Path, how: str) -> None:
    if how == "flag":
        objs = export_kueue(files, "--kueue-api", "v1beta1")
    else:
        (files / "k8s.yaml").write_text("kueue_api: v1beta1\n")
        objs = export_kueue(files, "--k8s-config", str(files / "k8s.yaml"))
    kueue = [o for o in objs if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {o["apiVersion"] for o in kueue} == {"kueue.x-k8s.io/v1beta1"}
    for cq in (o for o in kueue if o["kind"] == "ClusterQueue"):
        assert cq["spec"]["cohort"] == "apportion" and "cohortName" not in cq["spec"]


def test_bad_kueue_api_exits_2_naming_it(files: Path) -> None:
    code, out = run("export", "kueue", "--cluster", str(files / "cluster.yaml"), "--tenants",
                    str(files / "tenants.yaml"), "--out", str(files / "kq"), "--kueue-api",
                    "v1alpha9")
    assert code == 2 and "--kueue-api" in out and not (files / "kq").exists()


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_executor_patches_workloads_in_the_configured_version(tmp_path: Path,
                                                              version: str) -> None:
    cluster = load_cluster_text(CLUSTER)
    job = JobSpec("w", "gpt-tiny", 64, 100, 8)
    cfg = K8sConfig(api="jobset", queue="team-a", kueue_api=version, retry_wait_s=0.02,
                    retry_timeout_s=10, stop_timeout_s=5)
    place = {"a100-0": 8}
    d = Decision([Allocation("w", "A100-40GB", 8, 1, ExecutionPlan(dp=8), place, 1.0)], [],
                 SolveReport("t", "optimal", 0.0, 0.0, 0.0, 0.0, False))
    with ApiServerDouble(kueue=True) as srv:
        client = K8sClient(srv.api_client(), cfg.namespace, cfg.retry_timeout_s,
                           cfg.retry_wait_s)
        ex = KubernetesExecutor(tmp_path / "m", cluster, cfg, client)
        ex.apply(d, [job])
        ex.apply(Decision([], [], d.report), [job])  # preempt: deactivate its Workload
        (wl,) = srv.all("Workload")
        assert wl["spec"]["active"] is False
        paths = {p for m, p, _ in srv.log if "/workloads" in p}
        assert paths and all(f"/kueue.x-k8s.io/{version}/" in p for p in paths)


def load_cluster_text(text: str) -> Cluster:
    return cluster_from_data(yaml.safe_load(text), "test")


# -- queue names -------------------------------------------------------------------------------
def test_export_k8s_queue_and_export_kueue_name_the_same_queue(files: Path) -> None:
    """The README's pair: `export k8s --queue team-a` and `export kueue` applied together."""
    jobs = export_k8s(files, "k8s", "d.json", None, "--queue", "team-a")
    objs = export_kueue(files)
    lqs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "LocalQueue"}
    cqs = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterQueue"}
    for docs in jobs.values():
        queue = docs[-1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert queue == "team-a" and queue in lqs  # Kueue finds the job's LocalQueue
        assert lqs[queue]["spec"]["clusterQueue"] in cqs
        assert lqs[queue]["metadata"]["namespace"] == docs[-1]["metadata"]["namespace"]
    per_tenant = export_k8s(files, "k8s2", "d.json", None, "--queue-per-tenant")
    for job, docs in per_tenant.items():
        assert docs[-1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] in lqs, job


def test_a_settings_queue_no_tenant_has_is_warned_naming_both(files: Path,
                                                              caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    (files / "k8s.yaml").write_text("queue: team-b\n")
    with caplog.at_level(logging.WARNING, logger="apportion"):
        export_kueue(files, "--k8s-config", str(files / "k8s.yaml"))
    text = caplog.text
    assert "'team-b'" in text and "team-a" in text and "default" in text
    caplog.clear()
    (files / "k8s.yaml").write_text("queue: team-a\n")
    with caplog.at_level(logging.WARNING, logger="apportion"):
        export_kueue(files, "--k8s-config", str(files / "k8s.yaml"), out="kueue2")
    assert "team-a" not in caplog.text


# -- Kubeflow Trainer v2 ---------------------------------------------------------------------------
def trainer_pods(runtime: dict, trainjob: dict) -> Counter:
    """The pods Kubeflow Trainer makes of a TrainJob and its runtime: the trainer's replicated
    job (ancestor label) gets numNodes pods, the others keep their parallelism."""
    pods: Counter = Counter()
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = (rj["template"].get("metadata") or {}).get("labels") or {}
        spec = rj["template"]["spec"]
        n = (trainjob["spec"]["trainer"]["numNodes"]
             if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer"
             else spec["parallelism"])
        (c,) = spec["template"]["spec"]["containers"]
        pods[int(c["resources"]["limits"]["nvidia.com/gpu"])] += n * rj["replicas"]
    return pods


def test_trainjob_num_nodes_and_runtime_conventions(files: Path) -> None:
    docs = export_k8s(files)
    _, runtime, tj = docs["wide"]
    assert tj["spec"]["trainer"]["numNodes"] == 3  # a 3-node job says 3
    assert tj["spec"]["trainer"]["numProcPerNode"] == 8
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 3, "torch": {"numProcPerNode": 8}}
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    (rj,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == "node"
    assert rj["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    (c,) = rj["template"]["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "node"  # the container Trainer's torch plugin gives PET_* to
    name = object_name("wide")
    # torchrun's own arguments agree with what Trainer injects (PET_MASTER_ADDR, port 29500)
    assert f"--rdzv-endpoint={name}-node-0-0.{name}:29500" in c["command"]
    assert "--nnodes=3" in c["command"] and "--nproc-per-node=8" in c["command"]
    assert not any(e["name"].startswith("PET_") for e in c["env"])  # Trainer's, not ours
    assert trainer_pods(runtime, tj) == Counter({8: 3})


def test_trainjob_uneven_placement_builds_the_decided_pods(files: Path) -> None:
    (files / "d2.json").write_text(json.dumps(DECISION_UNEVEN))
    docs = export_k8s(files, "k8s-uneven", "d2.json")
    _, runtime, tj = docs["wide"]
    # 8 + 4 + 4 + 8: the trainer's pods are the group on the most nodes; the rest is one
    # more replicated job, so what Trainer builds is the decided placement
    assert tj["spec"]["trainer"]["numNodes"] == runtime["spec"]["mlPolicy"]["numNodes"] == 2
    assert trainer_pods(runtime, tj) == Counter({8: 2, 4: 2})
    assert tj["metadata"]["annotations"]["apportion/nodes"] == "4"
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        (c,) = rj["template"]["spec"]["template"]["spec"]["containers"]
        assert "--nnodes=4" in c["command"]


# -- requests leave the node's system reserve ---------------------------------------------------
def _requests(docs: dict[str, list[dict]]) -> dict[str, list[tuple[int, int]]]:
    """node -> [(millicores, MiB)] of every pod pinned there."""
    out: dict[str, list[tuple[int, int]]] = {}
    for objs in docs.values():
        spec = objs[1]["spec"]["template"]["spec"] if objs[-1]["kind"] == "TrainJob" \
            else objs[-1]["spec"]
        for rj in spec["replicatedJobs"]:
            pod = rj["template"]["spec"]["template"]["spec"]
            req = pod["containers"][0]["resources"]["requests"]
            (term,) = pod["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            for node in term["matchExpressions"][0]["values"]:
                out.setdefault(node, []).append((int(req["cpu"][:-1]), int(req["memory"][:-2])))
    return out


def test_pods_sharing_a_node_leave_its_system_reserve(files: Path) -> None:
    """Two pods of 4 of a100-3's 8 GPUs: together they stay below its allocatable."""
    reqs = _requests(export_k8s(files, "k8s-half", "d.json"))
    cpu = sum(c for c, _ in reqs["a100-3"])
    mem = sum(m for _, m in reqs["a100-3"])
    allocatable_cpu = (96 - 1) * 1000  # the kubelet's reserve (defaults: 1 CPU)
    allocatable_mem = (1024 - 2 - 0.05 * 1024) * 1024
    assert len(reqs["a100-3"]) == 2
    assert cpu <= allocatable_cpu - 500 and mem <= allocatable_mem - 1024  # DaemonSets' share
    assert cpu >= allocatable_cpu - 500 - 2 and mem >= allocatable_mem - 1024 - 2  # no more


def _node_json(name: str, cap_cpu: int, alloc_cpu: str, cap_mem: str, alloc_mem: str) -> dict:
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {}, "status": {
                "capacity": {"cpu": str(cap_cpu), "memory": cap_mem, "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": alloc_cpu, "memory": alloc_mem, "nvidia.com/gpu": "8"}}}


def test_cluster_import_reads_allocatable_and_the_reserve_is_not_taken_twice(tmp_path: Path
                                                                             ) -> None:
    """The issue's node: 192 CPUs and 2,000 GiB of capacity, 190 and 1,900 Gi allocatable."""
    nodes = {"kind": "List", "apiVersion": "v1", "items": [
        _node_json(f"h100-{i}", 192, "190", "2000Gi", "1900Gi") for i in range(2)]}
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    code, out = run("cluster", "import", "--from", "k8s", str(tmp_path / "nodes.json"),
                    "--out", str(tmp_path / "c.yaml"))
    assert code == 0, out
    doc = yaml.safe_load((tmp_path / "c.yaml").read_text())
    (g,) = doc["node_groups"]
    assert (g["cpus_per_node"], g["host_memory_gib"]) == (190, 1900.0)
    assert g["labels"]["k8s_resources"] == "allocatable"
    cluster = load_cluster(tmp_path / "c.yaml")
    assert cluster.nodes["h100-0"].cpus == 190
    # a whole-node job asks for what the kubelet offers less the DaemonSets' share only
    (tmp_path / "jobs.yaml").write_text("jobs: [{id: big, model: gpt-tiny, global_batch_size: "
                                        "64, iterations: 10, requested_gpus: 8}]\n")
    (tmp_path / "d.json").write_text(json.dumps({"allocations": [{
        "job": "big", "gpu_type": "H100-80GB", "gpus": 8, "plan": {"dp": 8},
        "placement": {"h100-0": 8}}]}))
    docs = export_k8s(tmp_path, "k8s", "d.json", str(tmp_path / "c.yaml"))
    ((cpu, mem),) = _requests(docs)["h100-0"]
    assert cpu == (190 - 0.5) * 1000 and mem == (1900 - 1) * 1024


# -- gang schedulers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["trainjob", "jobset"])
def test_volcano_pod_group_for_every_job(files: Path, api: str) -> None:
    (files / "k8s.yaml").write_text("gang: volcano\ngang_queue: research\n")
    docs = export_k8s(files, "k8s", "d.json", None, "--api", api, "--k8s-config",
                      str(files / "k8s.yaml"))
    for objs in docs.values():
        (pg,) = [d for d in objs if d["kind"] == "PodGroup"]
        assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
        assert objs.index(pg) < len(objs) - 1  # created before the job
        name = objs[-1]["metadata"]["name"]
        assert pg["metadata"]["name"] == name and pg["spec"]["queue"] == "research"
        total_pods = 0
        gpus = 0
        spec = objs[1]["spec"]["template"]["spec"] if api == "trainjob" else objs[-1]["spec"]
        for rj in spec["replicatedJobs"]:
            tmpl = rj["template"]["spec"]["template"]
            assert tmpl["spec"]["schedulerName"] == "volcano"
            assert tmpl["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == name
            n = rj["template"]["spec"]["parallelism"]
            total_pods += n
            gpus += n * int(tmpl["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert pg["spec"]["minMember"] == total_pods  # all of the gang, or none
        assert pg["spec"]["minResources"]["nvidia.com/gpu"] == str(gpus)
        bad = dict(pg, spec={**pg["spec"], "minMember": -1})
        assert validate(bad)


def test_volcano_pytorchjob_uses_the_operators_scheduling_policy(files: Path) -> None:
    (files / "k8s.yaml").write_text("gang: volcano\n")
    docs = export_k8s(files, "k8s", "d.json", None, "--api", "pytorchjob", "--k8s-config",
                      str(files / "k8s.yaml"))
    wide = docs["wide"]
    assert [d["kind"] for d in wide] == ["ConfigMap", "PyTorchJob"]  # the operator makes it
    sp = wide[-1]["spec"]["runPolicy"]["schedulingPolicy"]
    assert sp["minAvailable"] == 3 and sp["queue"] == "default"
    for r in wide[-1]["spec"]["pytorchReplicaSpecs"].values():
        assert r["template"]["spec"]["schedulerName"] == "volcano"


def test_gang_and_scheduler_name_flags(files: Path) -> None:
    docs = export_k8s(files, "k8s", "d.json", None, "--api", "jobset", "--gang", "volcano",
                      "--scheduler-name", "volcano-custom")
    for objs in docs.values():
        assert [d["kind"] for d in objs] == ["ConfigMap", "PodGroup", "JobSet"]
        for rj in objs[-1]["spec"]["replicatedJobs"]:
            assert rj["template"]["spec"]["template"]["spec"]["schedulerName"] == "volcano-custom"
    code, out = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                    str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"), "--out",
                    str(files / "bad"), "--gang", "slurm")
    assert code == 2 and "--gang" in out and not (files / "bad").exists()


def test_kai_scheduler_queue_label_and_scheduler_name(files: Path) -> None:
    (files / "k8s.yaml").write_text("gang: kai\ngang_queue: team-a-queue\n")
    docs = export_k8s(files, "k8s", "d.json", None, "--api", "jobset", "--k8s-config",
                      str(files / "k8s.yaml"))
    for objs in docs.values():
        assert not any(d["kind"] == "PodGroup" for d in objs)  # KAI's pod grouper makes it
        assert objs[-1]["metadata"]["labels"]["kai.scheduler/queue"] == "team-a-queue"
        for rj in objs[-1]["spec"]["replicatedJobs"]:
            assert rj["template"]["spec"]["template"]["spec"]["schedulerName"] == "kai-scheduler"


def test_scheduler_name_alone_and_bad_gang_exit_2(files: Path) -> None:
    (files / "k8s.yaml").write_text("scheduler_name: my-scheduler\n")
    docs = export_k8s(files, "k8s", "d.json", None, "--api", "jobset", "--k8s-config",
                      str(files / "k8s.yaml"))
    for objs in docs.values():
        assert [d["kind"] for d in objs] == ["ConfigMap", "JobSet"]
        for rj in objs[-1]["spec"]["replicatedJobs"]:
            assert rj["template"]["spec"]["template"]["spec"]["schedulerName"] == "my-scheduler"
    (files / "k8s.yaml").write_text("gang: yunikorn\n")
    code, out = run("export", "k8s", "--decision", str(files / "d.json"), "--cluster",
                    str(files / "cluster.yaml"), "--jobs", str(files / "jobs.yaml"), "--out",
                    str(files / "bad"), "--k8s-config", str(files / "k8s.yaml"))
    assert code == 2 and "gang" in out and not (files / "bad").exists()


def test_executor_creates_and_replaces_the_volcano_pod_group(tmp_path: Path) -> None:
    cluster = load_cluster_text(CLUSTER)
    job = JobSpec("g", "gpt-tiny", 64, 100, 16)
    cfg = K8sConfig(api="jobset", gang="volcano", retry_wait_s=0.02, retry_timeout_s=10,
                    stop_timeout_s=5)
    report = SolveReport("t", "optimal", 0.0, 0.0, 0.0, 0.0, False)

    def decision(place: dict[str, int], action: Action = Action.START) -> Decision:
        g = sum(place.values())
        return Decision([Allocation("g", "A100-40GB", g, 1, ExecutionPlan(dp=g), place, 1.0,
                                    action)], [], report)

    with ApiServerDouble() as srv:
        client = K8sClient(srv.api_client(), cfg.namespace, cfg.retry_timeout_s,
                           cfg.retry_wait_s)
        ex = KubernetesExecutor(tmp_path / "m", cluster, cfg, client)
        (ev,) = ex.apply(decision({"a100-0": 8, "a100-1": 8}), [job])
        assert "created" in ev.detail, ev.detail
        (pg,) = srv.all("PodGroup")
        assert pg["spec"]["minMember"] == 2
        (ev,) = ex.apply(decision({"a100-0": 8, "a100-1": 4, "a100-2": 4}, Action.MIGRATE),
                         [job])
        assert "replaced" in ev.detail, ev.detail
        (pg,) = [p for p in srv.all("PodGroup") if "deletionTimestamp" not in p["metadata"]]
        assert pg["spec"]["minMember"] == 3
