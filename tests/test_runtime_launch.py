"""Launch specs, the dry-run executor, action reconciliation and Kubernetes manifests."""

from __future__ import annotations

import io
import json
from pathlib import Path

import yaml
from apportion.runtime.executors.executor import Executor, actions_for
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.manifests import Target, job_objects, object_name
from apportion.runtime.executors.kubernetes.executor import KubernetesExecutor
from apportion.runtime.executors.dry_run.executor import DryRunExecutor
from apportion.runtime.executors.launch import launch_spec, torchrun_command
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.gpus import gpu_product
from apportion.jobs import JobSpec, RunningState
from apportion.plans import ExecutionPlan
from apportion.policies import run_round

HETERO = Cluster("het", [NodeGroup("a100", 2, "A100-80GB", 8), NodeGroup("t4", 2, "T4", 4)])


def decide(cluster: Cluster, jobs: list[JobSpec]) -> Decision:
    dec = run_round(cluster, jobs, 0.0).decision
    check = validate(dec, cluster, jobs)
    assert check.ok, check.violations
    return dec


def report() -> SolveReport:
    return SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False)


def alloc(job: str, gpus: int, action: Action = Action.START, gpu_type: str = "T4",
          placement: dict[str, int] | None = None) -> Allocation:
    return Allocation(job, gpu_type, gpus, 1, ExecutionPlan(dp=gpus),
                      placement or {"t4-0": gpus}, 1.0, action, cpus=8, host_memory_gib=64.0)


def test_launch_spec_carries_the_plan_unchanged(tmp_path: Path) -> None:
    job = JobSpec("j", "gpt-tiny", 16, 10, 2)
    a = Allocation("j", "T4", 4, 1, ExecutionPlan(dp=2, tp=2, accumulation=2), {"n": 4}, 1.0)
    spec = launch_spec(job, a, "start", tmp_path, master_port=1234)
    assert spec.workers == 4 and len(spec.per_worker_env) == 4
    assert spec.config["plan"] == a.plan.as_dict() and spec.config["global_batch_size"] == 16
    assert spec.env["WORLD_SIZE"] == "4" and spec.env["MASTER_PORT"] == "1234"
    assert [e["RANK"] for e in spec.per_worker_env] == ["0", "1", "2", "3"]
    cmd = torchrun_command(spec)
    assert cmd[0] == "torchrun" and "--nproc-per-node=4" in cmd and cmd[-1].endswith("config.json")


def test_dry_run_prints_and_returns_every_action(tmp_path: Path) -> None:
    jobs = [JobSpec("a", "gpt-tiny", 16, 10, 2), JobSpec("b", "bert-tiny", 16, 10, 1)]
    dec = decide(HETERO, jobs)
    out = io.StringIO()
    ex = DryRunExecutor(tmp_path, out)
    assert isinstance(ex, Executor)
    events = ex.apply(dec, jobs)
    printed = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [p["job"] for p in printed] == [e.job for e in events] == ["a", "b"]
    for e, a in zip(events, sorted(dec.allocations, key=lambda a: a.job)):
        assert e.action == "start" and e.spec is not None
        assert e.spec["config"]["plan"] == a.plan.as_dict() and e.spec["workers"] == a.plan.gpus
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
    # the next round: nothing changed -> keep; a job gone from the decision -> preempt
    only_a = Decision([x for x in dec.allocations if x.job == "a"], [], report())
    ev2 = ex.apply(only_a, jobs)
    assert {(e.job, e.action) for e in ev2} == {("a", "keep"), ("b", "preempt")}
    assert [p.job for p in ex.poll()] == ["a"]


@settings(max_examples=50)
@given(running=st.sets(st.sampled_from("abcde")), alive=st.sets(st.sampled_from("abcde")),
       allocated=st.dictionaries(st.sampled_from("abcde"),
                                 st.sampled_from([Action.START, Action.KEEP, Action.RESIZE,
                                                  Action.MIGRATE])))
