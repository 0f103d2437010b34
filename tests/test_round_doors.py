"""One round, every door: ``solve-round`` from files and from the store build the same
config (one builder), honour the same flags (``--partitions``, ``--engine``), refuse the
same impossible combinations by name, and write decisions apportion's workers can run,
so ``export k8s`` takes every allocation a plain round makes."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()


def _run(*args: str) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_every_allocation_of_a_plain_round_exports(tmp_path: Path) -> None:
    """The default round used to choose PP+TP plans the built-in workload refuses: 3 of its
    12 allocations could not be exported. The round now carries the workloads' plan filter."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(resources.files("apportion").joinpath("data/default_jobs.yaml").read_text())
    r = _run("solve-round", "--jobs", jobs, "--json", tmp_path / "d.json", "--time-budget", "5",
             "--no-isolate")
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["allocations"]
    r = _run("export", "k8s", "--decision", tmp_path / "d.json", "--cluster", "crius-testbed",
             "--jobs", jobs, "--out", tmp_path / "k8s")
    assert r.exit_code == 0, r.output
    assert f"{len(d['allocations'])} jobs written" in r.stderr and "0 refused" in r.stderr


def test_the_state_round_honours_partitions(tmp_path: Path) -> None:
    """``solve-round --state`` used to drop ``--partitions``, ``--engine`` and
    ``--ray-address``: its config came from a second builder."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(resources.files("apportion").joinpath("data/default_jobs.yaml").read_text())
    db = tmp_path / "s.db"
    assert _run("submit", jobs, "--state", db).exit_code == 0
    r = _run("solve-round", "--state", db, "--partitions", "2", "--time-budget", "20",
             "--json", tmp_path / "d.json")
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "d.json").read_text())
    tried = [a["backend"] for a in d["solver"]["attempts"]]
    assert any(b.startswith("pop-2") for b in tried), tried


@pytest.mark.parametrize("args,flag", [
    (["--ray-address", "127.0.0.1:1"], "--ray-address"),
    (["--round-key", "k"], "--round-key"),
    (["--policy", "fcfs", "--formulation", "plans"], "--formulation"),
    (["--estimator", "analytic", "--tables", "TABLES"], "--tables"),
    (["--formulation", "gavel", "--tenants", "TENANTS"], "--tenants"),
    (["--policy", "sia", "--tenants", "TENANTS"], "--tenants"),
])
def test_flags_that_cannot_apply_are_refused_by_name(tmp_path: Path, args: list[str],
                                                     flag: str) -> None:
    """A flag the round would ignore exits 2 naming it, before anything is written."""
    (tmp_path / "t.yaml").write_text("tenants: [{name: a, quota_gpus: 8}]\n")
    (tmp_path / "m.csv").write_text("model,gpu_type,gpus,iter_time_s\nbert-1.3b,A40,1,0.5\n")
    argv = [a.replace("TENANTS", str(tmp_path / "t.yaml")).replace("TABLES",
                                                                   str(tmp_path / "m.csv"))
            for a in args]
    out = tmp_path / "d.json"
    r = _run("solve-round", *argv, "--json", out, "--no-isolate")
    assert r.exit_code == 2, r.output
    assert flag in r.stderr, r.stderr
    assert not out.exists()
    if flag == "--tenants" and "--policy" not in args:  # the formulations that keep them
        for formulation in ("cells", "plans", "deadline"):
            r = _run("solve-round", "--tenants", tmp_path / "t.yaml", "--formulation",
                     formulation, "--json", out, "--time-budget", "5", "--no-isolate")
            assert r.exit_code == 0, r.output


def test_a_plan_the_workload_refuses_never_hides_one_it_runs() -> None:
    """The executor's plan filter applies before dominated cells are pruned: a 4-GPU torchrun
    job (one stage only) used to keep only the faster 2-stage cell of its size, which its
    workload refuses, and waited for ever as ``no-supported-plan``."""
    from apportion.jobs import JobSpec, Workload
    from apportion.policies import RoundConfig, run_round
    from apportion.runtime.executors.local.executor import local_cluster
    from apportion.runtime.plan_filter import workload_plan_filter

    job = JobSpec("j", "gpt-tiny", 8, 10, 4, workload=Workload("torchrun", ("python", "x.py")))
    d = run_round(local_cluster(4), [job], 0.0,
                  RoundConfig(time_budget_s=3, isolate=False,
                              plan_filter=workload_plan_filter("cpu"))).decision
    assert [a.job for a in d.allocations] == ["j"], d.pending
    assert d.allocations[0].plan.pp == 1
