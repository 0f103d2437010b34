"""Hydra's spilling through the doors a user meets: ``solve-round`` places a model bigger than
every GPU of the cluster as a spilled plan (it was pending ``no-fit-memory``), the decision
carries the plan to ``export k8s``, and ``apportion run`` trains such a job shard by shard to
its target, resumes it after a SIGTERM with the losses of an uninterrupted run, and runs
nothing a pickle planted in its checkpoint folder carries.

On this CPU-only machine the local cluster's slots have no device memory of their own: the
run tests give them 8 MiB (``APPORTION_LOCAL_GPU_MEMORY_GIB``), less than gpt-tiny needs
whole at batch 4 on one slot or as a two-stage pipeline, more than its largest layer.
No assertion reads the wall clock: the SIGTERM is sent once progress shows training.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan
from apportion.store import open_store
from apportion.validator import validate

CLUSTER = {"name": "a10s", "node_groups": [
    {"prefix": "a10", "count": 2, "gpu_type": "A10", "gpus_per_node": 4,
     "intra_node_link": "pcie", "host_memory_gib": 2048}]}
BIG = {"id": "big", "model": "llama-30b", "global_batch_size": 8, "iterations": 100,
       "requested_gpus": 2}
SMALL = {"id": "small", "model": "bert-336m", "global_batch_size": 32, "iterations": 100,
         "requested_gpus": 2}
SLOT_MEMORY = {"APPORTION_LOCAL_GPU_MEMORY_GIB": str(8 / 1024)}  # 8 MiB per local slot


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def _round(tmp: Path, jobs: list[dict], cluster: dict = CLUSTER,
           *extra: str) -> tuple[dict, dict]:
    (tmp / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp / "j.yaml").write_text(yaml.safe_dump({"jobs": jobs}))
    r = _cli("solve-round", "--jobs", "j.yaml", "--cluster", "c.yaml", "--json", "d.json",
             "--dump-problem", "p.json", "--time-budget", "5", *extra, cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp / "d.json").read_text()), json.loads((tmp / "p.json").read_text())


def test_solve_round_places_a_model_bigger_than_every_gpu_spilled(tmp_path: Path) -> None:
    """llama-30b needs about 520 GB for its weights and optimizer state: no count of 24 GB
    A10s the round tries holds it. It used to be pending ``no-fit-memory``; now it runs on one
    A10 shard by shard, with its estimated time, while the job that fits is planned whole."""
    decision, problem = _round(tmp_path, [BIG, SMALL])
    by_job = {a["job"]: a for a in decision["allocations"]}
    assert set(by_job) == {"big", "small"}, decision["pending"]
    big = by_job["big"]
    assert big["gpus"] == 1 and big["stages"] == 1
    assert big["plan"]["spill_shards"] > 1
    assert 0 < big["plan"]["spill_budget_mib"] <= 24 * 1024
    assert big["iter_time_s"] > 0 and big["est_throughput"] == pytest.approx(8 / big["iter_time_s"])
    assert big["mem_per_gpu_gib"] <= 24
    assert "spill_shards" not in by_job["small"]["plan"]  # fits whole: never spilled
    cands = {j["job"]: j["candidates"] for j in problem["jobs"]}
    assert cands["big"] and all(c["plan"].get("spill_shards") for c in cands["big"])
    assert not any(c["plan"].get("spill_shards") for c in cands["small"])

    # the decision carries the plan to the next door: Kubernetes manifests of it
    r = _cli("export", "k8s", "--decision", "d.json", "--cluster", "c.yaml", "--jobs", "j.yaml",
             "--out", "k8s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "spill_shards" in "".join(p.read_text() for p in (tmp_path / "k8s").glob("*big*"))


def test_the_plans_formulation_spills_too_and_counts_host_memory(tmp_path: Path) -> None:
    """``--formulation plans`` keeps host-memory rows: its spilled option asks for the
    model's weights and optimizer state there (about 436 GiB), not a GPU's share."""
    decision, _ = _round(tmp_path, [BIG, SMALL], CLUSTER, "--formulation", "plans")
    big = next(a for a in decision["allocations"] if a["job"] == "big")
    assert big["plan"]["spill_shards"] > 1 and big["gpus"] == 1
    assert 400 < big["host_memory_gib"] <= 2048


def test_a_spilled_job_needs_its_state_in_host_memory(tmp_path: Path) -> None:
    """A spilled run holds the whole model's weights and optimizer state on the host: with
    256 GiB per GPU it stays pending, and the reason says so."""
    small_hosts = {**CLUSTER, "node_groups": [{**CLUSTER["node_groups"][0],
                                               "host_memory_gib": 1024}]}
    decision, _ = _round(tmp_path, [BIG], small_hosts)
    (pend,) = decision["pending"]
    assert pend["reason"] == "no-fit-memory" and "host memory" in pend["detail"], pend


def test_the_validator_checks_a_spilled_plan() -> None:
    cluster = Cluster("c", [NodeGroup("n", 1, "A10", 4)])
    job = JobSpec("j", "llama-30b", 8, 10, 1)

    def check(plan: ExecutionPlan, gpus: int = 1) -> list[str]:
        alloc = Allocation("j", "A10", gpus, 1, plan, {"n-0": gpus}, 1.0, Action.START)
        dec = Decision([alloc], [], SolveReport("t", "optimal", 0, 0, 0, 0, False))
        return validate(dec, cluster, [job]).violations

    assert check(ExecutionPlan(spill_shards=4, spill_budget_mib=20_000)) == []
    assert any("exceeds" in v for v in check(ExecutionPlan(spill_shards=4,
                                                            spill_budget_mib=30_000)))
    assert any("one GPU" in v for v in check(ExecutionPlan(dp=2, spill_shards=4,
                                                            spill_budget_mib=20_000), 2))


# -- apportion run: a spilled job trained by the built-in trainer --------------------------------
def _submit(tmp: Path, iterations: int) -> None:
    (tmp / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "s", "model": "gpt-tiny", "global_batch_size": 4, "iterations": iterations,
         "requested_gpus": 1, "elastic": False,  # spilled on one GPU, not a pipeline on four
         "workload": {"kind": "builtin", "checkpoint_every": 4}}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp).returncode == 0


RUN = ("run", "--executor", "local", "--cluster", "local", "--state", "s.db", "--interval",
       "1", "--until-idle", "--timeout", "400", "--time-budget", "2", "--max-retries", "0")


def _losses(tmp: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (tmp / "apportion-runs" / job_dirname("s") / "losses.jsonl").read_text() \
            .splitlines():
        rec = json.loads(line)
        out[rec["iteration"]] = rec["loss"]  # a relaunch that repeats an iteration overwrites it
    return out


def _status(tmp: Path) -> dict:
    r = _cli("status", "--state", "s.db", "--json", cwd=tmp)
    return next(j for j in json.loads(r.stdout)["jobs"] if j["id"] == "s")


def _plans(tmp: Path) -> list[dict]:
    with open_store(tmp / "s.db") as store:
        return [a["plan"] for r in store.rounds() for a in store.decision(r["id"])["allocations"]]


def test_run_trains_a_spilled_job_and_resumes_it_after_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    iterations = 24
    whole = tmp_path / "straight"
    whole.mkdir()
    _submit(whole, iterations)
    r = _cli(*RUN, cwd=whole, env=SLOT_MEMORY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _status(whole)["state"] == "finished"
    plans = _plans(whole)
    assert plans and all(p.get("spill_shards", 0) > 0 and p["spill_budget_mib"] == 8
                         for p in plans), plans
    straight = _losses(whole)
    assert sorted(straight) == list(range(1, iterations + 1))

    # the same job, its run stopped by SIGTERM once it trains, then run again
    cut = tmp_path / "preempted"
    cut.mkdir()
    _submit(cut, iterations)
    proc = subprocess.Popen([sys.executable, "-m", "apportion.cli", *RUN], cwd=cut,
                            env={**os.environ, **SLOT_MEMORY}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    progress = cut / "apportion-runs" / job_dirname("s") / "progress.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            lines = progress.read_text().splitlines() if progress.exists() else []
            if any(json.loads(x).get("iteration", 0) >= 2 for x in lines):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # the operator's stop: every job checkpointed
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stopped = _status(cut)
    assert stopped["state"] != "finished" and 0 < stopped["checkpoint_iterations"] < iterations
    r = _cli(*RUN, cwd=cut, env=SLOT_MEMORY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _status(cut)["state"] == "finished"
    launches = {json.loads(x)["launch_id"] for x in progress.read_text().splitlines()}
    assert len(launches) >= 2  # it really was stopped and relaunched
    assert _losses(cut) == straight


def test_a_pickle_planted_in_a_spilled_jobs_checkpoint_runs_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _submit(tmp_path, 6)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    ckdir = tmp_path / "apportion-runs" / job_dirname("s") / "checkpoint"
    ckdir.mkdir(parents=True)
    (ckdir / "checkpoint.pt").write_bytes(pickle.dumps({"model": Payload()}))
    r = _cli(*RUN, cwd=tmp_path, env=SLOT_MEMORY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not marker.exists()
    st = _status(tmp_path)
    assert st["state"] == "failed" and "checkpoint.pt" in st["reason"], st
    assert _plans(tmp_path)[0]["spill_shards"] > 0  # it was launched spilled, and refused
