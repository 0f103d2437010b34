"""What users expect of a command line: option values complete in the shell (through Typer's /
Click's completion machinery, as the installed script calls it), APPORTION_STATE and
APPORTION_CLUSTER stand for --state and --cluster (a flag always wins), and every variable
apportion reads or sets is in the one table of docs/environment.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
CLUSTER = ("name: envc\nnode_groups: [{prefix: l4, count: 2, gpu_type: L4, gpus_per_node: 4, "
           "cpus_per_node: 32}]\n")
JOBS = ("jobs: [{id: a, model: gpt-tiny, global_batch_size: 8, iterations: 50, "
        "requested_gpus: 2}]\n")


def complete(words: str, shell: str = "bash") -> list[str]:
    """What the installed completion script gets back for the command line ``words`` (the
    last word is the one being typed), from a real ``apportion`` process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_")}
    env["_APPORTION_COMPLETE"] = f"complete_{shell}"
    if shell == "bash":
        env.update(COMP_WORDS=words, COMP_CWORD=str(len(words.split(" ")) - 1))
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
    boot = "import sys; sys.argv[0] = 'apportion'; from apportion.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", boot], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if ln]  # what COMPREPLY=( $(...) ) holds


def test_policy_backend_and_estimator_values_complete() -> None:
    from apportion.policies import POLICIES

    got = complete("apportion solve-round --policy apportion")
    assert got == sorted(p for p in POLICIES if p.startswith("apportion"))
    assert "apportion-plans" in got
    assert complete("apportion solve-round --backend h") == ["highs"]
    assert complete("apportion solve-round --estimator m") == ["morphling"]
    assert "auto" in complete("apportion run --estimator ")
    assert complete("apportion simulate --estimator a") == ["analytic"]  # no auto in replays
    assert complete("apportion compare --policies fcfs,ti") == ["fcfs,tiresias",
                                                                "fcfs,tiresias-pollux"]
    assert "fcfs,fcfs" not in complete("apportion compare --policies fcfs,f")


def test_trace_and_cluster_values_complete_and_paths_are_the_shells() -> None:
    gavel = complete("apportion simulate --trace gavel-m")
    assert gavel == ["gavel-max-min-fairness", "gavel-medium", "gavel-minimize-makespan",
                     "gavel-msr"]
    assert "synthetic" in complete("apportion compare --trace syn")
    run = complete("apportion run --cluster ")
    assert {"local", "crius-1280", "crius-testbed", "morphling-64", "crius"} <= set(run)
    assert "local" not in complete("apportion solve-round --cluster ")  # local: run, serve
    assert complete("apportion export slurm --cluster crius-t") == ["crius-testbed"]
    # a path names no bundled value: nothing comes back, so the shell completes files
    assert complete("apportion solve-round --cluster ./my") == []
    zsh = "\n".join(complete("apportion solve-round --cluster ./my", shell="zsh"))
    assert zsh == "_files"
    zsh = "\n".join(complete("apportion solve-round --policy sia", shell="zsh"))
    assert '"sia":' in zsh  # a line of help beside the value


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "j.yaml").write_text(JOBS)
    monkeypatch.setenv("APPORTION_STATE", str(tmp_path / "env.db"))
    monkeypatch.setenv("APPORTION_CLUSTER", str(tmp_path / "c.yaml"))
    return tmp_path


def invoke(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_apportion_state_stands_for_state_and_the_flag_wins(env: Path) -> None:
    code, _, err = invoke("submit", str(env / "j.yaml"))
    assert code == 0, err
    assert (env / "env.db").exists()
    code, out, _ = invoke("status", "--json")
    assert code == 0 and [j["id"] for j in json.loads(out)["jobs"]] == ["a"]
    other = env / "other.db"
    (env / "b.yaml").write_text(JOBS.replace("id: a", "id: b"))
    assert invoke("submit", str(env / "b.yaml"), "--state", str(other))[0] == 0
    code, out, _ = invoke("status", "--json", "--state", str(other))
    assert code == 0 and [j["id"] for j in json.loads(out)["jobs"]] == ["b"]  # the flag's
    code, out, _ = invoke("status", "--json")
    assert [j["id"] for j in json.loads(out)["jobs"]] == ["a"]
    # solve-round takes the store from the variable when no --jobs is given ...
    code, _, err = invoke("solve-round", "--backend", "greedy")
    assert code == 0, err
    code, out, _ = invoke("history", "--json")
    assert len(json.loads(out)["rounds"]) == 1
    # ... and --jobs still solves from the files, the store untouched
    code, out, err = invoke("solve-round", "--backend", "greedy", "--jobs", str(env / "j.yaml"),
                            "--json", "-")
    assert code == 0, err
    assert json.loads(out)["allocations"]
    code, out, _ = invoke("history", "--json")
    assert len(json.loads(out)["rounds"]) == 1


def test_apportion_cluster_stands_for_cluster_and_the_flag_wins(env: Path) -> None:
    code, out, err = invoke("solve-round", "--backend", "greedy", "--jobs", str(env / "j.yaml"),
                            "--json", "-")
    assert code == 0, err
    assert {a["gpu_type"] for a in json.loads(out)["allocations"]} == {"L4"}
    code, out, err = invoke("solve-round", "--backend", "greedy", "--jobs", str(env / "j.yaml"),
                            "--json", "-", "--cluster", "crius-testbed")
    assert code == 0, err
    assert {a["gpu_type"] for a in json.loads(out)["allocations"]} <= {"A40", "A10"}
    (env / "d.json").write_text(json.dumps({"allocations": [{
        "job": "a", "gpu_type": "L4", "gpus": 2, "plan": {"dp": 2}, "placement": {"l4-0": 2},
        "iter_time_s": 1.0}]}))
    code, _, err = invoke("export", "slurm", "--decision", str(env / "d.json"), "--jobs",
                          str(env / "j.yaml"), "--out", str(env / "sb"))
    assert code == 0, err  # --cluster from the variable
    assert (env / "sb" / "index.json").exists()


def test_a_bad_variable_exits_2_naming_what_it_holds(env: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPORTION_CLUSTER", str(env / "missing.yaml"))
    code, _, err = invoke("solve-round", "--jobs", str(env / "j.yaml"))
    assert code == 2 and "missing.yaml" in err
    assert "APPORTION_CLUSTER" in runner.invoke(app, ["run", "--help"],
                                                env={"COLUMNS": "200"}).stdout


def test_every_variable_is_in_the_readme_table() -> None:
    """Every APPORTION_* name the code reads or sets, RAY_ADDRESS and the others it reads,
    appear in the one table of docs/environment.md."""
    table = (ROOT / "docs" / "environment.md").read_text()
    rows = "\n".join(ln for ln in table.splitlines() if ln.startswith("| `"))
    found: set[str] = set()
    for folder in ("apportion", "runtime", "experiments", "estimation", "solvers",
                   "formulations"):
        for f in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r'"(APPORTION_[A-Z0-9_]*[A-Z0-9])"', f.read_text()))
    found -= {"APPORTION_SLURM", "APPORTION_SLURM_TIME"}  # prefixes of names split in code
    found |= {"RAY_ADDRESS", "CUDA_VISIBLE_DEVICES", "XDG_CACHE_HOME", "SLURM_CONF",
              "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "APPORTION_REQUIRE_SLURM"}
    missing = sorted(v for v in found if f"`{v}`" not in rows)
    assert not missing, missing
    assert {"APPORTION_STATE", "APPORTION_CLUSTER"} <= found
