"""User workloads end to end on the local executor: the contract's environment per rank, plans
per workload kind, the shipped examples trained through `apportion run` with a resize that
resumes from the checkpoint, DeepSpeed and JAX through `workload.kind`, a crashing workload
retried then failed with its reason, the built-in trainer's optimiser settings, inline
custom models for the estimators."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.executors.local.executor import local_cluster, local_round_config
from apportion.runtime.plan_filter import drop_refused_plans, workload_plan_filter
from apportion.runtime.workload import (
    ENV_CHECKPOINT_DIR,
    ENV_DEEPSPEED_CONFIG,
    ENV_PLAN,
    ENV_PROGRESS_FILE,
    plan_supported,
    read_progress_since,
)
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.config import default_cluster, jobs_from_data
from apportion.decision import Allocation
from apportion.errors import InputError
from apportion.jobs import JobSpec, Workload, job_dirname
from apportion.models import get_model
from apportion.plans import ExecutionPlan
from apportion.policies import RoundConfig, run_round

ROOT = Path(__file__).resolve().parent.parent
TORCH_EXAMPLE = ROOT / "examples" / "torch_train.py"
DS_EXAMPLE = ROOT / "examples" / "deepspeed_train.py"
CONTRACT = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "APPORTION_JOB_ID", "APPORTION_PLAN", "APPORTION_ITERATIONS",
            "APPORTION_CHECKPOINT_DIR", "APPORTION_PROGRESS_FILE"}


def _cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _status(tmp: Path) -> dict[str, dict]:
    out = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp).stdout)
    return {j["id"]: j for j in out["jobs"]}


# -- the contract -------------------------------------------------------------------------------
def test_every_rank_gets_the_contract_numbered_node_by_node(tmp_path: Path) -> None:
    w = Workload("deepspeed", ("python", "train.py"), "/src", {"FOO": "bar"},
                 checkpoint_every=7)
    job = JobSpec("j/../x", "gpt-tiny", 16, 100, 4, workload=w)
    plan = ExecutionPlan(dp=4, zero_stage=2)
    a = Allocation("j/../x", "A40", 4, 1, plan, {"n1": 3, "n2": 1}, 1.0)
    spec = launch_spec(job, a, "start", tmp_path, master_addr="10.0.0.1", master_port=1234,
                       launch_id="17", checkpoint_interval_s=30.0)
    envs = [{**spec.env, **r} for r in spec.per_worker_env]
    assert all(CONTRACT <= set(e) for e in envs)
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "3"), ("1", "1", "3"), ("2", "2", "3"), ("3", "0", "1")]
    assert spec.nodes == ["n1", "n1", "n1", "n2"]
    e = envs[0]
    assert e["MASTER_ADDR"] == "10.0.0.1" and e["WORLD_SIZE"] == "4" and e["FOO"] == "bar"
    p = json.loads(e[ENV_PLAN])
    assert {k: p[k] for k in ("dp", "tp", "pp", "zero", "offload", "accumulation",
                              "checkpointing", "micro_batches")} == {
        "dp": 4, "tp": 1, "pp": 1, "zero": 2, "offload": False, "accumulation": 1,
        "checkpointing": False, "micro_batches": 1}
    jobdir = tmp_path / job_dirname("j/../x")  # a name inside the workdir, never the id
    assert Path(e[ENV_CHECKPOINT_DIR]).parent == jobdir == Path(e[ENV_PROGRESS_FILE]).parent
    assert e["APPORTION_ITERATIONS"] == "100" and e["APPORTION_CHECKPOINT_EVERY"] == "7"
    assert e["APPORTION_CHECKPOINT_INTERVAL_S"] == "30" and e["APPORTION_LAUNCH_ID"] == "17"
    assert spec.command == ["python", "train.py"] and spec.cwd == "/src"
    ds = spec.files["deepspeed.json"]
    assert e[ENV_DEEPSPEED_CONFIG] == str(jobdir / "deepspeed.json")
    assert ds["train_batch_size"] == 16 and ds["zero_optimization"]["stage"] == 2
    # kinds without a command run apportion's own entries
    for kind, module in (("jax", "apportion.runtime.workers.jax_worker"),
                         ("deepspeed", "apportion.runtime.workers.deepspeed_config"),
                         ("builtin", "apportion.runtime.workers.trainer")):
        j2 = JobSpec("k", "gpt-tiny", 16, 10, 1, workload=Workload(kind))
        assert launch_spec(j2, a, "start", tmp_path).command[2] == module


@settings(max_examples=80, deadline=None)
@given(dp=st.integers(1, 4), tp=st.integers(1, 4), pp=st.integers(1, 4),
       zero=st.integers(0, 3), offload=st.booleans())
def test_builtin_acceptance_matches_the_worker(dp: int, tp: int, pp: int, zero: int,
                                               offload: bool) -> None:
    """plan_supported("builtin") says exactly what the torch worker's own check refuses."""
    pytest.importorskip("torch")
    from apportion.runtime.workers.trainer import PlanError, check_plan
    plan = ExecutionPlan(dp=dp, tp=tp, pp=pp, zero_stage=zero, offload=offload, micro_batches=2)
    why = plan_supported("builtin", plan, "cpu")
    try:
        check_plan(plan, plan.gpus, "cpu")
        refused = None
    except PlanError as exc:
        refused = str(exc)
    assert (why is None) == (refused is None), (plan, why, refused)
    for kind in ("torchrun", "deepspeed", "jax"):
        if pp > 1:
            assert plan_supported(kind, plan, "cuda") is not None


