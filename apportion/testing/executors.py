"""The executor checks: a registered executor's declaration and an empty round of it, the
protocol's methods and signatures, and, on a real cluster or this machine, what an executor
does with a job it starts, resizes, preempts and cannot start."""

from __future__ import annotations

import inspect
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from apportion.runtime.executors import (
    RUN_OPTIONS,
    Event,
    Executor,
    Health,
    Progress,
    executors,
    make_executor,
)
from apportion.runtime.executors.executor import MemoryLaunchLog, Runs
from apportion.testing.failures import check, expect, subject
from apportion.testing.fixtures import CLUSTER

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, RunningState, Workload
from apportion.plans import ExecutionPlan

_REPORT = SolveReport("check", "optimal", 0.0, 0.0, 0.0, 0.0, False)


@check
def check_executor(executor: Any, cluster: Cluster | None = None,
                   folder: str | Path | None = None) -> Any:
    """An executor keeps the protocol's promises.

    Given an executor object: it exposes apply/poll/shutdown with the protocol's signatures
    and a name; one that subclasses :class:`~apportion.runtime.executors.Executor` (every
    built-in) keeps the signatures of the rest of it too. Nothing is applied (the object
    may be driving a cluster).

    Given a name: it is registered (``register()``, or the ``apportion.executors`` entry
    points) with a doc, a factory and run options :data:`RUN_OPTIONS` names; built by the
    registry in ``folder`` (default: a new temporary one) for ``cluster`` (default: the
    checks' :data:`~apportion.testing.CLUSTER`), with no run option given, it is an
    :class:`Executor` of that name, keeps the protocol as above, and runs an empty round:
    applying a decision with no allocation acts on nothing, ``poll`` and ``shutdown``
    report lists of :class:`Progress` and :class:`Event`, and ``close`` returns.

    Raises :class:`AssertionError` naming what failed; returns the executor checked."""
    if not isinstance(executor, str):
        _check_protocol(executor)
        return executor
    every = executors()
    name = executor
    expect(name in every, f"{name!r} is not a registered executor (register() it, or "
           f"declare it in the apportion.executors entry points): {sorted(every)}")
    kind = every[name]
    expect(name == name.strip() and name and " " not in name, f"{name!r}: not a usable name")
    expect(kind.doc.strip(), f"{name}: no doc (apportion executors shows it)")
    expect(callable(kind.make), f"{name}: make is not callable")
    unknown = [r for r in kind.reads if r not in RUN_OPTIONS]
    expect(not unknown, f"{name}: reads {unknown}, not run options ({', '.join(RUN_OPTIONS)})")
    work = Path(folder or tempfile.mkdtemp(prefix="apportion-executor-check-"))
    built = make_executor(name, work, cluster or CLUSTER, launch_log=MemoryLaunchLog())
    try:
        expect(isinstance(built, Executor), f"{name}: built {built!r}, not an Executor")
        expect(built.name == name, f"{name}: the executor it builds is named {built.name!r} "
               "(its launch records, and what a restarted run adopts, go by the name)")
        _check_protocol(built)
        _check_empty_round(built)
    finally:
        built.close()
    return built


def _check_protocol(executor: Any) -> None:
    """The methods and signatures (see :func:`check_executor`)."""
    expect(isinstance(executor, (Executor, Runs)) and executor.name,
           f"{executor!r}: not an executor (name, apply, poll, shutdown)")
    extra = ("reconcile", "adopted_jobs", "stop_adopted", "close")
    for meth in ("apply", "poll", "shutdown", *(extra if isinstance(executor, Executor) else ())):
        want = list(inspect.signature(getattr(Executor, meth)).parameters)[1:]
        got = list(inspect.signature(getattr(executor, meth)).parameters)
        expect(got[:len(want)] == want, f"{executor.name}.{meth}{got}: expected {want}")
    grace = executor.stop_timeout_s if isinstance(executor, Executor) else None
    expect(grace is None or (isinstance(grace, (int, float)) and grace >= 0),
           f"{executor.name}: stop_timeout_s {grace!r} is not None or seconds")


