"""The local executor on real worker processes, driven by the spine's round decisions."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from apportion.runtime.workers import checkpoint as ckpt
from apportion.runtime.executors.executor import Executor, Health, Progress
from apportion.runtime.executors.local.executor import (
    LocalExecutor,
    local_cluster,
    local_round_config,
)
from apportion.validator import validate

from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, RunningState, job_dirname
from apportion.plans import ExecutionPlan
from apportion.policies import run_round


def decide(cluster, jobs, cfg=None):
    dec = run_round(cluster, jobs, 0.0, cfg or local_round_config()).decision
    check = validate(dec, cluster, jobs)
    assert check.ok, check.violations
    return dec


def wait_for(ex: LocalExecutor, job: str, cond, timeout: float = 120.0) -> Progress:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in ex.poll():
            if p.job == job and cond(p):
                return p
        time.sleep(0.2)
    raise AssertionError(f"{job}: condition not reached; last {ex.poll()}\n{_diagnosis(ex, job)}")


def _diagnosis(ex: LocalExecutor, job: str) -> str:
    """What a hung group's ranks last wrote (the teardown hang seen once could
    not be read: the test's folder was gone): each rank's stderr tail, exit code, status."""
    from apportion.runtime.executors.local.executor import stderr_tail

    run = ex.runs.get(job) or ex.stopped.get(job)
    if run is None:
        return "no run"
    out = [f"exit codes {[p.poll() for p in run.procs]}"]
    for r in range(len(run.procs)):
        out.append(f"rank {r} stderr:\n{stderr_tail(run.dir, [r]) or '(empty)'}")
    for name in ("progress.json", "progress.jsonl"):
        f = run.dir / name
        if f.exists():
            out.append(f"{name}: {f.read_text()[-2000:]}")
    return "\n".join(out)


def running(job: JobSpec, alloc) -> JobSpec:
    return replace(job, running=RunningState(alloc.gpu_type, alloc.gpus, alloc.stages,
                                             dict(alloc.placement), alloc.plan.tp))


def test_local_cluster_describes_this_machine() -> None:
    c = local_cluster(4)
    assert c.total_gpus == 4 and len(c.nodes) == 1
    dec = decide(c, [JobSpec("a", "gpt-tiny", 16, 10, 2)])
    assert dec.allocations and all(a.plan.pp == 1 for a in dec.allocations)


def test_start_resize_and_shutdown_from_round_decisions(tmp_path: Path) -> None:
    cluster = local_cluster(4)
    ex = LocalExecutor(tmp_path)
    assert isinstance(ex, Executor)
    a = JobSpec("a", "gpt-tiny", 16, 400, 2)
    d1 = decide(cluster, [a])
    (alloc,) = d1.allocations
    assert alloc.action == Action.START and alloc.gpus == 4
    ev = ex.apply(d1, [a])
    assert [(e.job, e.action, e.workers) for e in ev] == [("a", "start", 4)]
    p = wait_for(ex, "a", lambda p: p.iterations_done >= 2)
    assert p.health == Health.RUNNING and p.iter_time_s and p.iter_time_s > 0 and p.workers == 4

    # a second job arrives: the round shrinks "a" (resize) and starts "b"
    a_run = replace(running(a, alloc), iterations_done=p.iterations_done)
    b = JobSpec("b", "bert-tiny", 16, 6, 1)
    d2 = decide(cluster, [a_run, b])
    acts = {x.job: (x.action, x.gpus) for x in d2.allocations}
    assert acts["a"] == (Action.RESIZE, 2) and acts["b"][0] == Action.START
    ev2 = ex.apply(d2, [a_run, b])
    assert {(e.job, e.action) for e in ev2} == {("a", "resize"), ("b", "start")}
    state = ckpt.load(ckpt.job_checkpoint(tmp_path / job_dirname("a")))
    assert state is not None and state.iteration >= 2 and state.meta["world"] == 4
    p2 = wait_for(ex, "a", lambda p: p.workers == 2 and p.health == Health.RUNNING
                  and p.iterations_done > state.iteration)
    assert p2.reconfig_overhead_s is not None and p2.reconfig_overhead_s > 0
    overheads = dict(ex.overheads()["a"])
    assert "resize" in overheads
    wait_for(ex, "b", lambda p: p.health == Health.FINISHED)

    # shutdown checkpoints the running job at the iteration it reports
    ex.shutdown(checkpoint=True)
    (pa,) = [p for p in ex.poll() if p.job == "a"]
    assert pa.health == Health.CHECKPOINTED
    final = ckpt.load(ckpt.job_checkpoint(tmp_path / job_dirname("a")))
    assert final is not None and final.iteration == pa.iterations_done
    worlds = [json.loads(x)["world"] for x in (tmp_path / job_dirname("a") / "losses.jsonl").read_text()
              .splitlines()]
    assert worlds[0] == 4 and worlds[-1] == 2 and worlds == sorted(worlds, reverse=True)


def test_a_plan_the_worker_cannot_run_fails_with_its_reason(tmp_path: Path) -> None:
    """A valid decision whose plan combines pipeline and tensor parallelism: the worker refuses
    it by name."""
    cluster = local_cluster(4)
    a = JobSpec("a", "gpt-tiny", 16, 4, 4)
    alloc = Allocation("a", "T4", 4, 2, ExecutionPlan(dp=1, tp=2, pp=2, micro_batches=4),
                       {"local-0": 4}, 1.0, Action.START)
    dec = Decision([alloc], [], SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False))
    check = validate(dec, cluster, [a])
    assert check.ok, check.violations
    ex = LocalExecutor(tmp_path)
    ex.apply(dec, [a])
    # wait for the reason too: on a loaded machine the exit can be seen before the report
    p = wait_for(ex, "a", lambda p: p.done and (p.health != Health.FAILED or
                                                 "exit codes" not in (p.error or "exit codes")))
    assert p.health == Health.FAILED and "pipeline parallelism" in (p.error or "")
    assert p.plan == alloc.plan.label()  # the plan was not changed to fit


_SLOW_EXIT = """
import json, os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a slow exit: the grace period runs out
with open(os.environ["APPORTION_PROGRESS_FILE"], "a") as f:
    n = int(os.environ["APPORTION_ITERATIONS"])
    f.write(json.dumps({"iteration": n}) + "\\n")
    f.write(json.dumps({"iteration": n, "checkpoint": True}) + "\\n")
