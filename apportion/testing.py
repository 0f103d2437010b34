"""The conformance checks apportion runs on everything it registers, for a plug-in's author
to run too (scikit-learn's ``check_estimator`` is the model).

``check_policy(name_or_policy)`` runs a policy on an operator's queue through the round
pipeline; ``check_formulation(name)`` solves a registered formulation with the solver
chain and with its heuristic alone and checks every answer against the model's own rows;
``check_executor(executor)`` checks the protocol; ``check_estimator(estimator)`` the
estimator protocol. Each raises :class:`AssertionError` naming what failed, and returns
what it ran on, so a test may look further::

    from apportion.testing import check_policy
    check_policy("my-policy")          # a name registered through the entry point
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import replace
from typing import Any

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision, Reason, SolveReport
from apportion.estimation.base import Estimate, Estimator, Sample
from apportion.estimation.models.analytic import nominal_placement
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import cells_of
from apportion.jobs import JobSpec, RunningState, Workload
from apportion.plans import Cell, ExecutionPlan
from apportion.policies import RECIPES, RoundConfig, make_policy, policy_names, run_round
from apportion.policies.formulation import FormulationPolicy, choice_vector
from apportion.runtime.executors.executor import Executor, Health
from apportion.validator import validate
from apportion.view import Policy

CLUSTER = Cluster("conformance", [NodeGroup("a40", 2, "A40", 4, 32, 256.0),
                                  NodeGroup("a100", 1, "A100-40GB", 8, 64, 512.0)])
MODELS = ("bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b")


def queue(n: int = 7, running: int = 0) -> list[JobSpec]:
    """``n`` catalog jobs of 1, 2 and 4 GPUs; the first ``running`` (at most 2) running on
    the A40 nodes."""
    jobs = [JobSpec(f"j{i}", MODELS[i % len(MODELS)], 64, 1000 + 100 * i, [1, 2, 4][i % 3],
                    submit_time_s=float(i)) for i in range(n)]
    for i in range(min(running, 2)):
        g = jobs[i].requested_gpus
        jobs[i] = replace(jobs[i], running=RunningState("A40", g, 1, {f"a40-{i}": g}))
    return jobs


def check_policy(policy: str | Policy, config: RoundConfig | None = None) -> Decision:
    """A policy decides an operator's round: admission refuses what can never run (a job
    larger than the cluster, a model the catalog lacks) with typed reasons, the decision
    is valid, every job is accounted for, something is placed on an empty cluster, and the
    decision names the policy."""
    cfg = config or RoundConfig(time_budget_s=3.0, isolate=False)
    pol = make_policy(policy, config=cfg) if isinstance(policy, str) else policy
    assert isinstance(pol, Policy) and pol.name, f"{policy!r}: not a policy (decide, name)"
    jobs = queue(9) + [JobSpec("huge", "bert-336m", 64, 10, 999),
                       JobSpec("ghost", "no-such-model", 64, 10, 1)]
    d = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol).decision
    real = [j for j in jobs if j.id not in ("huge", "ghost")]
    check = validate(d, CLUSTER, real)
    assert check.ok, f"{pol.name}: invalid decision: {check.violations[:5]}"
    seen = {a.job for a in d.allocations} | {p.job for p in d.pending}
    assert seen == {j.id for j in jobs}, f"{pol.name}: jobs unaccounted for: " \
        f"{sorted({j.id for j in jobs} ^ seen)}"
    refused = {p.job: p for p in d.pending if p.stage == "admit"}
    assert refused["huge"].reason == Reason.TOO_LARGE and not refused["huge"].can_ever_fit
    assert refused["ghost"].reason == Reason.CATALOG and not refused["ghost"].can_ever_fit
    assert d.allocations, f"{pol.name} placed nothing on an empty cluster"
    assert d.meta["policy"] == pol.name and "admit" in d.meta["stages"]
    return d


def check_formulation(name: str, backends: tuple[str, ...] = ("auto", "greedy"),
                      budget_s: float = 10.0) -> list[Decision]:
    """A registered formulation solves a round with each backend (the solver chain, and its
    heuristic alone): every decision is valid and its cells satisfy the model's rows (an
    added constraint holds whichever answered), and a fallback says why."""
    assert name in RECIPES, f"{name!r} is not a registered formulation: {sorted(RECIPES)}"
    out = []
    for backend in backends:
        jobs = queue(9, running=2)
        cfg = RoundConfig(formulation=name, backend=backend, time_budget_s=budget_s,
                          isolate=False)
        pol = FormulationPolicy(cfg)
        res = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol)
        d = res.decision
        check = validate(d, CLUSTER, jobs)
        assert check.ok, f"{name}/{backend}: invalid decision: {check.violations[:5]}"
        g = res.graph
        model = pol.recipe.model(g, cfg)
        chosen = {a.job for a in d.allocations}
        choices = [c for c in _cell_choices(g, d) if c.job in chosen]
        broken = model.violations(choice_vector(model, choices))
        assert not broken, f"{name}/{backend}: the decision breaks the model: {broken}"
        if d.report.fallback:
            assert d.report.fallback_reason, f"{name}/{backend}: a fallback without a reason"
        out.append(d)
    return out


def _cell_choices(g: Any, d: Decision) -> list[Any]:
    """The decision's allocations as the candidate graph's cells (what the model sees)."""
    out = []
    for a in d.allocations:
        for cn in cells_of(g, a.job):
            c = g.nodes[cn]
            if c["gpu_type"] == a.gpu_type and int(c["gpus"]) == a.gpus and \
                    int(c.get("stages", 1)) == a.stages:
                out.append(CellChoice(a.job, cn, dict(a.placement)))
                break
    return out


def check_executor(executor: Any) -> None:
    """An executor exposes apply/poll/shutdown with the protocol's signatures and a name."""
    assert isinstance(executor, Executor) and executor.name, \
        f"{executor!r}: not an executor (name, apply, poll, shutdown)"
    for meth in ("apply", "poll", "shutdown"):
        want = list(inspect.signature(getattr(Executor, meth)).parameters)[1:]
        got = list(inspect.signature(getattr(executor, meth)).parameters)
        assert got[:len(want)] == want, f"{executor.name}.{meth}{got}: expected {want}"


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
    raise AssertionError(f"{getattr(executor, 'name', executor)}: {job} never {what}; "
                         f"last seen {seen}")


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
    report = SolveReport("check", "optimal", 0.0, 0.0, 0.0, 0.0, False)
    a = JobSpec("conf-a", "gpt-tiny", 8, 100_000, 1)
    b = JobSpec("conf-b", "gpt-tiny", 8, 10, 1,
                workload=Workload("torchrun", ("/nonexistent/apportion-check-binary",)))

    def alloc(job: JobSpec, gpus: int, action: Action) -> Allocation:
        where, kind = (b_node, b_type) if job is b else (name, t)
        return Allocation(job.id, kind, gpus, 1, ExecutionPlan(dp=gpus), {where: gpus}, 1.0,
                          action)

    d = Decision([alloc(a, 1, Action.START)], [], report)
    events = executor.apply(d, [a])
    assert any(e.job == a.id and e.action == "start" for e in events), events
    p = _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.iterations_done >= 2,
              "ran", timeout_s)
    running = replace(a, iterations_done=p.iterations_done,
                      running=RunningState(t, 1, 1, {name: 1}))
    d = Decision([alloc(a, 2, Action.RESIZE), alloc(b, 1, Action.START)], [], report)
    executor.apply(d, [running, b])
    _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.workers == 2
          and p.iterations_done > running.iterations_done, "resumed on two workers", timeout_s)
    fb = _wait(executor, b.id, lambda p: p.health == Health.FAILED, "failed", timeout_s)
    assert fb.error and ("nonexistent" in fb.error or "not found" in fb.error.lower()
                         or "No such file" in fb.error), fb.error
    pa = next(p for p in executor.poll() if p.job == a.id)
    assert pa.health == Health.RUNNING, f"the failure of {b.id} stopped {a.id}: {pa}"
    running = replace(a, iterations_done=pa.iterations_done,
                      running=RunningState(t, 2, 1, {name: 2}))
    executor.apply(Decision([], [], report), [running])  # preempted: no allocation for it
    stopped = _wait(executor, a.id, lambda p: p.health == Health.CHECKPOINTED, "stopped",
                    timeout_s)
    assert stopped.iterations_done >= running.iterations_done
    executor.shutdown(checkpoint=True)