def test_round_offers_only_plans_each_workload_runs() -> None:
    cluster = default_cluster()
    kinds = ["builtin", "torchrun", "deepspeed", "jax"]
    jobs = [JobSpec(f"j{k}", "bert-1.3b", 64, 100, 8, workload=Workload(
        kind, ("x",) if kind != "builtin" else ())) for k, kind in enumerate(kinds)]
    dec = run_round(cluster, jobs, 0.0, RoundConfig(time_budget_s=5, plan_filter=
                                                    workload_plan_filter("cuda"))).decision
    assert validate(dec, cluster, jobs).ok and len(dec.allocations) == 4
    by = {j.id: j for j in jobs}
    for a in dec.allocations:
        assert plan_supported(by[a.job].workload.kind, a.plan, "cuda") is None, a
    # the candidates hold multi-stage cells the user scripts cannot run; the hook drops them all
    from apportion.formulations.candidates import build_candidates
    from apportion.runtime.plan_filter import cell_plan
    g = build_candidates(cluster, jobs, 0.0)
    accept = workload_plan_filter("cuda")
    refused = {n for n, d in g.nodes(data=True) if d.get("kind") == "cell"
               and accept(by[d["job"]], cell_plan(d)) is not None}
    assert refused and {by[g.nodes[n]["job"]].workload.kind for n in refused} >= {
        "torchrun", "deepspeed", "jax"}
    assert drop_refused_plans(g, jobs, accept) == len(refused) and not refused & set(g)
    # a job whose workload refuses every candidate is pending with a typed reason
    dec = run_round(cluster, jobs[:1], 0.0, RoundConfig(time_budget_s=2, plan_filter=lambda j, p:
                                                        "refuses everything")).decision
    assert [(p.job, p.reason.value) for p in dec.pending] == [("j0", "no-supported-plan")]
    assert drop_refused_plans  # the hook round.py calls


# -- inputs ---------------------------------------------------------------------------------------
def _jobs(**entry: object) -> dict:
    base = {"id": "u", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 10,
            "requested_gpus": 1}
    return {"jobs": [{**base, **entry}]}


@pytest.mark.parametrize("entry, field, message", [
    ({"workload": {"kind": "builtin", "command": ["x"]}}, "jobs[0].workload", "kind 'builtin'"),
    ({"workload": {"checkpoint_every": -1}}, "jobs[0].workload.checkpoint_every", "greater"),
    ({"workload": {"checkpoint_interval_s": "soon"}}, "jobs[0].workload.checkpoint_interval_s",
     "seconds"),
    ({"workload": {"train": {"lr": 0}}}, "jobs[0].workload.train.lr", "greater than 0"),
    ({"workload": {"train": {"optimizer": "lion"}}}, "jobs[0].workload.train.optimizer", "adamw"),
    ({"workload": {"kind": "torchrun", "command": ["x"], "train": {"lr": 0.1}}},
     "jobs[0].workload", "train"),
    ({"model": {"layers": 24, "hidden_size": 2048, "sequence_length": 1024,
                "parameters": 1000}}, "jobs[0].model", "parameters"),
    ({"model": {"layers": 2, "hidden_size": 64}}, "jobs[0].model.sequence_length", "required"),
    ({"model": {"layers": 2, "hidden_size": 64, "sequence_length": 8, "parameters": 1e6,
                "family": "rnn"}}, "jobs[0].model.family", "gpt"),
])
def test_bad_workload_and_model_fields_are_named(entry: dict, field: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        jobs_from_data(_jobs(**entry), "j.yaml")
    assert exc.value.field == field and message in exc.value.message, str(exc.value)


def test_bad_workload_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(_jobs(workload={"kind": "torchrun"})))
    r = _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path)
    assert r.returncode == 2 and "jobs[0].workload" in r.stderr and "command" in r.stderr
    assert not (tmp_path / "s.db").exists()


