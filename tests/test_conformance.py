"""Conformance suites that discover what they test (scikit-learn's parametrize_with_checks).

Every registered solver backend, every registered policy (on an operator's
queue, through the one round pipeline) and every executor is checked by the
same tests, so a new plug-in is checked on arrival. Estimators have their own
suite (tests/test_estimation_conformance.py), driven by the estimator registry.
"""

from __future__ import annotations

import io

import pytest
from apportion.formulations.cells import objective_of
from apportion.solvers.chain import BACKENDS
from apportion.solvers.greedy import GreedyCells
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Reason
from apportion.jobs import JobSpec, RunningState
from apportion.policies import POLICIES, RECIPES, RoundConfig, make_policy, policy_names, run_round
from apportion.round import STAGES
from apportion.testing import check_executor, check_formulation, check_policy
from apportion.validator import validate

CLUSTER = Cluster("conf", [NodeGroup("a40", 2, "A40", 4, 32, 256.0),
                           NodeGroup("a100", 1, "A100-40GB", 8, 64, 512.0)])
MODELS = ["bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b"]


def _queue(n: int = 7) -> list[JobSpec]:
    return [JobSpec(f"j{i}", MODELS[i % len(MODELS)], 64, 1000 + 100 * i, [1, 2, 4][i % 3],
                    submit_time_s=float(i)) for i in range(n)]


# -- solver backends ----------------------------------------------------------------------
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_answers_validated(name: str, isolate: bool) -> None:
    """Each backend, alone, in-process and in a child process: a validated answer at least
    as good as the greedy's (the exact ones reach the optimum HiGHS proves)."""
    jobs = _queue()
    res = run_round(CLUSTER, jobs, 10.0, RoundConfig(backend=name, time_budget_s=20.0,
                                                     isolate=isolate))
    d = res.decision
    assert validate(d, CLUSTER, jobs).ok
    assert d.report.backend == name and not d.report.fallback, d.report
    g = res.graph
    assert g is not None
    greedy = GreedyCells().solve(g)[1]
    assert d.report.objective is not None and d.report.objective >= greedy - 1e-6
    if name != "lp-round":  # exact backends close the gap on a model this small
        optimum = run_round(CLUSTER, jobs, 10.0, RoundConfig(backend="highs")).decision
        assert d.report.objective == pytest.approx(optimum.report.objective, rel=1e-6)


@given(st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8]),
                          st.sampled_from([16, 64, 256])), min_size=1, max_size=9),
       st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_pipeline_answers_are_valid_and_beat_the_greedy(rows: list, running: int) -> None:
    """Random queues (some jobs running): whatever backend answers, the decision is valid,
    its objective is what the graph says, and it is at least the greedy's."""
    jobs = []
    for i, (m, g, b) in enumerate(rows):
        r = None
        if i < running and g <= 4:
            r = RunningState("A40", g, 1, {"a40-0" if i % 2 == 0 else "a40-1": g})
        jobs.append(JobSpec(f"h{i}", m, b, 500, g, submit_time_s=float(i), running=r))
    # running jobs must fit their nodes together: drop the ones that would not
    used: dict[str, int] = {}
    ok = []
    for j in jobs:
        if j.running is not None:
            (node, k), = j.running.placement.items()
            if used.get(node, 0) + k > 4:
                j = JobSpec(j.id, j.model, j.global_batch_size, j.iterations, j.requested_gpus,
                            submit_time_s=j.submit_time_s)
            else:
                used[node] = used.get(node, 0) + k
        ok.append(j)
    res = run_round(CLUSTER, ok, 100.0, RoundConfig(backend="auto", time_budget_s=10.0,
                                                    isolate=False))
    d = res.decision
    assert validate(d, CLUSTER, ok).ok
    assert {a.job for a in d.allocations} | {p.job for p in d.pending} == {j.id for j in ok}
    g = res.graph
    assert g is not None
    greedy_choices, greedy_obj, _ = GreedyCells().solve(g)
    assert objective_of(g, greedy_choices) == pytest.approx(greedy_obj, abs=1e-6)
    if d.report.objective is not None:
        assert d.report.objective >= greedy_obj - 1e-6
    for a in d.allocations:
        j = next(x for x in ok if x.id == a.job)
        assert (a.action == Action.START) == (j.running is None)
    assert set(d.meta["stages"]) <= set(STAGES)