def check_estimator(estimator: Estimator) -> None:
    """scikit-learn's contract (parameters only in ``__init__``, ``fit`` returns self and
    learns only attributes ending in ``_``), and estimates that are finite, positive and
    grow with the batch."""
    cl = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8)])
    assert isinstance(estimator, Estimator), f"{estimator!r}: not an estimator"
    sig = set(inspect.signature(type(estimator).__init__).parameters) - {"self"}
    assert set(estimator.get_params()) == sig, "parameters must be __init__'s arguments"
    before, params = set(vars(estimator)), estimator.get_params()
    assert not any(k.endswith("_") for k in before), "fitted attributes before fit"
    samples = []
    for i, g in enumerate((1, 2, 4, 8, 8, 4, 2, 1)):
        job = JobSpec(f"s{i}", "bert-336m", 64, 10, g)
        samples.append(Sample(job, ExecutionPlan(dp=g, checkpointing=i >= 4),
                              nominal_placement(cl, "A100-40GB", g), "A100-40GB",
                              0.05 + 1.6 / g))
    assert estimator.fit(samples) is estimator, "fit must return self"
    learned = set(vars(estimator)) - before
    assert all(k.endswith("_") for k in learned), f"fit set {sorted(learned)}"
    assert estimator.get_params() == params, "fit changed a parameter"
    job = JobSpec("j", "bert-336m", 64, 10, 4)
    e = estimator.predict(job, ExecutionPlan(dp=4), nominal_placement(cl, "A100-40GB", 4), cl)
    assert isinstance(e, Estimate) and e.iter_time_s > 0 and math.isfinite(e.iter_time_s)
    cell = Cell("a", "A100-40GB", 4, 1)
    small = estimator.best_in_cell(JobSpec("a", "bert-336m", 32, 10, 4), cell, cl)
    large = estimator.best_in_cell(JobSpec("b", "bert-336m", 256, 10, 4), cell, cl)
    assert small is not None and large is not None and large.iter_time_s > small.iter_time_s


def registered() -> dict[str, list[str]]:
    """Everything registered now, plug-ins included: what a conformance suite discovers."""
    from apportion.estimation.registry import ESTIMATORS

    return {"policies": policy_names(), "formulations": list(RECIPES),
            "estimators": list(ESTIMATORS)}


__all__ = ["CLUSTER", "check_estimator", "check_executor", "check_executor_behaviour",
           "check_formulation",
           "check_policy", "queue", "registered"]
