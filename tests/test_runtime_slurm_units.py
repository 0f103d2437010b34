"""The Slurm executor's parts that need no Slurm: parsers of Slurm's output, the job components
and sbatch command of an allocation, and the per-node agent run as a real process (it starts
real ranks with the workload contract; SLURMD_NODENAME stands in for the node Slurm names)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from apportion.runtime.executors.slurm import batch
from apportion.runtime.executors.slurm import submit
from apportion.runtime.executors.slurm.executor import allocation_from_dict
from apportion.runtime.executors.slurm.commands import (
    Gres,
    parse_gres,
    parse_key_values,
    parse_records,
    sacct_states,
    squeue_states,
)
from apportion.runtime.executors.slurm.nodes import (
    NodeLimits,
    cap_requests,
    disagreements,
    limits_from_records,
)
from apportion.runtime.executors.slurm.task import TASK_VARS, exit_path, rendezvous_path
from hypothesis import given
from hypothesis import strategies as st

from apportion.decision import Action, Allocation
from apportion.plans import ExecutionPlan


def test_gres_strings() -> None:
    assert parse_gres("gpu:a40:2(S:0)") == [Gres("gpu", "a40", 2)]
    assert parse_gres("gpu:a100:4(S:0-1),gpu:v100:no_consume:2,mps:1K") == [
        Gres("gpu", "a100", 4), Gres("gpu", "v100", 2), Gres("mps", None, 1024)]
    assert parse_gres("gpu:8") == [Gres("gpu", None, 8)]
    assert parse_gres("gpu:tesla") == [Gres("gpu", "tesla", 1)]
    assert parse_gres("(null)") == [] and parse_gres("") == []


def test_key_values_with_spaces_in_values() -> None:
    rec = parse_key_values("NodeName=n1 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC (2024-02-01) "
                           "RealMemory=8000 Reason=bad DIMM [root@2024-01-02T10:00:00] State=IDLE")
    assert rec["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC (2024-02-01)"
    assert rec["Reason"] == "bad DIMM [root@2024-01-02T10:00:00]"
    assert rec["RealMemory"] == "8000" and rec["State"] == "IDLE"
    assert [r["JobId"] for r in parse_records("JobId=4 JobState=RUNNING\nJobId=5 A=b\n")] == [
        "4", "5"]


def test_squeue_and_sacct_fold_heterogeneous_components() -> None:
    q = squeue_states("12+0|RUNNING|None\n12+1|PENDING|Resources\n13|COMPLETED|None\n"
                      "14+0|COMPLETED|None\n14+1|FAILED|NonZeroExitCode\n")
    assert q == {"12": ("RUNNING", "None"), "13": ("COMPLETED", "None"),
                 "14": ("FAILED", "NonZeroExitCode")}
    s = sacct_states("20|CANCELLED by 0|0:15\n20.batch|CANCELLED|0:15\n21+0|COMPLETED|0:0\n"
                     "21+1|NODE_FAIL|1:0\n22|COMPLETED|0:0\n")
    assert s == {"20": ("CANCELLED", "0:15"), "21": ("NODE_FAIL", "1:0"),
                 "22": ("COMPLETED", "0:0")}


def _alloc(placement: dict[str, int], cpus: int = 0, mem: float = 0.0) -> Allocation:
    n = sum(placement.values())
    return Allocation("j", "A40", n, 1, ExecutionPlan(dp=n), placement, 1.0, cpus=cpus,
                      host_memory_gib=mem)


def test_uniform_placement_is_one_component_uneven_is_heterogeneous(tmp_path: Path) -> None:
    even = _alloc({"n2": 2, "n1": 2})
    reqs = batch.node_requests(even, {"n1": 32, "n2": 32}, {"n1": 256.0, "n2": 256.0},
                               {"n1": 4, "n2": 4})
    assert reqs == {"n1": (16, 131072), "n2": (16, 131072)}  # the GPUs' share of each node
    (comp,) = batch.components(even.placement, {"n1": "a40", "n2": "a40"}, reqs)
    assert comp.options() == ["--nodes=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                              "--gres=gpu:a40:2", "--cpus-per-task=16", "--mem=131072M"]
    lines = submit.directives([comp], ["--job-name=x"])
    assert lines[0] == "#SBATCH --job-name=x" and "#SBATCH hetjob" not in lines
    assert "#SBATCH --gres=gpu:a40:2" in lines

    uneven = _alloc({"n1": 2, "n2": 1, "n3": 1}, cpus=12, mem=12.0)
    reqs = batch.node_requests(uneven, request_memory=False)
    comps = batch.components(uneven.placement, {"n1": "a40", "n2": "a40", "n3": None}, reqs)
    assert [(c.nodes, c.gres, c.cpus, c.mem_mib) for c in comps] == [
        (("n1",), "gpu:a40:2", 6, None), (("n2",), "gpu:a40:1", 3, None),
        (("n3",), "gpu:1", 3, None)]
    lines = submit.directives(comps, ["--job-name=x", "--chdir=/a b/c"])
    assert lines.count("#SBATCH hetjob") == 2 and lines.count("#SBATCH --job-name=x") == 1
    assert '#SBATCH --chdir="/a b/c"' in lines  # quoted as Slurm reads a directive
    assert lines.index("#SBATCH --gres=gpu:a40:1") > lines.index("#SBATCH hetjob")


def test_rank_layout_is_contiguous_per_node_in_name_order() -> None:
    assert batch.rank_layout({"b": 1, "a": 2}) == [{"name": "a", "ranks": [0, 1]},
                                                    {"name": "b", "ranks": [2]}]


@given(st.dictionaries(st.sampled_from(["n1", "n2", "gpu-17", "x.y"]), st.integers(1, 8),
                       min_size=1), st.integers(1, 4), st.integers(0, 3), st.booleans())
def test_allocation_record_round_trips(placement: dict[str, int], tp: int, zero: int,
                                       ckpt: bool) -> None:
    n = sum(placement.values())
    a = Allocation("job/1", "H100-80GB", n, 1, ExecutionPlan(dp=n, tp=tp, zero_stage=zero,
                                                             checkpointing=ckpt),
                   placement, 3.5, Action.RESIZE, 0.25, 1.5, 20.0, 8, 64.0)
    assert allocation_from_dict(json.loads(json.dumps(a.as_dict()))) == a


# -- the per-node agent, as a real process ---------------------------------------------------
RANK = textwrap.dedent('''
    import json, os, signal, sys, time
    keys = [k for k in os.environ if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT") or k.startswith(("APPORTION_", "SLURM"))]
    with open(f"env{os.environ['RANK']}.json", "w") as fh:
        json.dump({k: os.environ[k] for k in keys}, fh)
    if os.environ.get("MODE") == "crash" and os.environ["RANK"] == "1":
        print("Traceback: RuntimeError: out of memory", file=sys.stderr)
        sys.exit(7)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    t0 = time.time()
    while not stop and time.time() - t0 < 30 and os.environ.get("MODE") != "quick":
        time.sleep(0.05)
''')


def _launch(tmp_path: Path, mode: str, nodes: list[dict]) -> tuple[Path, dict]:
    (tmp_path / "rank.py").write_text(RANK)
    spec = {"job": "j", "launch_id": f"L-{mode}", "jobdir": str(tmp_path),
            "command": [sys.executable, str(tmp_path / "rank.py")], "cwd": str(tmp_path),
            "env": {"WORLD_SIZE": "3", "APPORTION_JOB_ID": "j", "MODE": mode},
            "nodes": nodes, "world": 3, "master_addr": "10.9.9.9", "kill_grace_s": 5}
    path = tmp_path / f"launch-{mode}.json"
    path.write_text(json.dumps(spec))
    return path, spec


def _agent(path: Path, node: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "SLURMD_NODENAME": node, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", **env}
    return subprocess.Popen([sys.executable, "-m", "apportion.runtime.executors.slurm.task",
                             str(path)], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


NODES = [{"name": "n1", "ranks": [0, 1]}, {"name": "n2", "ranks": [2]}]


def test_agents_give_every_rank_the_contract(tmp_path: Path) -> None:
    path, _ = _launch(tmp_path, "quick", NODES)
    second = _agent(path, "n2")  # waits for the first node's port
    first = _agent(path, "n1")
    assert first.wait(60) == 0 and second.wait(60) == 0, (first.stderr.read(), second.stderr.read())
    port = json.loads(rendezvous_path(tmp_path, "L-quick").read_text())["master_port"]
    envs = [json.loads((tmp_path / f"env{r}.json").read_text()) for r in range(3)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"), ("1", "1", "2"), ("2", "0", "1")]
    for e in envs:
        assert e["WORLD_SIZE"] == "3" and e["MASTER_ADDR"] == "10.9.9.9"
        assert e["MASTER_PORT"] == str(port) and e["APPORTION_JOB_ID"] == "j"
        assert not set(e) & set(TASK_VARS)  # the agent's own Slurm task variables are dropped
    rec = json.loads(exit_path(tmp_path, "L-quick", "n1").read_text())
    assert rec["codes"] == {"0": 0, "1": 0} and rec["failed"] == []


def test_a_failing_rank_stops_its_sibling_and_sets_the_exit_code(tmp_path: Path) -> None:
    path, _ = _launch(tmp_path, "crash", [{"name": "n1", "ranks": [0, 1]}])
    agent = _agent(path, "n1")
    assert agent.wait(60) == 7
    rec = json.loads(exit_path(tmp_path, "L-crash", "n1").read_text())
    assert rec["failed"] == [1] and rec["codes"]["1"] == 7 and rec["codes"]["0"] == 0
    assert "out of memory" in (tmp_path / "rank1.stderr").read_text()
    assert "==== apportion launch L-crash ====" in (tmp_path / "rank1.stderr").read_text()


def test_sigterm_reaches_every_rank_which_exits_cleanly(tmp_path: Path) -> None:
    path, _ = _launch(tmp_path, "wait", [{"name": "n1", "ranks": [0, 1]}])
    agent = _agent(path, "n1")
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"env{r}.json").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)  # the ranks install their handlers after writing the file
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 0
    rec = json.loads(exit_path(tmp_path, "L-wait", "n1").read_text())
    assert rec["stop_requested"] and rec["codes"] == {"0": 0, "1": 0} and rec["failed"] == []


def test_an_agent_on_a_node_outside_the_launch_fails_with_a_reason(tmp_path: Path) -> None:
    path, _ = _launch(tmp_path, "quick", NODES)
    agent = _agent(path, "elsewhere")
    assert agent.wait(30) == 1
    assert "'elsewhere' is not in this launch (n1, n2)" in agent.stderr.read()


def test_a_rank_that_cannot_start_fails_its_launch_and_stops_its_siblings(
        tmp_path: Path) -> None:
    """A missing binary is the rank's failure, with its reason in the rank's stderr and the
    exit file, not an agent crash that leaves the started ranks behind."""
    path, spec = _launch(tmp_path, "wait", [{"name": "n1", "ranks": [0, 1]}])
    spec["command"] = ["/nonexistent/binary"]
    path.write_text(json.dumps(spec))
    agent = _agent(path, "n1")
    assert agent.wait(60) == 127, agent.stderr.read()
    rec = json.loads(exit_path(tmp_path, "L-wait", "n1").read_text())
    assert rec["failed"] == [0] and rec["codes"] == {"0": 127}
    assert "cannot start ['/nonexistent/binary']: FileNotFoundError" in \
        (tmp_path / "rank0.stderr").read_text()


def test_python_is_apportions_interpreter_whatever_path_the_job_sets(tmp_path: Path) -> None:
    path, spec = _launch(tmp_path, "quick", [{"name": "n1", "ranks": [0]}])
    spec["command"] = ["python", str(tmp_path / "rank.py")]
    spec["env"]["PATH"] = "/nonexistent-dir"
    path.write_text(json.dumps(spec))
    agent = _agent(path, "n1")
    assert agent.wait(60) == 0, agent.stderr.read()
    assert json.loads((tmp_path / "env0.json").read_text())["RANK"] == "0"  # the rank ran


NODE_RECORDS = parse_records(
    "NodeName=a40-0 CPUAlloc=0 CPUEfctv=4 CPUTot=4 Gres=gpu:a40:2 RealMemory=8000 State=IDLE\n"
    "NodeName=big-0 CPUEfctv=60 CPUTot=64 Gres=gpu:h100:8(S:0-1) RealMemory=1031000 "
    "MemSpecLimit=31000 State=MIXED\n")


def test_node_limits_read_what_jobs_may_ask() -> None:
    lim = limits_from_records(NODE_RECORDS)
    assert lim["a40-0"] == NodeLimits("a40-0", 4, 8000, 2)
    assert lim["big-0"] == NodeLimits("big-0", 60, 1000000, 8)  # specialised cores and memory


def test_requests_are_capped_at_the_gpus_share_of_what_slurm_has() -> None:
    lim = limits_from_records(NODE_RECORDS)
    # the reported case: 8 GiB in the file, RealMemory=8000: a whole node asked 8192 MiB
    whole = cap_requests({"a40-0": (8, 8192)}, {"a40-0": 2}, lim, headroom=0.02)
    assert whole == {"a40-0": (4, 7840)}
    half = cap_requests({"a40-0": (4, 4096)}, {"a40-0": 1}, lim, headroom=0.02)
    assert half == {"a40-0": (2, 3920)}
    # a request already within the node is kept; no memory asked stays none; an unknown
    # node keeps what it asked; more GPUs than the node has are capped at the whole node
    assert cap_requests({"big-0": (7, 100000)}, {"big-0": 1}, lim) == {"big-0": (7, 100000)}
    assert cap_requests({"a40-0": (8, None)}, {"a40-0": 2}, lim) == {"a40-0": (4, None)}
    assert cap_requests({"x": (9, 9)}, {"x": 1}, lim) == {"x": (9, 9)}
    assert cap_requests({"a40-0": (16, 99999)}, {"a40-0": 4}, lim, 0.0) == {"a40-0": (4, 8000)}


def test_disagreements_name_each_node_and_figure() -> None:
    from apportion.config import cluster_from_data

    def group(name: str, gpus: int, cpus: int, mem: float) -> dict:
        return {"prefix": name.split("-")[0], "nodes": [name], "gpu_type": "A40",
                "gpus_per_node": gpus, "cpus_per_node": cpus, "host_memory_gib": mem}

    lim = limits_from_records(NODE_RECORDS)
    agree = cluster_from_data({"name": "c", "node_groups": [group("a40-0", 2, 4, 7.812)]}, "t")
    assert disagreements(agree, lim) == []  # an imported file (GiB rounded) agrees
    off = cluster_from_data({"name": "c", "node_groups": [group("a40-0", 4, 8, 8),
                                                          group("gone-0", 2, 4, 8)]}, "t")
    got = disagreements(off, lim)
    assert got[0] == ("node a40-0: the cluster file says host_memory_gib 8 (8192 MiB) where "
                      "Slurm's RealMemory gives 8000 MiB; cpus_per_node 8 where Slurm has 4 "
                      "CPUs; 4 GPUs where Slurm's Gres has 2 GPUs")
    assert got[1].startswith("node gone-0 of the cluster file is not a node of this Slurm")
