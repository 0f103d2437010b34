"""One scheduler behind every driver (issue 63, items 1 and 2).

Every driver holds a ``Scheduler(config, store, apply)``: the policy is built once with
the config (so the baselines read the round's budget too), each round runs the pipeline
with the store's commit and the driver's apply hook, and the store is one protocol
(``RoundStore``) its implementations give whole, so no driver probes it. These tests
discover what they check: every registered policy, every member of the protocol, every
driver module.
"""

from __future__ import annotations

import ast
import inspect
import io
import threading
import time
from pathlib import Path

import pytest
from apportion.experiments.harness import cluster_from_arg, resolve
from apportion.experiments.simulator import Simulator
from apportion.runtime.executors.dry_run.executor import DryRunExecutor
from apportion.runtime.loop import MemoryStore, run_loop
from apportion.runtime.store_adapter import SqliteRoundStore
from typer.testing import CliRunner

import apportion
from apportion.cli import app
from apportion.config import cluster_from_data, default_cluster, default_jobs
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, Scheduler, make_policy, policy_names
from apportion.round_store import RoundStore
from apportion.store import open_store
from apportion.store_faults import node_fault

runner = CliRunner()
ROOT = Path(apportion.__file__).resolve().parent.parent


def _members() -> list[str]:
    return sorted(n for n, v in vars(RoundStore).items()
                  if callable(v) and not n.startswith("_"))


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_is_built_with_the_rounds_budget(name: str) -> None:
    """``--time-budget`` reaches every optimising policy, baselines included: apportion's
    read the config, a baseline with a time limit of its own (Sia's integer program) is
    given the round's (it kept its own 5 s whatever the flag said)."""
    cfg = RoundConfig(time_budget_s=1.25)
    pol = make_policy(name, config=cfg)
    inner = getattr(pol, "cfg", None)
    if isinstance(inner, RoundConfig):
        assert inner.time_budget_s == 1.25, name
    if hasattr(pol, "time_limit_s"):
        assert pol.time_limit_s == 1.25, name
    # without a config a baseline keeps its own defaults, and an option given by name wins
    if name == "sia":
        assert make_policy(name).time_limit_s == 5.0
        assert make_policy(name, config=cfg, time_limit_s=3.0).time_limit_s == 3.0


def test_the_scheduler_builds_sia_with_the_budget() -> None:
    sched = Scheduler(RoundConfig(policy="sia", time_budget_s=0.7))
    assert sched.policy.name == "sia" and sched.policy.time_limit_s == 0.7