# -- policies -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", policy_names())
def test_every_policy_decides_an_operator_round(name: str) -> None:
    """Any registered policy runs on an operator's queue (what ``solve-round --policy`` and
    ``run --policy`` do): admission, the policy, validation; every job accounted for
    (:func:`apportion.testing.check_policy`, what a plug-in's author runs too)."""
    check_policy(name)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_formulation_keeps_its_rows(name: str) -> None:
    """Every registered formulation, by the solver chain and by its heuristic alone: valid
    decisions that satisfy the model's own rows."""
    check_formulation(name)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_honours_the_executors_plans(name: str) -> None:
    """What an executor's workers cannot run never reaches them, whichever policy chose: with a
    plan filter that refuses every data-parallel plan, no allocation has dp > 1, and a job left
    out for it says ``no-supported-plan``."""
    def single_rank(job: JobSpec, plan) -> str | None:
        return None if plan.dp == 1 else f"dp {plan.dp}: this executor runs one rank per stage"

    jobs = _queue(6)
    cfg = RoundConfig(time_budget_s=3.0, isolate=False, plan_filter=single_rank)
    res = run_round(CLUSTER, jobs, 50.0, cfg, policy=make_policy(name, config=cfg))
    d = res.decision
    assert validate(d, CLUSTER, jobs).ok
    assert all(a.plan.dp == 1 for a in d.allocations), [a.plan.label() for a in d.allocations]
    assert {a.job for a in d.allocations} | {p.job for p in d.pending} == {j.id for j in jobs}
    for p in d.pending:
        if p.reason == Reason.NO_PLAN:
            assert "dp" in p.detail and p.can_ever_fit is False


# -- executors ------------------------------------------------------------------------------
def _executors() -> list[str]:
    from apportion.runtime.executors import executor_names

    return executor_names()


@pytest.mark.parametrize("name", _executors())
def test_every_executor_implements_the_protocol(name: str, tmp_path) -> None:
    """Each executor ``run --executor`` names exposes apply/poll/shutdown with the protocol's
    signatures (constructed without touching a cluster)."""
    from apportion.runtime.executors import make_executor

    if name == "ray":
        pytest.importorskip("ray")
    try:
        e = make_executor(name, tmp_path, CLUSTER, None)
    except ImportError as exc:  # an optional engine's client library
        pytest.skip(f"{name}: {exc}")
    check_executor(e)
    close = getattr(e, "close", None)
    if callable(close):
        close()
    if name == "ray":  # the executor started an in-process Ray: leave none behind
        import ray

        ray.shutdown()


@pytest.mark.parametrize("name", _executors())
def test_every_registered_executor_passes_its_check(name: str, tmp_path) -> None:
    """Each registered executor, by name: declared with a doc and run options the run has,
    built by the registry as an Executor of its name, an empty round applied, polled, shut
    down and closed (:func:`apportion.testing.check_executor`)."""
    if name == "ray":
        pytest.importorskip("ray")
    try:
        check_executor(name, folder=tmp_path)
    except AssertionError as exc:
        if isinstance(exc.__cause__, ImportError):  # an optional engine's client library
            pytest.skip(f"{name}: {exc.__cause__}")
        raise
    finally:
        if name == "ray":  # leave no in-process Ray behind
            import ray

            ray.shutdown()


def test_dry_run_executor_applies_a_pipeline_decision(tmp_path) -> None:
    from apportion.runtime.executors.dry_run.executor import DryRunExecutor

    jobs = _queue(4)
    d = run_round(CLUSTER, jobs, 5.0, RoundConfig(isolate=False)).decision
    buf = io.StringIO()
    e = DryRunExecutor(tmp_path, out=buf)
    events = e.apply(d, jobs)
    assert {ev.job for ev in events} == {a.job for a in d.allocations}
    assert all(ev.spec and ev.spec["workers"] == a.gpus
               for ev, a in zip(sorted(events, key=lambda x: x.job),
                                sorted(d.allocations, key=lambda x: x.job)))
    assert len(buf.getvalue().splitlines()) == len(events)


# -- executors by behaviour -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["local", "ray"])
def test_every_executor_that_runs_here_behaves(name: str, tmp_path) -> None:
    """Start, progress, resize, a failing neighbour, preemption and shutdown, by what the
    executor does (:func:`apportion.testing.check_executor_behaviour`); Slurm's in
    tests/test_runtime_slurm.py, which starts a cluster."""
    pytest.importorskip("torch")
    from apportion.runtime.executors.local.executor import local_cluster
    from apportion.testing import check_executor_behaviour

    cl = local_cluster(3)
    if name == "local":
        from apportion.runtime.executors.local.executor import LocalExecutor

        ex = LocalExecutor(tmp_path, stop_timeout_s=60)
    else:
        pytest.importorskip("ray")
        from apportion.runtime.executors.ray.executor import RayExecutor

        ex = RayExecutor(tmp_path, cluster=cl, num_cpus=4, stop_timeout_s=60)
    try:
        check_executor_behaviour(ex, cl)
    finally:
        close = getattr(ex, "close", None)
        if callable(close):
            close()