def _check_empty_round(executor: Executor) -> None:
    """A decision without allocations acts on nothing; poll, shutdown and the restart
    hooks answer with their types."""
    name = executor.name
    events = executor.apply(Decision([], [], _REPORT), [])
    expect(isinstance(events, list) and all(isinstance(e, Event) for e in events),
           f"{name}: apply returned {events!r}, not a list of Event")
    expect(not [e for e in events if e.action != "keep"],
           f"{name}: an empty decision acted: {events}")
    progress = executor.poll()
    expect(isinstance(progress, list) and all(isinstance(p, Progress) for p in progress),
           f"{name}: poll returned {progress!r}, not a list of Progress")
    expect(isinstance(executor.adopted_jobs(), set), f"{name}: adopted_jobs is not a set")
    expect(executor.reconcile([], {}) == [], f"{name}: reconciled launches it was not given")
    stopped = executor.shutdown(checkpoint=True)
    expect(isinstance(stopped, list) and all(isinstance(e, Event) for e in stopped),
           f"{name}: shutdown returned {stopped!r}, not a list of Event")


def _wait(executor: Any, job: str, cond: Any, what: str, timeout_s: float) -> Any:
    """Poll until ``cond(progress)`` holds for ``job``; a safety deadline, not a speed test."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        for p in executor.poll():
            if p.job == job:
                seen = p
                if cond(p):
                    return p
        time.sleep(0.5)
    raise AssertionError(f"{subject(executor)}: {job} never {what}; last seen {seen}")


@check
def check_executor_behaviour(executor: Any, cluster: Cluster, node: str | None = None,
                             gpu_type: str | None = None, timeout_s: float = 600.0,
                             other_node: str | None = None) -> None:
    """An executor does what the protocol promises, by behaviour: a started job runs and
    reports progress; resized to two GPUs it resumes from its checkpoint on two workers;
    preempted it stops with a checkpoint; a job whose command cannot start fails with its
    reason while the other keeps running; shutdown checkpoints what runs. ``node`` (and its
    ``gpu_type``) is where the jobs go: a node with three GPUs or more (every decision the
    check applies is valid for it); or, with ``other_node``, a node of two GPUs for the
    running job and another for the failing one (a cluster of small nodes, as a test
    cluster of Slurm's is)."""
    name = node or next(n for n, v in cluster.nodes.items() if v.gpus >= 3)
    t = gpu_type or cluster.nodes[name].gpu_type
    b_node = other_node or name
    b_type = cluster.nodes[b_node].gpu_type if other_node else t
    report = _REPORT
    a = JobSpec("conf-a", "gpt-tiny", 8, 100_000, 1)
    b = JobSpec("conf-b", "gpt-tiny", 8, 10, 1,
                workload=Workload("torchrun", ("/nonexistent/apportion-check-binary",)))

    def alloc(job: JobSpec, gpus: int, action: Action) -> Allocation:
        where, kind = (b_node, b_type) if job is b else (name, t)
        return Allocation(job.id, kind, gpus, 1, ExecutionPlan(dp=gpus), {where: gpus}, 1.0,
                          action)

    d = Decision([alloc(a, 1, Action.START)], [], report)
    events = executor.apply(d, [a])
    expect(any(e.job == a.id and e.action == "start" for e in events),
           f"{subject(executor)}: applying a start of {a.id} reported {events}")
    p = _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.iterations_done >= 2,
              "ran", timeout_s)
    running = replace(a, iterations_done=p.iterations_done,
                      running=RunningState(t, 1, 1, {name: 1}))
    d = Decision([alloc(a, 2, Action.RESIZE), alloc(b, 1, Action.START)], [], report)
    executor.apply(d, [running, b])
    _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.workers == 2
          and p.iterations_done > running.iterations_done, "resumed on two workers", timeout_s)
    fb = _wait(executor, b.id, lambda p: p.health == Health.FAILED, "failed", timeout_s)
    expect(fb.error and ("nonexistent" in fb.error or "not found" in fb.error.lower()
                         or "No such file" in fb.error),
           f"{subject(executor)}: {b.id} failed without its reason: {fb.error!r}")
    pa = next((p for p in executor.poll() if p.job == a.id), None)
    if pa is None or pa.health != Health.RUNNING:
        raise AssertionError(f"{subject(executor)}: the failure of {b.id} stopped {a.id}: {pa}")
    running = replace(a, iterations_done=pa.iterations_done,
                      running=RunningState(t, 2, 1, {name: 2}))
    executor.apply(Decision([], [], report), [running])  # preempted: no allocation for it
    stopped = _wait(executor, a.id, lambda p: p.health == Health.CHECKPOINTED, "stopped",
                    timeout_s)
    expect(stopped.iterations_done >= running.iterations_done,
           f"{subject(executor)}: {a.id} stopped at iteration {stopped.iterations_done}, "
           f"before the {running.iterations_done} it had done")
    executor.shutdown(checkpoint=True)


__all__ = ["check_executor", "check_executor_behaviour"]