def test_inline_custom_model_is_estimated_and_stored(tmp_path: Path) -> None:
    from apportion.store import open_store
    data = _jobs(model={"name": "My-Net", "family": "gpt", "layers": 24, "hidden_size": 2048,
                        "sequence_length": 1024, "parameters": 1.3e9}, requested_gpus=4,
                 global_batch_size=64)
    jobs, now = jobs_from_data(data, "j.yaml")
    spec = get_model(jobs[0].model)
    assert abs(spec.params - 1.3e9) / 1.3e9 < 1e-3 and spec.seq_len == 1024
    assert spec.hidden == 2048 and sum(1 for n in spec.layers if "block" in n) == 24
    cluster = default_cluster()
    dec = run_round(cluster, jobs, now, RoundConfig(time_budget_s=5)).decision
    assert validate(dec, cluster, jobs).ok
    (a,) = dec.allocations
    assert a.est_throughput > 0
    with open_store(tmp_path / "s.db", create=True) as store:
        store.submit(jobs)
        assert store.jobs()[0].to_jobspec().model == jobs[0].model


# -- the built-in trainer learns; its optimiser is the job's --------------------------------------
def test_gpt_tiny_loss_falls_clearly_in_a_short_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.workers.trainer import LOSSES_FILE, Worker
    cfg = TrainConfig("g", "gpt-tiny", 8, 40, ExecutionPlan().as_dict(), str(tmp_path),
                      lr=3e-3, warmup_iterations=5, grad_clip=1.0, backend="gloo")
    assert Worker(cfg, 0, 1).run() == 0
    losses = [json.loads(x)["loss"] for x in (tmp_path / LOSSES_FILE).read_text().splitlines()]
    assert losses[0] > 6.5 and min(losses[-5:]) < losses[0] - 1.0, losses
    sgd = TrainConfig("s", "gpt-tiny", 8, 2, ExecutionPlan().as_dict(), str(tmp_path / "s"),
                      optimizer="sgd", lr=0.05, momentum=0.9, backend="gloo")
    w = Worker(sgd, 0, 1)
    assert w.run() == 0 and type(w.opt).__name__ == "SGD"
    assert w.opt.param_groups[0]["momentum"] == 0.9
    assert w.torch_device.type == "cpu"  # no GPU here: the CPU path, and nothing needs one


