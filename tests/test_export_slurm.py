"""`apportion export slurm`: one batch script per allocation, #SBATCH lines an operator reads
and resubmits, the same submission the Slurm executor makes, accepted by a real Slurm."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from apportion.runtime.executors.slurm.executor import SlurmExecutor
from apportion.runtime.executors.slurm.local_cluster import LocalSlurm
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import load_cluster, load_jobs
from apportion.decision import Allocation, Decision, SolveReport
from apportion.jobs import job_dirname
from apportion.plans import ExecutionPlan

CLUSTER = """name: slurm-site
node_groups:
  - {prefix: a40, nodes: [gpu-a1, gpu-a2], gpu_type: A40, gpus_per_node: 4, cpus_per_node: 32,
     host_memory_gib: 250, labels: {gpu_type_raw: a40}}
  - {prefix: a10, nodes: [gpu-b1], gpu_type: A10, gpus_per_node: 2, cpus_per_node: 16,
     host_memory_gib: 125, labels: {gpu_type_raw: nvidia_a10}}
"""
JOBS = """jobs:
  - {id: big/1, model: gpt-tiny, global_batch_size: 64, iterations: 5000, requested_gpus: 6,
     iterations_done: 1000}
  - {id: small, model: bert-tiny, global_batch_size: 32, iterations: 100, requested_gpus: 2,
     workload: {kind: torchrun, command: [python, train.py], env: {HF_HOME: /hf}}}