def test_reconciliation_covers_every_job_once(running: set[str], alive: set[str],
                                              allocated: dict[str, Action]) -> None:
    alive &= running
    dec = Decision([alloc(j, 1, act) for j, act in allocated.items()], [], report())
    steps = actions_for(dec, running, alive)
    assert sorted(s.job for s in steps) == sorted(running | set(allocated))
    for s in steps:
        if s.job not in allocated:
            assert s.action == Action.PREEMPT and s.allocation is None
        elif s.job not in running:
            assert s.action == Action.START
        elif s.action == Action.KEEP:
            assert s.restart == (s.job not in alive)
    kinds = [s.action for s in steps]
    if Action.PREEMPT in kinds and Action.START in kinds:  # capacity is released first
        assert kinds.index(Action.PREEMPT) < kinds.index(Action.START)


def test_pytorchjob_manifest_shapes() -> None:
    job = JobSpec("Job_1", "gpt-tiny", 16, 10, 8)
    a = alloc("Job_1", 8, gpu_type="A100-80GB", placement={"a100-0": 4, "a100-1": 4})
    cm, pj = job_objects(job, a, Target(HETERO, K8sConfig(image="img:1", namespace="ml"),
                                        "pytorchjob"))
    assert cm["apiVersion"] == "v1" and cm["kind"] == "ConfigMap"
    assert json.loads(cm["data"]["config.json"])["plan"] == a.plan.as_dict()
    assert pj["apiVersion"] == "kubeflow.org/v1" and pj["kind"] == "PyTorchJob"
    assert pj["metadata"]["name"] == object_name("Job_1")
    specs = pj["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"}
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 2
    assert pj["spec"]["nprocPerNode"] == "4"
    for rs in specs.values():
        assert rs["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        pod = rs["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": gpu_product("A100-80GB")}
        (c,) = pod["containers"]
        assert c["name"] == "pytorch"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        # the decision's 4 of 8 CPUs (32-CPU nodes) scaled to allocatable (31) less what
        # DaemonSet pods take (reserve.pods_cpus, 0.5); never the whole node
        assert c["resources"]["requests"]["cpu"] == f"{int(4 * (31 - 0.5) / 32 * 1000)}m"
        mounts = {m["name"] for m in c["volumeMounts"]}
        assert mounts == {v["name"] for v in pod["volumes"]}
    assert yaml.safe_load(yaml.safe_dump(pj)) == pj


def test_kubernetes_executor_writes_manifests_per_round(tmp_path: Path) -> None:
    jobs = [JobSpec("a", "gpt-tiny", 16, 10, 4), JobSpec("b", "bert-tiny", 16, 10, 2)]
    dec = decide(HETERO, jobs)
    ex = KubernetesExecutor(tmp_path, HETERO, K8sConfig(api="pytorchjob"))
    events = ex.apply(dec, jobs)
    assert {e.job for e in events} == {"a", "b"}
    files = sorted(tmp_path.glob("round0001-*.yaml"))
    assert [f.name for f in files] == sorted(f"round0001-{object_name(j)}.yaml" for j in "ab")
    files = [tmp_path / f"round0001-{object_name(j)}.yaml" for j in "ab"]
    for f, a in zip(files, sorted(dec.allocations, key=lambda a: a.job)):
        _cm, pj = yaml.safe_load_all(f.read_text())
        pod = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == gpu_product(a.gpu_type)
        total = sum(rs["replicas"] * int(rs["template"]["spec"]["containers"][0]["resources"]
                    ["limits"]["nvidia.com/gpu"]) for rs in pj["spec"]["pytorchReplicaSpecs"].values())
        assert total == a.gpus
    # a resize in a later round writes a new manifest for that job only
    a_alloc = dec.allocation("a")
    assert a_alloc is not None
    running = [JobSpec("a", "gpt-tiny", 16, 10, 4, running=RunningState(
        a_alloc.gpu_type, a_alloc.gpus, 1, dict(a_alloc.placement)))]
    smaller = Allocation("a", a_alloc.gpu_type, 1, 1, ExecutionPlan(),
                         {min(a_alloc.placement): 1}, 1.0, Action.RESIZE)
    ev2 = ex.apply(Decision([smaller], [], report()), running)
    assert {(e.job, e.action) for e in ev2} == {("a", "resize"), ("b", "preempt")}
    assert [f.name for f in tmp_path.glob("round0002-*.yaml")] == [
        f"round0002-{object_name('a')}.yaml"]