# -- end to end through `apportion run` ------------------------------------------------------------
def _wait_iters(tmp: Path, job: str, n: int, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if _status(tmp)[job]["iterations_done"] >= n:
                return
        except (json.JSONDecodeError, KeyError):
            pass
        time.sleep(1.0)
    raise AssertionError(f"{job} did not reach {n} iterations")


def _wait_for(done: Callable[[], bool], what: str, limit: float = 400.0) -> None:
    """Polls ``done`` (a missing file is not yet) until it holds; ``limit`` only ends a hung
    test, no assertion depends on how long the wait was."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"never happened: {what}")


def test_torch_example_trains_through_run_with_a_resize(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    w = {"kind": "torchrun", "command": [sys.executable, str(TORCH_EXAMPLE)],
         "env": {"EXAMPLE_STEP_SLEEP": "0.25", "EXAMPLE_HOLD": "4:30"}, "checkpoint_every": 4}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "u", "model": "gpt-tiny", "global_batch_size": 16, "iterations": 60,
         "requested_gpus": 2, "workload": w}]}))
    # v (2 GPUs, never more: u shrinks to make room) holds at its second step until
    # cancelled, once u has stepped at its new size: the resize is waited for by events,
    # whatever the machine's load
    held = dict(w, env={"EXAMPLE_HOLD": "*:2"})
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "v", "model": "gpt-tiny", "global_batch_size": 16, "iterations": 6,
         "requested_gpus": 2, "elastic": False, "workload": held}]}))
    progress = tmp_path / "apportion-runs" / job_dirname("u") / "progress.jsonl"
    assert _cli("submit", "a.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    run = subprocess.Popen([sys.executable, "-m", "apportion.cli", "run", "--executor", "local",
                            "--cluster", "local", "--state", "s.db", "--interval", "3",
                            "--until-idle", "--timeout", "500", "--time-budget", "3"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        _wait_iters(tmp_path, "u", 6)
        assert _cli("submit", "b.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
        _wait_for(lambda: any(json.loads(x).get("world") == 2
                              for x in progress.read_text().splitlines()), "u at 2 ranks")
        assert _cli("cancel", "v", "--state", "s.db", cwd=tmp_path).returncode == 0
        _, err = run.communicate(timeout=560)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    st = _status(tmp_path)
    assert (st["u"]["state"], st["v"]["state"]) == ("finished", "dropped"), st  # v cancelled
    assert st["u"]["iterations_done"] == 60
    hist = json.loads(_cli("history", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    rounds = hist["rounds"] if isinstance(hist, dict) else hist
    acts = [(a["job"], a["action"], a["gpus"]) for r in rounds for a in r.get("actions", [])]
    assert ("u", "start", 4) in acts and any(j == "u" and act in ("resize", "migrate")
                                             for j, act, _ in acts), acts
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    worlds = [x["world"] for x in steps]
    assert worlds[0] == 4 and 2 in worlds, worlds
    switch = next(i for i, x in enumerate(steps) if x["world"] != 4)
    ckpts = [x["iteration"] for x in lines[:lines.index(steps[switch])] if x.get("checkpoint")]
    assert steps[switch]["iteration"] == ckpts[-1] + 1 > 1  # resumed, not restarted
    assert [x["iteration"] for x in steps[switch:]] == list(
        range(steps[switch]["iteration"], 61))
    assert steps[-1]["loss"] < steps[0]["loss"]


def test_deepspeed_example_and_the_jax_entry_through_run(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    pytest.importorskip("jax")
    import os
    import tempfile
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        Path(tempfile.gettempdir()) / "apportion-torch-extensions")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "ds", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 6,
         "requested_gpus": 2, "workload": {"kind": "deepspeed",
                                           "command": [sys.executable, str(DS_EXAMPLE)],
                                           "env": {"TORCH_EXTENSIONS_DIR": cache}}},
        {"id": "jx", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 6,
         "requested_gpus": 2, "workload": {"kind": "jax", "train": {"lr": 0.1}}}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", "local", "--cluster", "local", "--state", "s.db", "--interval",
             "3", "--until-idle", "--timeout", "800", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    st = _status(tmp_path)
    for j in ("ds", "jx"):
        assert st[j]["state"] == "finished" and st[j]["iterations_done"] == 6, st[j]
        view = read_progress_since(tmp_path / "apportion-runs" / job_dirname(j) /
                                   "progress.jsonl")
        assert view.iteration == 6 and view.checkpoint_iteration == 6
    ds_lines = (tmp_path / "apportion-runs" / job_dirname("ds") / "progress.jsonl").read_text()
    assert '"zero"' in ds_lines  # the DeepSpeed config apportion wrote for the plan was used


def test_a_crashing_workload_is_retried_then_failed_with_its_reason(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "bad", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 20,
         "requested_gpus": 1, "workload": {"kind": "torchrun",
                                           "command": [sys.executable, str(TORCH_EXAMPLE)],
                                           "env": {"EXAMPLE_FAIL_AT": "1"}}}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", "local", "--cluster", "local", "--state", "s.db", "--interval",
             "2", "--until-idle", "--timeout", "400", "--max-retries", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    job = _status(tmp_path)["bad"]
    assert job["state"] == "failed" and "failing on purpose" in job["reason"], job
    assert "2 times in a row" in job["reason"]
    from apportion import store_launches as sl
    from apportion.store import open_store
    with open_store(tmp_path / "s.db") as store:
        outcomes = [(r.outcome, r.action) for r in sl.launches(store, "bad")]
        assert [o for o, _ in outcomes] == ["failed", "failed"], outcomes
        events = [e["why"] for e in store.events("bad")]
    assert any("worker died" in w and "failing on purpose" in w for w in events), events
    assert local_round_config  # (the round config the run uses for the local executor)
    assert local_cluster(2).total_gpus == 2
