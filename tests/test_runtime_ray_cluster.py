"""A real two-node Ray cluster on this machine (two raylets, GPU types A40 and A10 as Ray's own
accelerator_type resources, fake GPUs: Ray accepts --num-gpus without any), joined by address:
import, placement (one bundle per node, pinned by node id), GPU requests, MASTER_ADDR, a
user workload resized across nodes, `apportion run --ray-address` to completion, and the
embedded mode beside it (a fresh instance of its own despite a stale session file and a
running cluster)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import stop_processes_mentioning

from apportion.errors import InputError

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from apportion.runtime.executors.executor import Health, MemoryLaunchLog
from apportion.runtime.executors.ray.executor import PlacementError, RayExecutor
from apportion.runtime.executors.ray.importer import describe_nodes, import_ray

from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.gpus import canonical_gpu_name
from apportion.jobs import JobSpec, Workload
from apportion.plans import ExecutionPlan

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"
# `ray start` under this interpreter (its workers then import this checkout of apportion)
RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    # RAY_TMPDIR: Ray's "/tmp/ray" (sessions, the current-cluster file) lives under tmp
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(tmp),
            "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def cluster():
    tmp = Path(tempfile.mkdtemp(prefix="ray-c-", dir="/tmp"))  # short: socket paths
    env = _env(tmp)
    port = _free_port()
    base = ["--num-cpus", "2", "--num-gpus", "2", "--disable-usage-stats",
            "--dashboard-agent-listen-port", str(_free_port()),
            "--metrics-export-port", str(_free_port())]
    head_only = ["--include-dashboard", "false", "--dashboard-port", str(_free_port()),
                 "--ray-client-server-port", str(_free_port())]
    head = subprocess.run([*RAY, "start", "--head", "--port", str(port), "--temp-dir", str(tmp),
                           "--resources", json.dumps({"accelerator_type:A40": 1}), *base,
                           *head_only],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        assert head.returncode == 0, head.stderr[-2000:]
        base[5:7] = ["--dashboard-agent-listen-port", str(_free_port())]
        base[7:9] = ["--metrics-export-port", str(_free_port())]
        worker = subprocess.run([*RAY, "start", "--address", f"127.0.0.1:{port}", "--resources",
                                 json.dumps({"accelerator_type:A10": 1}), *base],
                                env=env, capture_output=True, text=True, timeout=300, check=False)
        assert worker.returncode == 0, worker.stderr[-2000:]
        yield {"address": f"127.0.0.1:{port}", "tmp": tmp, "env": env}
    finally:
        stop_processes_mentioning(tmp)  # never `ray stop`: it would stop every Ray on this host
        shutil.rmtree(tmp, ignore_errors=True)


def test_import_reads_node_names_types_and_counts(cluster) -> None:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    nodes = import_ray(cluster["address"])
    assert not ray.is_initialized()  # it disconnected again
    assert sorted(n["gpu_type"] for n in nodes) == ["A10", "A40"]
    assert all(n["gpus"] == 2 and n["cpus"] == 2 and n["memory_gib"] > 0 for n in nodes)
    assert len({n["name"] for n in nodes}) == 2 and all(n["address"] for n in nodes)
    assert set(nodes[0]) == {"name", "gpu_type", "gpus", "cpus", "memory_gib", "address"}
    with pytest.raises(InputError, match="nothing answers at"):  # refused at once, by flag
        import_ray(f"127.0.0.1:{_free_port()}")
    # labels and custom resources, where accelerator_type is absent
    fake = [{"NodeID": "aa" * 28, "Alive": True, "NodeManagerHostname": "h",
             "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0, "GPU": 4.0},
             "Labels": {"ray.io/accelerator-type": "H100"}},
            {"NodeID": "bb" * 28, "Alive": True, "NodeManagerHostname": "h",
             "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0, "T4": 2.0}},
            {"NodeID": "cc" * 28, "Alive": False, "NodeManagerHostname": "gone",
             "Resources": {}}]
    got = describe_nodes(fake)
    assert [(d["name"], d["gpu_type"], d["gpus"]) for d in got] == [
        ("h-aaaaaaaa", "H100", 4), ("h-bbbbbbbb", "T4", 2)]


def test_cli_imports_the_running_cluster_and_a_round_places_on_it(cluster, tmp_path) -> None:
    """The documented door: `apportion cluster import --from ray --ray-address ADDR --out
    FILE` writes a cluster file the round reads, naming both GPU types; a dead address is
    refused by flag with exit 2 and nothing written."""
    apportion = str(Path(sys.executable).parent / "apportion")
    env = cluster["env"]
    out = tmp_path / "ray-cluster.yaml"
    r = subprocess.run([apportion, "cluster", "import", "--from", "ray", "--ray-address",
                        cluster["address"], "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    data = yaml.safe_load(out.read_text())
    types = sorted(g["gpu_type"] for g in data["node_groups"])
    assert types == sorted([canonical_gpu_name("A10"), canonical_gpu_name("A40")]), data
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "a", "model": "gpt-tiny", "global_batch_size": 4, "iterations": 10,
         "requested_gpus": 2}]}))
    r = subprocess.run([apportion, "solve-round", "--cluster", str(out), "--jobs",
                        str(tmp_path / "j.yaml"), "--backend", "greedy", "--json",
                        str(tmp_path / "d.json")], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    placed = json.loads((tmp_path / "d.json").read_text())["allocations"]
    assert [a["job"] for a in placed] == ["a"] and placed[0]["gpu_type"] in types
    dead = tmp_path / "dead.yaml"
    r = subprocess.run([apportion, "cluster", "import", "--from", "ray", "--ray-address",
                        f"127.0.0.1:{_free_port()}", "--out", str(dead)], env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 2 and "--ray-address" in r.stderr and not dead.exists(), r.stderr


def _decision(alloc: Allocation) -> Decision:
    return Decision([alloc], [], SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False))


def _wait(ex: RayExecutor, job: str, cond, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in ex.poll():
            if p.job == job and cond(p):
                return p
        time.sleep(0.5)
    raise AssertionError(f"{job}: not reached; {ex.poll()}")


def test_user_workload_resized_across_nodes_of_the_joined_cluster(cluster, tmp_path) -> None:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    logbook = MemoryLaunchLog()
    ex = RayExecutor(tmp_path, address=cluster["address"], launch_log=logbook,
                     placement_timeout_s=60.0, checkpoint_every=3, checkpoint_interval_s=0)
    try:
        nodes = {d["gpu_type"]: d for d in ex.ray_nodes().values()}
        a40, a10 = nodes["A40"], nodes["A10"]
        job = JobSpec("u", "gpt-tiny", 8, 16, 2, workload=Workload(
            "torchrun", (sys.executable, str(EXAMPLE)), env={"EXAMPLE_STEP_SLEEP": "0.3"}))
        first = Allocation("u", "A40", 2, 1, ExecutionPlan(dp=2), {a40["name"]: 2}, 1.0)
        ev = ex.apply(_decision(first), [job])
        assert [(e.action, e.workers) for e in ev] == [("start", 2)], ev
        rec = logbook.records[1]
        assert [w["node_id"] for w in rec["workers"]] == [a40["node_id"]] * 2
        gpus = [w["cuda_visible_devices"] for w in rec["workers"]]
        assert all(gpus) and len(set(gpus)) == 2  # each actor was given its own GPU
        assert ev[0].spec["env"]["MASTER_ADDR"] == a40["address"]  # rank 0's node
        p = _wait(ex, "u", lambda p: p.iterations_done >= 4 and p.health == Health.RUNNING)
        # resize: one rank on the other node (a migrate in GPU type, a resize in count)
        second = Allocation("u", "A10", 1, 1, ExecutionPlan(dp=1), {a10["name"]: 1}, 1.0,
                            Action.RESIZE)
        ex.apply(_decision(second), [job])
        assert logbook.records[1]["outcome"] == "checkpointed", logbook.records[1]
        ck = logbook.records[1]["checkpoint_end"]
        assert ck is not None and ck >= 3
        assert [w["node_id"] for w in logbook.records[2]["workers"]] == [a10["node_id"]]
        done = _wait(ex, "u", lambda p: p.done)
        assert done.health == Health.FINISHED and done.iterations_done == 16, done
        lines = [json.loads(x) for x in (Path(ex.groups.get("u", ex.stopped["u"]).dir)
                                         / "progress.jsonl").read_text().splitlines()]
        worlds = [x.get("world") for x in lines if "loss" in x]
        assert worlds[0] == 2 and worlds[-1] == 1
        resumed = next(x["iteration"] for x in lines if "loss" in x and x.get("world") == 1)
        assert resumed == ck + 1  # the new group resumed from the checkpoint, not from zero
        assert p.iterations_done >= 4
        # a placement naming a node the Ray cluster lacks is refused with the names it has
        bad = Allocation("x", "A40", 1, 1, ExecutionPlan(), {"nowhere": 1}, 1.0)
        with pytest.raises(PlacementError, match="not a node of the Ray cluster"):
            ex._place(bad)
    finally:
        ex.shutdown()
        ex.close()


def test_run_joins_the_cluster_by_address_and_trains_to_completion(cluster, tmp_path) -> None:
    nodes = import_ray(cluster["address"])
    groups = [{"prefix": f"g{i}", "nodes": [n["name"]], "gpu_type":
               canonical_gpu_name(n["gpu_type"]), "gpus_per_node": n["gpus"],
               "cpus_per_node": n["cpus"], "intra_node_link": "pcie"}
              for i, n in enumerate(nodes)]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "ray2", "node_groups": groups}))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "w", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 8,
         "requested_gpus": 2, "workload": {"kind": "torchrun",
                                           "command": [sys.executable, str(EXAMPLE)],
                                           "checkpoint_every": 4}}]}))
    env = {**cluster["env"], "RAY_ADDRESS": cluster["address"]}
    cli = [sys.executable, "-m", "apportion.cli"]
    r = subprocess.run([*cli, "submit", "j.yaml", "--state", "s.db"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*cli, "run", "--executor", "ray", "--cluster", "c.yaml", "--state",
                        "s.db", "--interval", "3", "--until-idle", "--timeout", "400"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    st = json.loads(subprocess.run([*cli, "status", "--state", "s.db", "--json"], cwd=tmp_path,
                                   env=env, capture_output=True, text=True, check=False).stdout)
    (w,) = st["jobs"]
    assert w["state"] == "finished" and w["iterations_done"] == 8, w


def test_embedded_mode_starts_its_own_instance(cluster, tmp_path) -> None:
    """A stale current-cluster file and a running cluster on the host: the embedded mode still
    starts (and stops) a fresh instance of its own."""
    stale = Path(cluster["tmp"]) / "ray"
    stale.mkdir(exist_ok=True)
    (stale / "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}\n")
    script = (
        "import ray, json; from apportion.runtime.executors.ray.executor import RayExecutor\n"
        "from apportion.runtime.executors.local.executor import local_cluster\n"
        f"ex = RayExecutor({str(tmp_path)!r}, local_cluster(2), num_cpus=1)\n"
        "nodes = ray.nodes(); res = ray.cluster_resources()\n"
        "print(json.dumps({'nodes': len(nodes), 'T4': res.get('T4'), "
        "'foreign': any(k.startswith('accelerator_type') for k in res)}))\n"
        "ex.close()\n")
    env = {k: v for k, v in cluster["env"].items() if k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"nodes": 1, "T4": 2.0, "foreign": False}


REPORT = ("from apportion.runtime import workload as w\n"
          "n = w.iterations()\n"
          "for i in range(1, n + 1):\n"
          "    w.report_progress(i, checkpoint=i == n)\n")


def test_run_fails_a_launch_whose_placement_never_comes(cluster, tmp_path) -> None:
    """`apportion run --ray-address`: the cluster file says the A40 node has 4 GPUs (Ray's
    node has 2), and ``big`` fits only there (3 GPUs: half its 6, more than the A10 node
    has). Its placement group never becomes ready; after the bounded wait that launch fails
    with the node's shortfall, counted towards --max-retries, and big ends failed while
    ``small`` trains to the end. Before, the refused placement was a `pending` event: big
    stayed `running` with no worker, and every round spent the wait on it again."""
    nodes = import_ray(cluster["address"])
    groups = [{"prefix": f"g{i}", "nodes": [n["name"]], "gpu_type":
               canonical_gpu_name(n["gpu_type"]),
               "gpus_per_node": 4 if n["gpu_type"] == "A40" else n["gpus"],
               "cpus_per_node": n["cpus"], "intra_node_link": "pcie"}
              for i, n in enumerate(nodes)]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "ray2", "node_groups": groups}))
    (tmp_path / "report.py").write_text(REPORT)
    wl = {"kind": "torchrun", "command": [sys.executable, str(tmp_path / "report.py")]}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "big", "model": "gpt-tiny", "global_batch_size": 96, "iterations": 5,
         "requested_gpus": 6, "workload": wl},
        {"id": "small", "model": "gpt-tiny", "global_batch_size": 64, "iterations": 5,
         "requested_gpus": 1, "workload": wl}]}))
    env = {**cluster["env"], "RAY_ADDRESS": cluster["address"],
           "APPORTION_RAY_PLACEMENT_TIMEOUT_S": "5"}
    cli = [sys.executable, "-m", "apportion.cli"]
    r = subprocess.run([*cli, "submit", "j.yaml", "--state", "s.db"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*cli, "run", "--executor", "ray", "--cluster", "c.yaml", "--state",
                        "s.db", "--interval", "3", "--until-idle", "--timeout", "300",
                        "--max-retries", "1"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    st = {j["id"]: j for j in json.loads(subprocess.run(
        [*cli, "status", "--state", "s.db", "--json"], cwd=tmp_path, env=env,
        capture_output=True, text=True, check=False).stdout)["jobs"]}
    assert st["small"]["state"] == "finished" and st["small"]["iterations_done"] == 5, \
        (st["small"], r.stderr[-3000:])
    big = st["big"]
    assert big["state"] == "failed", (big, r.stderr[-3000:])
    assert "2 times in a row" in big["reason"] and "not placed within 5s" in big["reason"], big
    assert "'GPU': asks 3, the node has 2" in big["reason"], big
