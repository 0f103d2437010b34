"""The Kubernetes executor's life cycle, through the official client, against an API server double.

No Kubernetes API server can run on these machines; k8s_schemas/server.py is
a real HTTP server in the test process that validates every object against
the shipped CRDs and core schemas, keeps deleted objects terminating (409 on a
create under their name), enforces JobSet's immutability and resourceVersion
conflicts, and plays the controllers' part (Suspended conditions; Kueue
admission with ``kueue=True``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from apportion.runtime.executors.executor import Health
from apportion.runtime.executors.kubernetes.client import K8sClient
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.manifests import object_name
from apportion.runtime.executors.kubernetes.executor import KubernetesExecutor
from k8s_schemas.server import ApiServerDouble

from apportion.config import cluster_from_data
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, Workload, job_dirname
from apportion.plans import ExecutionPlan

CLUSTER = cluster_from_data({"name": "c", "node_groups": [{
    "prefix": "a100", "count": 4, "gpu_type": "A100-40GB", "gpus_per_node": 8,
    "cpus_per_node": 96, "host_memory_gib": 1024}]}, "test")
REPORT = SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False)
KIND = {"trainjob": "TrainJob", "jobset": "JobSet", "pytorchjob": "PyTorchJob"}
DONE = {"trainjob": "Complete", "jobset": "Completed", "pytorchjob": "Succeeded"}
JOB = JobSpec("exp/1", "gpt-tiny", 64, 100, 16)


def decision(place: dict[str, int] | None, plan: ExecutionPlan | None = None,
             action: Action = Action.START, job: str = JOB.id) -> Decision:
    if place is None:
        return Decision([], [], REPORT)
    g = sum(place.values())
    return Decision([Allocation(job, "A100-40GB", g, 1, plan or ExecutionPlan(dp=g), place, 1.0,
                                action)], [], REPORT)


def cfg_for(api: str, **kw: object) -> K8sConfig:
    settings: dict = {"retry_wait_s": 0.02, "retry_timeout_s": 10, "stop_timeout_s": 5, **kw}
    return K8sConfig(api=api, **settings)


def executor(srv: ApiServerDouble, cfg: K8sConfig, tmp: Path, **kw: object) -> KubernetesExecutor:
    client = K8sClient(srv.api_client(), cfg.namespace, cfg.retry_timeout_s, cfg.retry_wait_s)
    return KubernetesExecutor(tmp / "manifests", CLUSTER, cfg, client, **kw)  # type: ignore[arg-type]


def suspended(obj: dict) -> bool:
    spec = obj["spec"]
    return bool(spec["runPolicy"]["suspend"] if obj["kind"] == "PyTorchJob" else spec["suspend"])


@pytest.mark.parametrize("kueue", [False, True], ids=["plain", "kueue"])
@pytest.mark.parametrize("api", ["trainjob", "jobset", "pytorchjob"])
def test_life_cycle(api: str, kueue: bool, tmp_path: Path) -> None:
    name, kind = object_name(JOB.id), KIND[api]
    with ApiServerDouble(kueue=kueue) as srv:
        ex = executor(srv, cfg_for(api, queue="team" if kueue else None), tmp_path)
        uneven = {"a100-1": 4, "a100-2": 8, "a100-3": 4}
        (ev,) = ex.apply(decision(uneven), [JOB])
        assert ev.action == "start" and "created" in ev.detail
        obj = srv.get(kind, name)
        assert obj is not None and not suspended(obj)  # Kueue admitted it (the double's)
        if kueue:
            (wl,) = srv.all("Workload")
            assert wl["spec"]["active"] is True
        uid = obj["metadata"]["uid"]
        assert [p.health for p in ex.poll()] == [Health.STARTING]

        # a plan-only change: suspend, patch the ConfigMap, resume -- same object
        (ev,) = ex.apply(decision(uneven, ExecutionPlan(dp=8, tp=2), Action.RESIZE), [JOB])
        assert "patched" in ev.detail
        obj = srv.get(kind, name)
        assert obj["metadata"]["uid"] == uid and not suspended(obj)
        cm = srv.get("ConfigMap", f"{name}-config")
        assert json.loads(cm["data"]["plan.json"])["tp"] == 2

        # a resize changes the pod templates (immutable): replaced, create retried on 409
        (ev,) = ex.apply(decision({"a100-0": 8}, action=Action.RESIZE), [JOB])
        assert "replaced" in ev.detail
        obj = srv.get(kind, name)
        assert obj["metadata"]["uid"] != uid and not suspended(obj)
        assert any(m == "POST" and c == 409 for m, _, c in srv.log)  # old one was terminating
        assert ex.client is not None and ex.client.retries >= 1

        # preempt: suspended, never deleted
        (ev,) = ex.apply(decision(None), [JOB])
        assert ev.action == "preempt"
        obj = srv.get(kind, name)
        assert obj is not None and suspended(obj)
        if kueue:  # deactivated, or Kueue would have unsuspended it again
            assert [w["spec"]["active"] for w in srv.all("Workload")] == [False]
        assert [p.health for p in ex.poll()] == [Health.CHECKPOINTED]

        # start again on the same nodes: resumed in place
        (ev,) = ex.apply(decision({"a100-0": 8}), [JOB])
        assert "patched" in ev.detail and not suspended(srv.get(kind, name))

        srv.set_condition(kind, name, DONE[api])
        (p,) = ex.poll()
        assert p.health is Health.FINISHED and p.iterations_done == JOB.iterations
        assert ex.shutdown() == []
        assert srv.get(kind, name) is not None


def test_conflicts_are_retried(tmp_path: Path) -> None:
    with ApiServerDouble(conflicts=4) as srv:
        ex = executor(srv, cfg_for("jobset"), tmp_path)
        ex.apply(decision({"a100-0": 8}), [JOB])
        ex.apply(decision({"a100-0": 8}, ExecutionPlan(dp=4, tp=2), Action.RESIZE), [JOB])
        assert srv.conflicts == 0 and [c for _, _, c in srv.log].count(409) >= 4
        assert ex.client is not None and ex.client.retries >= 4
        assert json.loads(srv.get("ConfigMap", f"{object_name(JOB.id)}-config")["data"][
            "plan.json"])["tp"] == 2


def test_stop_leaves_jobs_running_unless_drain(tmp_path: Path) -> None:
    with ApiServerDouble() as srv:
        ex = executor(srv, cfg_for("trainjob"), tmp_path)
        ex.apply(decision({"a100-0": 8}), [JOB])
        assert ex.shutdown(checkpoint=True) == []
        assert not suspended(srv.get("TrainJob", object_name(JOB.id)))
        drain = executor(srv, cfg_for("trainjob"), tmp_path, drain=True)  # adopts the job
        events = drain.shutdown(checkpoint=True)
        assert [(e.job, e.action) for e in events] == [(JOB.id, "preempt")]
        assert suspended(srv.get("TrainJob", object_name(JOB.id)))


def test_restarted_scheduler_adopts_its_objects(tmp_path: Path) -> None:
    with ApiServerDouble() as srv:
        first = executor(srv, cfg_for("jobset"), tmp_path)
        first.apply(decision({"a100-1": 4, "a100-2": 8, "a100-3": 4}), [JOB])
        posts = sum(1 for m, _, _ in srv.log if m == "POST")
        second = executor(srv, cfg_for("jobset"), tmp_path)
        assert second.adopted_jobs() == {JOB.id}  # a restarted run keeps it running
        (ev,) = second.apply(decision({"a100-1": 4, "a100-2": 8, "a100-3": 4},
                                      action=Action.KEEP), [JOB])
        assert ev.action == "keep"
        assert sum(1 for m, _, _ in srv.log if m == "POST") == posts  # nothing created twice


def test_a_restarted_run_hands_over_the_launch_records_of_adopted_objects(
        tmp_path: Path) -> None:
    """One launch log (one store) across a restart: the record of the object the second
    executor adopted is adopted (not closed as if its workers had died), and closed when the
    object completes."""
    from types import SimpleNamespace

    from apportion.runtime.executors.executor import MemoryLaunchLog

    book = MemoryLaunchLog()
    with ApiServerDouble() as srv:
        first = executor(srv, cfg_for("jobset"), tmp_path, launch_log=book)
        first.apply(decision({"a100-0": 8}), [JOB])
        assert (book.records[1]["state"], book.records[1]["workers"][0]["kind"]) == (
            "running", "JobSet")
        second = executor(srv, cfg_for("jobset"), tmp_path, launch_log=book)
        rec = SimpleNamespace(id=1, job=JOB.id, checkpoint_start=0)
        (r,) = second.reconcile([rec], {JOB.id: JOB})
        assert (r.launch_id, r.job, r.action) == (1, JOB.id, "adopted")
        second.apply(decision({"a100-0": 8}, action=Action.KEEP), [JOB])
        srv.set_condition("JobSet", object_name(JOB.id), "Completed")
        (p,) = second.poll()
        assert p.health is Health.FINISHED
        assert (book.records[1]["state"], book.records[1]["outcome"]) == ("ended", "finished")


def test_status_and_progress_read_back(tmp_path: Path) -> None:
    mount = tmp_path / "ckpt"
    user = JobSpec("u", "gpt-tiny", 64, 50, 8,
                   workload=Workload("torchrun", ("python", "train.py")))
    with ApiServerDouble() as srv:
        ex = executor(srv, cfg_for("jobset", local_checkpoint_mount=str(mount)), tmp_path)
        ex.apply(Decision([decision({"a100-0": 8}).allocations[0],
                           decision({"a100-1": 8}, job="u").allocations[0]], [], REPORT),
                 [JOB, user])
        assert {p.job: p.health for p in ex.poll()} == {JOB.id: Health.STARTING,
                                                        "u": Health.STARTING}
        d = mount / job_dirname(JOB.id)
        d.mkdir(parents=True)
        launch = ex.tracked[JOB.id].launch_id
        (d / "progress.json").write_text(json.dumps({
            "iterations_done": 40, "iter_time_s": 0.25, "loss": 2.5, "launch_id": launch,
            "grad_sqr": 0.5, "grad_var": 8.0}))
        du = mount / job_dirname("u")
        du.mkdir(parents=True)
        (du / "progress.jsonl").write_text('{"iteration": 7, "iter_time_s": 1.5, "grad_sqr": 2, '
                                           '"grad_var": 3}\n{"itera')
        got = {p.job: p for p in ex.poll()}
        assert (got[JOB.id].health, got[JOB.id].iterations_done, got[JOB.id].iter_time_s) == \
            (Health.RUNNING, 40, 0.25)
        assert (got["u"].health, got["u"].iterations_done) == (Health.RUNNING, 7)
        # the workload's gradient statistics go on to the round (its batch's efficiency)
        assert (got[JOB.id].grad_stats, got["u"].grad_stats) == ((0.5, 8.0), (2.0, 3.0))
        # completed before the target: the workers stopped early -> failed, resumable
        srv.set_condition("JobSet", object_name(JOB.id), "Completed")
        srv.set_condition("JobSet", object_name("u"), "Failed", "BackoffLimitExceeded")
        got = {p.job: p for p in ex.poll()}
        assert got[JOB.id].health is Health.FAILED and "iteration 40 of 100" in got[JOB.id].error
        assert got["u"].health is Health.FAILED and "BackoffLimitExceeded" in got["u"].error
        # a failed job started again is replaced (a finished JobSet cannot resume)
        (ev,) = ex.apply(decision({"a100-0": 8}), [JOB])
        assert "replaced" in ev.detail


def test_refused_plan_is_never_created(tmp_path: Path) -> None:
    with ApiServerDouble() as srv:
        ex = executor(srv, cfg_for("trainjob"), tmp_path)
        (ev,) = ex.apply(decision({"a100-0": 8}, ExecutionPlan(dp=2, tp=2, pp=2)), [JOB])
        assert ev.action == "refused" and "pipeline and tensor" in ev.detail
        assert srv.all("TrainJob") == [] and srv.all("ConfigMap") == []
        (p,) = ex.poll()
        assert p.health is Health.FAILED and "pipeline" in (p.error or "")
        ex2 = executor(srv, cfg_for("pytorchjob"), tmp_path)
        three = {"a100-0": 8, "a100-1": 4, "a100-2": 2, "a100-3": 2}
        (ev,) = ex2.apply(decision(three), [JOB])
        assert ev.action == "refused" and srv.all("PyTorchJob") == []


def test_without_a_cluster_manifests_are_written(tmp_path: Path) -> None:
    ex = KubernetesExecutor(tmp_path / "m", CLUSTER, K8sConfig())
    (ev,) = ex.apply(decision({"a100-1": 4, "a100-2": 8, "a100-3": 4}), [JOB])
    assert ev.action == "start" and list((tmp_path / "m").glob("round0001-*.yaml"))
    assert [p.health for p in ex.poll()] == [Health.STARTING]


# -- apportion run against the double -------------------------------------------------------------
def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "test"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}]}))
    return path


def _workers(srv: ApiServerDouble, mount: Path, stop: threading.Event, kind: str) -> None:
    """Stand-in for the pods: an unsuspended job reports its target and completes."""
    while not stop.is_set():
        for obj in srv.all(kind):
            if suspended(obj) or obj["metadata"].get("deletionTimestamp"):
                continue
            if any(c["type"] in DONE.values() for c in obj.get("status", {}).get("conditions", [])):
                continue
            cm = srv.get("ConfigMap", f"{obj['metadata']['name']}-config")
            cfg = json.loads(cm["data"]["config.json"])
            d = mount / Path(cfg["workdir"]).name
            d.mkdir(parents=True, exist_ok=True)
            (d / "progress.json").write_text(json.dumps({
                "iterations_done": cfg["iterations"], "iter_time_s": 0.1,
                "launch_id": cfg["launch_id"]}))
            srv.set_condition(kind, obj["metadata"]["name"], "Complete")
        time.sleep(0.05)


def test_apportion_run_until_idle(tmp_path: Path) -> None:
    from apportion.cli.run_command import run_command

    from apportion.store import open_store

    (tmp_path / "cluster.yaml").write_text(json.dumps({"name": "c", "node_groups": [{
        "prefix": "a100", "nodes": ["gpu-a", "gpu-b"], "gpu_type": "NVIDIA-A100-SXM4-40GB",
        "gpus_per_node": 8, "cpus_per_node": 96, "host_memory_gib": 1024,
        "gpu_product_label": "NVIDIA-A100-SXM4-40GB"}]}))
    (tmp_path / "jobs.yaml").write_text(json.dumps({"jobs": [
        {"id": f"j{i}", "model": "gpt-tiny", "global_batch_size": 64, "iterations": 20,
         "requested_gpus": 4} for i in range(3)]}))
    mount = tmp_path / "ckpt"
    (tmp_path / "k8s.yaml").write_text(json.dumps({
        "namespace": "default", "local_checkpoint_mount": str(mount), "retry_wait_s": 0.02,
        "stop_timeout_s": 5, "image": "apportion-worker:test"}))
    from apportion.cli.store import submit

    assert submit(tmp_path / "jobs.yaml", tmp_path / "s.db") == 0
    with ApiServerDouble() as srv:
        stop = threading.Event()
        t = threading.Thread(target=_workers, args=(srv, mount, stop, "TrainJob"), daemon=True)
        t.start()
        try:
            code = run_command("kubernetes", str(tmp_path / "cluster.yaml"), tmp_path / "s.db",
                               0.5, True, 60.0, tmp_path / "runs",
                               str(_kubeconfig(tmp_path / "kubeconfig", srv.url)), 2.0,
                               tmp_path / "k8s.yaml")
        finally:
            stop.set()
            t.join()
        assert code == 0
        store = open_store(tmp_path / "s.db", create=False)
        try:
            assert {j.id: j.state.value for j in store.jobs()} == {
                "j0": "finished", "j1": "finished", "j2": "finished"}
        finally:
            store.close()
        objs = srv.all("TrainJob")
        assert len(objs) == 3
        for o in objs:
            rj = srv.get("TrainingRuntime", o["metadata"]["name"])["spec"]["template"]["spec"]
            pod = rj["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            nodes = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            assert set(nodes) <= {"gpu-a", "gpu-b"}
            assert pod["containers"][0]["image"] == "apportion-worker:test"


def test_apportion_run_bad_k8s_config_exits_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from apportion.cli import app

    (tmp_path / "jobs.yaml").write_text('{"jobs": []}')
    (tmp_path / "k8s.yaml").write_text("namespace: Not_A_Namespace\n")
    runner = CliRunner()
    assert runner.invoke(app, ["submit", str(tmp_path / "jobs.yaml"), "--state",
                               str(tmp_path / "s.db")]).exit_code == 0
    res = runner.invoke(app, ["run", "--executor", "kubernetes", "--cluster", "crius-testbed",
                              "--state", str(tmp_path / "s.db"), "--k8s-config",
                              str(tmp_path / "k8s.yaml"), "--until-idle"])
    assert res.exit_code == 2 and "namespace" in res.output


def test_an_unreachable_api_fails_the_job_not_the_round(tmp_path: Path) -> None:
    srv = ApiServerDouble().__enter__()
    cfg = cfg_for("jobset", retry_timeout_s=1)
    ex = KubernetesExecutor(tmp_path, CLUSTER, cfg, K8sClient(srv.api_client(retries=0),
                                                              cfg.namespace, 1, 0.02))
    srv.__exit__(None, None, None)  # the API server goes away
    (ev,) = ex.apply(decision({"a100-0": 8}), [JOB])
    assert ev.action == "error"
    (p,) = ex.poll()
    assert p.health is Health.FAILED and p.error


def test_run_fails_a_job_the_api_server_refuses_while_its_neighbour_finishes(
        tmp_path: Path) -> None:
    """Through `apportion run --executor kubernetes` against the schema-validating API server
    double: a validating admission webhook refuses ``bad``'s objects (its image is from a
    registry the cluster's policy forbids) with a 403. Each refusal is a failed launch in the
    store with the server's message, counted towards --max-retries, and bad ends failed with
    that reason while ``good`` runs to the end. Before, the failure carried no launch: the
    fault policy saw it once, counted nothing, and bad stayed `running` until the timeout."""
    import subprocess
    import sys

    from apportion import store_launches as sl
    from apportion.store import open_store

    (tmp_path / "cluster.yaml").write_text(json.dumps({"name": "c", "node_groups": [{
        "prefix": "a100", "nodes": ["gpu-a", "gpu-b"], "gpu_type": "NVIDIA-A100-SXM4-40GB",
        "gpus_per_node": 8, "cpus_per_node": 96, "host_memory_gib": 1024,
        "gpu_product_label": "NVIDIA-A100-SXM4-40GB"}]}))
    (tmp_path / "jobs.yaml").write_text(json.dumps({"jobs": [
        {"id": "good", "model": "gpt-tiny", "global_batch_size": 64, "iterations": 20,
         "requested_gpus": 4},
        {"id": "bad", "model": "gpt-tiny", "global_batch_size": 64, "iterations": 20,
         "requested_gpus": 4, "workload": {"kind": "torchrun", "command": ["python", "t.py"],
                                           "image": "registry.untrusted.example/train:1"}}]}))
    mount = tmp_path / "ckpt"
    (tmp_path / "k8s.yaml").write_text(json.dumps({
        "namespace": "default", "local_checkpoint_mount": str(mount), "retry_wait_s": 0.02,
        "stop_timeout_s": 5, "image": "apportion-worker:test"}))
    cli = [sys.executable, "-m", "apportion.cli"]
    assert subprocess.run([*cli, "submit", "jobs.yaml", "--state", "s.db"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False).returncode == 0
    with ApiServerDouble() as srv:
        srv.deny(lambda o: o["kind"] in ("TrainJob", "TrainingRuntime", "JobSet", "PyTorchJob")
                 and "registry.untrusted.example/" in json.dumps(o),
                 "images must come from registry.example.com")
        stop = threading.Event()
        t = threading.Thread(target=_workers, args=(srv, mount, stop, "TrainJob"), daemon=True)
        t.start()
        try:
            r = subprocess.run([*cli, "run", "--executor", "kubernetes", "--cluster",
                                "cluster.yaml", "--state", "s.db", "--kubeconfig",
                                str(_kubeconfig(tmp_path / "kubeconfig", srv.url)),
                                "--k8s-config", "k8s.yaml", "--interval", "0.5", "--until-idle",
                                "--timeout", "120", "--time-budget", "2", "--max-retries", "1"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=400,
                               check=False)
        finally:
            stop.set()
            t.join()
        assert r.returncode == 0, r.stderr[-3000:]
        assert srv.all("TrainJob") and all(o["metadata"]["annotations"] for o in
                                            srv.all("TrainJob"))
    st = {j["id"]: j for j in json.loads(subprocess.run(
        [*cli, "status", "--state", "s.db", "--json"], cwd=tmp_path, capture_output=True,
        text=True, timeout=120, check=False).stdout)["jobs"]}
    assert st["good"]["state"] == "finished", (st["good"], r.stderr[-3000:])
    bad = st["bad"]
    assert bad["state"] == "failed", (bad, r.stderr[-3000:])
    assert "2 times in a row" in bad["reason"] and "(403 Forbidden)" in bad["reason"], bad
    assert 'admission webhook "policy.example.com" denied the request: images must come ' \
           "from registry.example.com" in bad["reason"], bad
    store = open_store(tmp_path / "s.db", create=False)
    try:
        recs = sl.launches(store, "bad")
    finally:
        store.close()
    assert [(x.executor, x.outcome) for x in recs] == [("kubernetes", "failed")] * 2, recs
