"""The Ray executor: workers as actors in placement groups keyed by GPU type."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.executors.executor import Health
from apportion.runtime.executors.local.executor import local_cluster, local_round_config
from apportion.runtime.executors.ray.executor import (
    PlacementError,
    RayExecutor,
    bundles_for,
    missing_resources,
)
from apportion.validator import validate

from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan
from apportion.policies import run_round


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory):
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ex = RayExecutor(tmp_path_factory.mktemp("ray"), local_cluster(2), placement_timeout_s=2.0,
                     num_cpus=2)
    yield ex
    ex.shutdown()
    ex.close()


def test_one_bundle_per_node_carries_the_gpu_type() -> None:
    a = Allocation("j", "A100-80GB", 3, 1, ExecutionPlan(dp=3), {"n": 2, "m": 1}, 1.0)
    assert bundles_for(a, False) == [{"A100-80GB": 2.0}, {"A100-80GB": 1.0}]
    assert bundles_for(a, True) == [{"A100-80GB": 2.0, "GPU": 2.0}, {"A100-80GB": 1.0, "GPU": 1.0}]
    assert bundles_for(a, True, type_resource=False) == [{"GPU": 2.0}, {"GPU": 1.0}]
    assert missing_resources(bundles_for(a, False), {"T4": 4.0}) == {"A100-80GB": (3.0, 0.0)}


def test_round_decision_runs_as_actors(executor: RayExecutor) -> None:
    cluster = local_cluster(2)
    job = JobSpec("r", "bert-tiny", 4, 3, 2)
    dec = run_round(cluster, [job], 0.0, local_round_config()).decision
    assert validate(dec, cluster, [job]).ok
    (a,) = dec.allocations
    events = executor.apply(dec, [job])
    assert [(e.job, e.action, e.workers) for e in events] == [("r", "start", a.gpus)]
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        (p,) = [p for p in executor.poll() if p.job == "r"]
        if p.done:
            break
        time.sleep(0.5)
    assert p.health == Health.FINISHED, p
    assert p.iterations_done == 3 and p.workers == a.gpus
    state = ckpt.load(ckpt.job_checkpoint(Path(executor.workdir) / job_dirname("r")))
    assert state is not None and state.iteration == 3


def test_infeasible_placement_names_the_missing_resource(executor: RayExecutor) -> None:
    a = Allocation("big", "A100-80GB", 2, 1, ExecutionPlan(dp=2), {"x": 2}, 1.0, Action.START)
    dec = Decision([a], [], SolveReport("t", "optimal", 0, 0, 0, 0, False))
    with pytest.raises(PlacementError, match="'A100-80GB': asks 2, available 0"):
        executor._place(a)
    events = executor.apply(dec, [JobSpec("big", "gpt-tiny", 4, 2, 2)])
    # that launch failed (its job's, counted by the run's fault policy), with the reason
    assert events[0].action == "failed" and "A100-80GB" in events[0].detail
    (p,) = [p for p in executor.poll() if p.job == "big"]
    assert p.health == Health.FAILED and "'A100-80GB': asks 2, available 0" in (p.error or "")
    assert "big" not in executor.groups


def test_loop_runs_jobs_to_completion_on_ray(executor: RayExecutor) -> None:
    from apportion.runtime.loop import MemoryStore, run_loop
    store = MemoryStore()
    store.submit(JobSpec("la", "bert-tiny", 4, 4, 1))
    store.submit(JobSpec("lb", "gpt-tiny", 4, 3, 1))
    res = run_loop(local_cluster(2), store, executor, interval_s=2.0, until_idle=True,
                   timeout_s=240.0, round_config=local_round_config(), poll_s=0.3)
    assert res.reason == "idle", [(p.job, p.health, p.error) for p in res.progress]
    assert store.states["la"] == store.states["lb"] == "finished"
    assert {p.job: p.iterations_done for p in res.progress if p.job in ("la", "lb")} == {
        "la": 4, "lb": 3}
    started = {e["job"] for r in store.rounds for e in r["events"] if e["action"] == "start"}
    assert started == {"la", "lb"}


_HUNG = """
import json, os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.environ["APPORTION_PROGRESS_FILE"], "a") as f:
    n = int(os.environ["APPORTION_ITERATIONS"])
    f.write(json.dumps({"iteration": n}) + "\\n")
    f.write(json.dumps({"iteration": n, "checkpoint": True}) + "\\n")
time.sleep(300)
"""


def test_a_group_alive_after_its_final_checkpoint_is_reaped_and_finished(
        executor: RayExecutor) -> None:
    """As in the local executor (``LingerWatch``): a group whose final checkpoint is at the
    target but whose rank never exits is killed after the linger and its job finished,
    without any round asking it to stop."""
    import sys

    from apportion.jobs import Workload
    from apportion.runtime.executors.executor import LingerWatch

    cluster = local_cluster(2)
    job = JobSpec("hung", "gpt-tiny", 8, 5, 1,
                  workload=Workload("torchrun", (sys.executable, "-c", _HUNG)))
    dec = run_round(cluster, [job], 0.0, local_round_config()).decision
    kept, executor.linger = executor.linger, LingerWatch(2.0)
    try:
        executor.apply(dec, [job])
        seen_running_at_target = False
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            (p,) = [p for p in executor.poll() if p.job == "hung"]
            if p.health == Health.RUNNING and p.checkpoint_iterations == 5:
                seen_running_at_target = True  # not reaped before the linger has passed
            if p.health in (Health.FINISHED, Health.FAILED):
                break
            time.sleep(0.3)
        assert seen_running_at_target
        assert p.health == Health.FINISHED and p.iterations_done == 5, p
        assert "hung" not in executor.groups
    finally:
        executor.linger = kept
