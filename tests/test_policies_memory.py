"""Every registered policy keeps each GPU's memory, through the door an operator uses.

Each policy (discovered from the registry, plug-ins included) solves one round with
``solve-round`` on a cluster whose GPUs allow 4 and 8 GiB (``gpu_memory_gib``); every plan
it places is re-checked here by the validator's own ledger, and a job no plan fits on any
GPU (LLaMA-30B) is pending ``no-fit-memory`` with ``can_ever_fit`` false in every policy
(Gavel's rounds called it ``no-capacity ... lower priority this round``, can ever fit).
Before issue 61 every baseline placed plain data-parallel plans tens of GiB over these
GPUs (and over the catalog's: bert-1.3b at 32 samples a GPU holds 174 GiB of
activations), and ``apportion-plans`` placed bert-1.3b at 21.3 GiB on 4 GiB.

A replay drops and counts a job no plan fits in any GPU's memory, as it does a job larger
than the cluster, instead of ending "stopped progressing" (exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import load_jobs, resolve_cluster
from apportion.decision import Reason
from apportion.plan_memory import memory_violation
from apportion.plans import ExecutionPlan
from apportion.policies import policy_names

runner = CliRunner()

CLUSTER = """\
name: small-memory
node_groups:
  - {prefix: small, count: 2, gpu_type: A100-40GB, gpus_per_node: 4, gpu_memory_gib: 4}
  - {prefix: mid, count: 2, gpu_type: A40, gpus_per_node: 4, gpu_memory_gib: 8,
     intra_node_link: pcie}
"""
JOBS = """\
jobs:
  - {id: b13, model: bert-1.3b, global_batch_size: 64, iterations: 1000, requested_gpus: 2}
  - {id: b26, model: bert-2.6b, global_batch_size: 64, iterations: 1000, requested_gpus: 4}
  - {id: b336, model: bert-336m, global_batch_size: 64, iterations: 1000, requested_gpus: 2}
  - {id: llama, model: llama-30b, global_batch_size: 256, iterations: 1000, requested_gpus: 4}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("small-memory")
    (d / "cluster.yaml").write_text(CLUSTER)
    (d / "jobs.yaml").write_text(JOBS)
    return d / "cluster.yaml", d / "jobs.yaml"


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_places_only_plans_that_fit_each_gpu(policy: str, files: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    cluster_file, jobs_file = files
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(cluster_file), "--jobs",
                            str(jobs_file), "--policy", policy, "--time-budget", "3",
                            "--no-isolate", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    cluster = resolve_cluster(cluster_file)
    jobs = {j.id: j for j in load_jobs(jobs_file)[0]}
    for a in d["allocations"]:
        plan = ExecutionPlan(**a["plan"])
        assert plan.gpus == a["gpus"], a
        why = memory_violation(jobs[a["job"]], plan, a["placement"], cluster)
        assert why is None, f"{policy} placed {a['job']}: {why}"
    pending = {p["job"]: p for p in d["pending"]}
    assert set(pending) | {a["job"] for a in d["allocations"]} == set(jobs)
    for p in pending.values():
        assert Reason(p["reason"]), p
    llama = pending["llama"]
    assert llama["reason"] == "no-fit-memory" and llama["can_ever_fit"] is False, llama


TINY = """\
name: tiny
node_groups:
  - {prefix: t, count: 4, gpu_type: A100-40GB, gpus_per_node: 8, gpu_memory_gib: 3}
"""


@pytest.mark.parametrize("policy", ["apportion", "fcfs"])
def test_a_replay_drops_and_counts_jobs_no_gpu_memory_fits(policy: str, tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "synthetic:8", "--cluster",
                            str(tmp_path / "tiny.yaml"), "--policy", policy, "--json", str(out)])
    assert r.exit_code == 0, r.output  # it was 1: "6 of 8 jobs stopped progressing"
    s = json.loads(out.read_text())
    assert s["refused_no_fit_memory"] == 6 and s["finished"] == 2, s
    assert "fit no GPU's memory" in r.stderr


SPILLS = """\
jobs:
  - {id: sp, model: bert-1.3b, global_batch_size: 8, iterations: 100, requested_gpus: 1,
     elastic: false}
"""


@pytest.mark.parametrize("policy", ["apportion", "apportion-plans", "sia", "fcfs", "gavel",
                                    "tiresias"])
def test_a_model_no_gpu_holds_whole_is_spilled_by_every_policy(
        policy: str, files: tuple[Path, Path], tmp_path: Path) -> None:
    """bert-1.3b's 21 GB of model states fit no 4 or 8 GiB GPU whole; Hydra's spilling fits
    it on one (a layer at a time under the device budget): the formulations offer the
    spilled cell, and an operator's round rates it for the baselines, which place it. The job
    keeps its size (``elastic: false``): an elastic one is offered 8 GPUs, where tensor
    parallelism holds it unspilled (``test_elastic_counts``)."""
    cluster_file, _ = files
    (tmp_path / "j.yaml").write_text(SPILLS)
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(cluster_file), "--jobs",
                            str(tmp_path / "j.yaml"), "--policy", policy, "--time-budget", "3",
                            "--no-isolate", "--json", str(out)])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(out.read_text())["allocations"]
    assert a["gpus"] == 1 and a["plan"]["spill_shards"] > 0, a
    assert a["plan"]["spill_budget_mib"] * 2**20 <= 8 * 2**30