"""
DECISION = {"formulation": "cells", "pending": [], "allocations": [
    {"job": "big/1", "gpu_type": "A40", "gpus": 6, "stages": 1, "plan": {"dp": 6},
     "placement": {"gpu-a1": 4, "gpu-a2": 2}, "est_throughput": 1.0, "iter_time_s": 1.8},
    {"job": "small", "gpu_type": "A10", "gpus": 2, "stages": 1, "plan": {"dp": 2},
     "placement": {"gpu-b1": 2}, "est_throughput": 1.0}]}
SCONTROL = (
    "NodeName=gpu-a1 Arch=x86_64 CPUTot=32 CPUEfctv=30 RealMemory=256000 Gres=gpu:a40:4(S:0) "
    "NodeAddr=10.0.0.11 State=IDLE\n"
    "NodeName=gpu-a2 Arch=x86_64 CPUTot=32 CPUEfctv=30 RealMemory=256000 Gres=gpu:a40:4(S:0) "
    "NodeAddr=10.0.0.12 State=IDLE\n"
    "NodeName=gpu-b1 Arch=x86_64 CPUTot=16 CPUEfctv=16 RealMemory=128000 "
    "Gres=gpu:nvidia_a10:2 NodeAddr=10.0.0.21 State=MIXED\n")


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    (tmp_path / "d.json").write_text(json.dumps(DECISION))
    (tmp_path / "nodes.txt").write_text(SCONTROL)
    return tmp_path


def export(tmp: Path, *extra: str, out: str = "sb") -> tuple[int, str]:
    res = CliRunner().invoke(app, ["export", "slurm", "--decision", str(tmp / "d.json"),
                                   "--cluster", str(tmp / "cluster.yaml"), "--jobs",
                                   str(tmp / "jobs.yaml"), "--out", str(tmp / out), *extra])
    return res.exit_code, res.output


def sbatch_lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]


def test_one_script_per_allocation_with_readable_directives(files: Path) -> None:
    code, out = export(files)
    assert code == 0, out
    index = json.loads((files / "sb" / "index.json").read_text())
    assert set(index["jobs"]) == {"big/1", "small"}
    big = (files / "sb" / index["jobs"]["big/1"]["script"]).read_text()
    assert big.startswith("#!/bin/bash\n# apportion job big/1: 6 x A40")
    lines = sbatch_lines(big)
    # 4 + 2 GPUs: a heterogeneous job, one component per count, each pinned and typed
    assert lines.count("#SBATCH hetjob") == 1
    assert "#SBATCH --nodelist=gpu-a1" in lines and "#SBATCH --gres=gpu:a40:4" in lines
    assert "#SBATCH --nodelist=gpu-a2" in lines and "#SBATCH --gres=gpu:a40:2" in lines
    assert lines.index("#SBATCH --nodelist=gpu-a2") > lines.index("#SBATCH hetjob")
    # --time: 4,000 iterations left x 1.8 s, + 25 %, + 10 min, rounded up to a minute
    minutes = math.ceil((4000 * 1.8 * 1.25 + 600) / 60)
    assert f"#SBATCH --time={minutes // 60:02d}:{minutes % 60:02d}:00" in lines
    assert "#SBATCH --signal=TERM@60" in lines  # the workers checkpoint before the limit
    assert index["jobs"]["big/1"]["time"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    # the step: one agent per node on the launch file written in the job's folder
    jobdir = files / "sb" / job_dirname("big/1")
    launch = json.loads((jobdir / "slurm-launch-export.json").read_text())
    assert "srun --het-group=0-1 --kill-on-bad-exit=1 --ntasks-per-node=1" in big
    assert str(jobdir / "slurm-launch-export.json") in big
    assert launch["world"] == 6 and [n["name"] for n in launch["nodes"]] == ["gpu-a1", "gpu-a2"]
    assert (jobdir / "config.json").exists()  # the built-in trainer's
    # directives come before any command (sbatch stops reading them at the first one)
    body = [ln for ln in big.splitlines() if ln and not ln.startswith("#")]
    assert big.index(body[0]) > big.rindex("#SBATCH")

    small = (files / "sb" / index["jobs"]["small"]["script"]).read_text()
    assert "#SBATCH hetjob" not in small and "#SBATCH --gres=gpu:nvidia_a10:2" in small
    assert not any(ln.startswith("#SBATCH --time") for ln in sbatch_lines(small))
    assert "# --time: no estimate" in small  # said, not silently left out
    launch = json.loads((files / "sb" / job_dirname("small") / "slurm-launch-export.json")
                        .read_text())
    assert launch["command"] == ["python", "train.py"] and launch["env"]["HF_HOME"] == "/hf"


def test_operator_limit_partition_and_site_options(files: Path) -> None:
    code, out = export(files, "--time-limit", "1-12:00", "--partition", "gpu", "--sbatch-args",
                       "--account=lab --qos='high prio'", "--workdir", str(files / "shared"))
    assert code == 0, out
    for name in ("big_1", "small"):
        script = next((files / "sb").glob(f"{name}*.sbatch")).read_text()
        lines = sbatch_lines(script)
        assert "#SBATCH --time=1-12:00:00" in lines and "#SBATCH --partition=gpu" in lines
        assert "#SBATCH --account=lab" in lines and '#SBATCH --qos="high prio"' in lines
        assert any(ln.startswith(f"#SBATCH --chdir={files / 'shared'}") for ln in lines)
    assert (files / "shared" / job_dirname("small") / "slurm-launch-export.json").exists()


@pytest.mark.parametrize("extra, flag", [
    (("--time-limit", "soon"), "--time-limit"),
    (("--time-limit", "0"), "--time-limit"),
    (("--time-margin", "-1"), "--time-margin"),
    (("--sbatch-args", "--comment='unclosed"), "--sbatch-args"),
])
def test_bad_options_exit_2_naming_them_and_write_nothing(files: Path, extra: tuple[str, ...],
                                                          flag: str) -> None:
    code, out = export(files, *extra)
    assert code == 2 and flag in out, out
    assert not (files / "sb").exists()


def test_an_invalid_decision_exits_2_and_writes_nothing(files: Path) -> None:
    d = json.loads(json.dumps(DECISION))
    d["allocations"][0]["placement"] = {"gpu-a1": 4, "gpu-a2": 4}  # 8 GPUs for a 6-GPU cell
    (files / "d.json").write_text(json.dumps(d))
    code, out = export(files)
    assert code == 2 and "d.json" in out and "allocations" in out
    assert not (files / "sb").exists()


def test_a_plan_the_workload_cannot_run_is_refused_by_name(files: Path) -> None:
    d = json.loads(json.dumps(DECISION))
    d["allocations"][0]["plan"] = {"dp": 1, "tp": 2, "pp": 3}  # PP with TP: not the builtin's
    d["allocations"][0]["stages"] = 3
    (files / "d.json").write_text(json.dumps(d))
    code, out = export(files)
    assert code == 2 and "allocations[0].plan" in out and "big/1" in out
    assert not (files / "sb").exists()
    code, out = export(files, "--skip-unsupported")
    assert code == 0 and "1 refused" in out
    index = json.loads((files / "sb" / "index.json").read_text())
    assert set(index["jobs"]) == {"small"} and set(index["refused"]) == {"big/1"}


def test_the_same_submission_the_executor_makes(files: Path, tmp_path: Path) -> None:
    """The executor on the same folder, Slurm answering as the saved scontrol does: every
    #SBATCH line agrees (the executor adds its launch comment), and so does the step."""
    code, out = export(files, "--slurm-nodes", str(files / "nodes.txt"), "--workdir",
                       str(tmp_path / "runs"), "--python", sys.executable)
    assert code == 0, out
    cluster = load_cluster(files / "cluster.yaml")
    jobs, _ = load_jobs(files / "jobs.yaml")
    submitted: list[list[str]] = []

    class Fake(SlurmExecutor):
        def _run(self, args: list[str], timeout_s: float = 60.0) -> str:
            if args[0] == "scontrol":
                return SCONTROL
            if args[0] == "sbatch":
                submitted.append(args)
                return f"{100 + len(submitted)}"
            return ""

    ex = Fake(tmp_path / "runs", cluster=cluster, adopt=False)
    allocs = [Allocation(a["job"], a["gpu_type"], a["gpus"], 1, ExecutionPlan(**a["plan"]),
                         a["placement"], 1.0, iter_time_s=a.get("iter_time_s"))
              for a in DECISION["allocations"]]
    events = ex.apply(Decision(allocs, [], SolveReport("t", "optimal", 0, 0, 0, 0, False)), jobs)
    assert len(submitted) == 2 and all(cmd[:2] == ["sbatch", "--parsable"] for cmd in submitted)
    for ev in events:
        executor_script = Path(ev.spec["script"]).read_text()
        exported = (files / "sb" / f"{job_dirname(ev.job)}.sbatch").read_text()
        mine = [ln for ln in sbatch_lines(executor_script) if "--comment=" not in ln]
        assert mine == sbatch_lines(exported), ev.job
        step = [ln for ln in executor_script.splitlines() if ln.startswith("srun")]
        step_x = [ln for ln in exported.splitlines() if ln.startswith("srun")]
        assert [s.replace(ev.spec["launch_id"], "export") for s in step] == step_x
        launch = json.loads(Path(ev.spec["jobdir"], f"slurm-launch-{ev.spec['launch_id']}.json")
                            .read_text())
        launch_x = json.loads(Path(ev.spec["jobdir"], "slurm-launch-export.json").read_text())
        for k in ("nodes", "world", "master_addr", "command", "cwd"):
            assert launch[k] == launch_x[k], (ev.job, k)
    big = (files / "sb" / f"{job_dirname('big/1')}.sbatch").read_text()
    # Slurm's figures: GRES types from scontrol, CPUs within CPUEfctv, memory within RealMemory
    assert "#SBATCH --gres=gpu:a40:4" in big and "#SBATCH --cpus-per-task=30" in big