time.sleep(120)
"""


def test_a_group_killed_after_its_final_checkpoint_finished_its_job(tmp_path: Path) -> None:
    """A group stopped and killed after the grace period is judged by its last checkpoint:
    one at the target iteration is a finished job, not a stopped one (the kills test saw
    'stopped' under load when a finished job's group was slow to exit)."""
    import sys

    from apportion.jobs import Workload

    cluster = local_cluster(2)
    ex = LocalExecutor(tmp_path, stop_timeout_s=1.0)
    job = JobSpec("slow", "gpt-tiny", 8, 5, 1,
                  workload=Workload("torchrun", (sys.executable, "-c", _SLOW_EXIT)))
    ex.apply(decide(cluster, [job]), [job])
    p = wait_for(ex, "slow", lambda p: p.iterations_done >= 5 and p.checkpoint_iterations == 5)
    assert p.health == Health.RUNNING  # its process lives on past the target
    empty = Decision([], [], SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False))
    ex.apply(empty, [])  # the job is gone from the round: its group is stopped
    (p,) = [q for q in ex.poll() if q.job == "slow"]
    assert p.health == Health.FINISHED, p
    ex.shutdown(checkpoint=False)


def test_a_group_alive_after_its_final_checkpoint_is_reaped_and_finished(tmp_path: Path) -> None:
    """A group whose final checkpoint is at the target but whose processes do not exit (a
    rank hung in teardown) is killed after ``linger_s`` and its job recorded finished,
    without any round asking it to stop."""
    import sys

    from apportion.jobs import Workload

    cluster = local_cluster(2)
    ex = LocalExecutor(tmp_path, linger_s=1.0)
    job = JobSpec("hung", "gpt-tiny", 8, 5, 1,
                  workload=Workload("torchrun", (sys.executable, "-c", _SLOW_EXIT)))
    ex.apply(decide(cluster, [job]), [job])
    p = wait_for(ex, "hung", lambda p: p.checkpoint_iterations == 5)
    assert p.health == Health.RUNNING  # not reaped before the linger has passed
    t0 = time.monotonic()
    p = wait_for(ex, "hung", lambda p: p.health == Health.FINISHED, timeout=60.0)
    assert time.monotonic() - t0 >= 0.5 and p.iterations_done == 5
    assert "hung" not in ex.runs
    ex.shutdown(checkpoint=False)


@pytest.mark.parametrize("checkpoint,outcome", [(5, "finished"), (3, "stopped")])
def test_a_ray_group_killed_after_its_final_checkpoint_finished_its_job(
        tmp_path: Path, checkpoint: int, outcome: str) -> None:
    """The Ray executor's rule is the local one: an unclean stop is judged by the last
    checkpoint (no Ray needed: the classification reads the group's progress file)."""
    from apportion.runtime.executors.ray.executor import RayExecutor, _Group

    (tmp_path / "progress.jsonl").write_text(
        json.dumps({"iteration": checkpoint}) + "\n"
        + json.dumps({"iteration": checkpoint, "checkpoint": True}) + "\n")
    g = _Group(JobSpec("j", "gpt-tiny", 8, 5, 1), None, None, [], [], tmp_path, 0.0,
               kind="torchrun", launch_id="1", stopping=True)
    ex = RayExecutor.__new__(RayExecutor)  # no cluster: only the classification runs
    assert ex._settle(g, clean=False) == outcome
    assert g.health == (Health.FINISHED if outcome == "finished" else Health.CHECKPOINTED)


def test_a_hung_builtin_group_logs_its_stacks_before_it_is_killed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Built-in workers dump their threads' stacks on ``STACKS_SIGNAL`` (registered as the
    trainer registers it); the reaper asks for them and logs them, so a hang after the
    final checkpoint says where it hangs."""
    import logging
    import subprocess
    import sys
    from types import SimpleNamespace

    from apportion.runtime.executors.procs import Proc

    code = ("import faulthandler, time\n"
            "from apportion.runtime.workers.trainer import STACKS_SIGNAL\n"
            "faulthandler.register(STACKS_SIGNAL, all_threads=True)\n"
            "def final_report_hangs():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "final_report_hangs()\n")
    with open(tmp_path / "rank0.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            run = SimpleNamespace(procs=[Proc(proc)], dir=tmp_path,
                                  job=JobSpec("stuck", "gpt-tiny", 8, 3, 1))
            ex = LocalExecutor(tmp_path / "work", linger_s=0.5)
            with caplog.at_level(logging.WARNING,
                                 logger="apportion.runtime.executors.local.executor"):
                ex._log_stacks(run)  # type: ignore[arg-type]
        finally:
            proc.kill()
            proc.wait()
    assert "rank 0 alive" in caplog.text and "final_report_hangs" in caplog.text, caplog.text