class _Recorder(MemoryStore):
    """A memory store that notes the order of the calls the pipeline's hooks make."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def record_round(self, index, now_s, decision, events):  # type: ignore[no-untyped-def]
        self.calls.append("commit")
        super().record_round(index, now_s, decision, events)


def test_a_step_commits_then_applies_through_the_pipelines_hooks() -> None:
    jobs, now = default_jobs()
    store = _Recorder()
    for j in jobs:
        store.submit(j)
    applied: list[int] = []

    def apply(decision):  # type: ignore[no-untyped-def]
        store.calls.append("apply")
        applied.append(len(store.rounds))  # the round is committed before it is applied

    with Scheduler(RoundConfig(backend="greedy"), store, apply) as sched:
        res = sched.step(default_cluster(), now)
    assert store.calls == ["commit", "apply"] and applied == [1]
    assert {"commit", "apply"} <= set(res.timing)
    assert store.rounds[0]["decision"]["allocations"] == res.decision.as_dict()["allocations"]


def _open(tmp_path: Path) -> tuple[object, SqliteRoundStore]:
    store = open_store(tmp_path / "s.db", create=True)
    return store, SqliteRoundStore(store, default_cluster())


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_every_store_implements_the_protocol_whole(kind: str, tmp_path: Path) -> None:
    """Each implementation gives every call the protocol names, with its parameters."""
    if kind == "memory":
        impl: object = MemoryStore()
    else:
        db, impl = _open(tmp_path)
    assert isinstance(impl, RoundStore)
    for name in _members():
        want = list(inspect.signature(getattr(RoundStore, name)).parameters)[1:]
        got = list(inspect.signature(getattr(impl, name)).parameters)
        assert got == want, (kind, name, got, want)
    if kind == "sqlite":
        db.close()  # type: ignore[attr-defined]


def _store_probes(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls whose object is a store."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            target = ast.unparse(node.args[0])
            if "store" in target.lower():
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", ["runtime/loop.py", "experiments/simulator.py",
                                    "apportion/cli/store.py", "apportion/policies/scheduler.py"])
def test_no_driver_probes_its_store(module: str) -> None:
    assert _store_probes(ROOT / module) == []


def _stop_after_first_round() -> tuple[threading.Event, object]:
    seen = threading.Event()
    return seen, (lambda tick: seen.set())


def test_run_commits_the_cluster_it_planned_on_and_applies_through_the_hooks(
        tmp_path: Path) -> None:
    """A node the store holds down is out of ``run``'s round, and the round is recorded
    on that cluster (as ``solve-round --state`` records it; ``run`` recorded the
    configured one); the executor acts after the commit, through the apply hook."""
    cl = cluster_from_data({"name": "two", "node_groups": [
        {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4}]}, "test")
    store = open_store(tmp_path / "s.db", create=True)
    try:
        store.submit([JobSpec("a", "bert-336m", 32, 100, 4)], source="test")
        node_fault(store, "a40-0", time.time(), detail="lost in a test")
        seen, on_round = _stop_after_first_round()
        ex = DryRunExecutor(tmp_path / "runs", out=io.StringIO())
        res = run_loop(cl, SqliteRoundStore(store, cl), ex, interval_s=3600.0,
                       round_config=RoundConfig(backend="greedy"), on_round=on_round,
                       should_stop=seen.is_set)
        assert res.rounds == 1 and res.reason == "stopped"
        (r,) = store.rounds()
        rnd = store.round(r["id"])
        assert rnd["cluster"]["capacity"] == {"A40": 4}, rnd["cluster"]
        (a,) = store.decision(r["id"])["allocations"]
        assert set(a["placement"]) == {"a40-1"}
        assert [e.job for e in res.events if e.action == "start"] == ["a"]
    finally:
        store.close()


def test_a_run_ranks_against_the_jobs_the_store_saw_finish(tmp_path: Path) -> None:
    """The store's finished jobs reach a scheduler's policy with its first round (what
    ``solve-round --state`` always gave it; a restarted ``run`` forgot them)."""
    store, rs = _open(tmp_path)
    cl = default_cluster()
    try:
        store.submit([JobSpec("done", "bert-336m", 32, 100, 1)], source="test")  # type: ignore[attr-defined]
        with Scheduler(RoundConfig(backend="greedy"), rs) as first:  # an earlier run
            first.step(cl, time.time())
        assert store.job("done").state.value == "running"  # type: ignore[attr-defined]
        store.record_progress("done", 100, time.time())  # type: ignore[attr-defined]
        assert store.job("done").state.value == "finished"  # type: ignore[attr-defined]
        store.submit([JobSpec("next", "bert-336m", 32, 100, 1)], source="test")  # type: ignore[attr-defined]
        with Scheduler(RoundConfig(), SqliteRoundStore(store, cl)) as restarted:  # type: ignore[arg-type]
            assert "done" not in restarted.policy.seen_jct
            restarted.step(cl, time.time())
            assert "done" in restarted.policy.seen_jct
    finally:
        store.close()  # type: ignore[attr-defined]


def test_the_simulator_commits_and_applies_through_the_hooks() -> None:
    cl = cluster_from_arg("8:8:8")
    trace, truth = resolve("synthetic:4", cl)
    sim = Simulator(cl, trace, make_policy("fcfs"), truth)
    res = sim.run()
    assert sim.scheduler.rounds == len(res.rounds) > 0
    assert {"commit", "apply"} <= set(sim.scheduler.last.timing)


def test_run_and_solve_round_refuse_a_flag_alike(tmp_path: Path) -> None:
    """One config builder: ``run`` (and ``serve``, which shares its options) refuses what
    ``solve-round`` refuses, with the same words."""
    table = tmp_path / "m.csv"
    table.write_text("model,gpu_type,gpus,iter_time_s\nbert-336m,A40,1,0.1\n")
    sr = runner.invoke(app, ["solve-round", "--tables", str(table)])
    run = runner.invoke(app, ["run", "--state", str(tmp_path / "s.db"), "--tables", str(table),
                              "--timeout", "1"])
    assert sr.exit_code == run.exit_code == 2, (sr.output, run.output)

    def said(out: str) -> str:
        return " ".join(out.split()).partition("error:")[2].strip()

    assert said(sr.output) and said(sr.output) == said(run.output), (sr.output, run.output)
    assert not (tmp_path / "s.db").exists()
