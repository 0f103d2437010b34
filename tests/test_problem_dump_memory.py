"""``--dump-problem`` carries the memory limits the round kept, and a policy with no problem
of apportion's to dump is refused by name (exit 2, nothing written) instead of writing a
job list nobody can re-solve (``--policy sia``, every Gavel variant, ``--formulation gavel``
and every other baseline: discovered from the registry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app
from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plan_memory import GiB, memory_floor
from apportion.plans import ExecutionPlan
from apportion.policies import make_policy, policy_names
from apportion.policies.recipes import RECIPES
from apportion.round import StagedPolicy

runner = CliRunner()

CLUSTER = """\
name: small-memory
node_groups:
  - {prefix: small, count: 2, gpu_type: A100-40GB, gpus_per_node: 4, gpu_memory_gib: 4}
  - {prefix: mid, count: 2, gpu_type: A40, gpus_per_node: 4, gpu_memory_gib: 8,
     intra_node_link: pcie}
  - {prefix: big, count: 1, gpu_type: A100-80GB, gpus_per_node: 8}
"""
JOBS = """\
jobs:
  - {id: b13, model: bert-1.3b, global_batch_size: 64, iterations: 1000, requested_gpus: 2}
  - {id: b336, model: bert-336m, global_batch_size: 64, iterations: 1000, requested_gpus: 2}
"""


def _files(tmp: Path) -> tuple[Path, Path]:
    (tmp / "c.yaml").write_text(CLUSTER)
    (tmp / "j.yaml").write_text(JOBS)
    return tmp / "c.yaml", tmp / "j.yaml"


@pytest.mark.parametrize("formulation", sorted(RECIPES))
def test_the_dump_names_each_gpu_types_memory_limit(formulation: str, tmp_path: Path) -> None:
    c, j = _files(tmp_path)
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(c), "--jobs", str(j),
                            "--formulation", formulation, "--time-budget", "3", "--no-isolate",
                            "--dump-problem", str(out)])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())
    assert p["gpu_types"] == {"A100-40GB": {"memory_gib": 4.0, "from": "node group"},
                              "A40": {"memory_gib": 8.0, "from": "node group"},
                              "A100-80GB": {"memory_gib": 80.0, "from": "catalog"}}
    by_node = {n["name"]: n["gpu_memory_gib"] for n in p["nodes"]}
    assert by_node["small-0"] == 4.0 and by_node["mid-1"] == 8.0 and by_node["big-0"] == 80.0
    batch = {"b13": 64, "b336": 64}
    model = {"b13": "bert-1.3b", "b336": "bert-336m"}
    seen = 0
    for job in p["jobs"]:
        for cand in job["candidates"]:
            limit = p["gpu_types"][cand["gpu_type"]]["memory_gib"]
            assert cand["mem_per_gpu_gib"] <= limit + 1e-9, cand
            plan = ExecutionPlan(**cand["plan"])
            floor = memory_floor(get_model(model[job["job"]]), batch[job["job"]], plan)
            assert floor.bytes <= limit * GiB, (job["job"], cand)
            seen += 1
    assert seen


BASELINES = [n for n in policy_names() if not isinstance(make_policy(n), StagedPolicy)]


@pytest.mark.parametrize("args", [["--policy", n] for n in BASELINES] +
                         [["--formulation", "gavel"]], ids=lambda a: " ".join(a))
def test_a_dump_of_a_policy_with_no_problem_is_refused_by_name(args: list[str],
                                                               tmp_path: Path) -> None:
    assert {"sia", "gavel", "gavel-max-min-fairness", "fifo"} <= set(BASELINES)
    c, j = _files(tmp_path)
    out, dec = tmp_path / "p.json", tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(c), "--jobs", str(j), *args,
                            "--time-budget", "3", "--dump-problem", str(out), "--json",
                            str(dec)])
    assert r.exit_code == 2, r.output
    assert "--dump-problem" in r.stderr and args[1] in r.stderr
    assert not out.exists() and not dec.exists()


def test_a_guaranteed_job_counts_in_the_deadline_formulation() -> None:
    """The deadline formulation keeps guaranteed jobs' SLAs as the cells formulation does
    (its decisions were identical with and without ``guaranteed``)."""
    from apportion.cluster import Cluster, NodeGroup
    from apportion.policies import RoundConfig, run_round

    cl = Cluster("c", [NodeGroup("a", 1, "A100-40GB", 8)])
    placed = {}
    for guaranteed in (False, True):
        jobs = [JobSpec("a", "bert-336m", 64, 100_000, 8),
                JobSpec("b", "bert-336m", 64, 2_000_000, 8, submit_time_s=10.0,
                        guaranteed=guaranteed, deadline_s=1e9)]
        d = run_round(cl, jobs, 100.0, RoundConfig(formulation="deadline", time_budget_s=3,
                                                   isolate=False)).decision
        placed[guaranteed] = {a.job: a.gpus for a in d.allocations}
    assert placed[False] != placed[True]
    assert placed[True].get("b") == 8  # its promised speed: what it requested


def test_the_gavel_formulation_refuses_guaranteed_jobs_by_name(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text(
        "jobs:\n  - {id: g1, model: bert-336m, global_batch_size: 64, iterations: 100,"
        " requested_gpus: 4, guaranteed: true}\n"
        "  - {id: be, model: bert-336m, global_batch_size: 64, iterations: 100,"
        " requested_gpus: 4}\n")
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--formulation", "gavel", "--jobs",
                            str(tmp_path / "j.yaml"), "--json", str(out)])
    assert r.exit_code == 2 and "--formulation" in r.stderr and "g1" in r.stderr, r.output
    assert not out.exists()
    # Gavel's policy by name runs its own algorithm, as every baseline does
    r = runner.invoke(app, ["solve-round", "--policy", "gavel-max-min-fairness", "--jobs",
                            str(tmp_path / "j.yaml"), "--json", str(out)])
    assert r.exit_code == 0, r.output