# -- a real Slurm (a private cluster on this machine) ----------------------------------------------
# the private cluster fixture of tests/test_runtime_slurm.py, one definition
from tests.test_runtime_slurm import slurm  # noqa: E402,F401

WORKER = textwrap.dedent('''
    import json, os
    out = os.path.join(os.environ["APPORTION_CHECKPOINT_DIR"], "rank%s.json" % os.environ["RANK"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "SLURMD_NODENAME")},
              open(out, "w"))
    with open(os.environ["APPORTION_PROGRESS_FILE"], "a") as fh:
        fh.write(json.dumps({"iteration": int(os.environ["APPORTION_ITERATIONS"])}) + "\\n")
''')


def test_a_real_slurm_runs_the_exported_scripts(slurm: LocalSlurm, tmp_path: Path) -> None:
    """`cluster import --from slurm`, a decision, `export slurm`, then `sbatch` of the script
    as an operator would: Slurm takes every directive (the time limit the estimate gave
    included) and the job's ranks run. (The executor submits its heterogeneous jobs through
    the same scripts: tests/test_runtime_slurm.py runs one.)"""
    r = subprocess.run([sys.executable, "-m", "apportion.cli", "cluster", "import", "--from",
                        "slurm", "--out", str(tmp_path / "c.yaml")], capture_output=True,
                       text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    cluster = yaml.safe_load((tmp_path / "c.yaml").read_text())
    nodes = {n: g for g in cluster["node_groups"] for n in g["nodes"]}
    (tmp_path / "w.py").write_text(WORKER)
    a40 = next(n for n, g in nodes.items() if g["gpu_type"] == "A40")
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump({"jobs": [{
        "id": "x", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 3,
        "requested_gpus": 2, "workload": {"kind": "torchrun",
                                          "command": [sys.executable, str(tmp_path / "w.py")]}}]}))
    (tmp_path / "d.json").write_text(json.dumps({"allocations": [{
        "job": "x", "gpu_type": "A40", "gpus": 2, "plan": {"dp": 2}, "placement": {a40: 2},
        "iter_time_s": 0.5}]}))
    res = CliRunner().invoke(app, ["export", "slurm", "--decision", str(tmp_path / "d.json"),
                                   "--cluster", str(tmp_path / "c.yaml"), "--jobs",
                                   str(tmp_path / "jobs.yaml"), "--out", str(tmp_path / "sb"),
                                   "--python", sys.executable])
    assert res.exit_code == 0, res.output
    index = json.loads((tmp_path / "sb" / "index.json").read_text())
    script = tmp_path / "sb" / index["jobs"]["x"]["script"]
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                       check=False, timeout=60)
    assert r.returncode == 0, r.stderr  # Slurm accepts every directive as written
    sid = r.stdout.strip().split(";")[0]
    info = subprocess.run(["scontrol", "show", "job", sid], capture_output=True, text=True,
                          check=True).stdout
    assert "TimeLimit=00:11:00" in info  # 3 iterations x 0.5 s x 1.25 + 10 min, rounded up
    ckdir = Path(index["jobs"]["x"]["jobdir"]) / "checkpoint"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(list(ckdir.glob("rank*.json"))) < 2:
        time.sleep(0.3)
    ranks = sorted(json.loads(p.read_text())["RANK"] for p in ckdir.glob("rank*.json"))
    assert ranks == ["0", "1"], list(ckdir.parent.iterdir())
