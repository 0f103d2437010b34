"""Attained service read back from a real store, and history-aware policies on the operator path.

Rounds are committed at chosen times through the real store (``commit_round``), so the
running intervals and GPU counts are known exactly: the history must add up to them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.policies import RoundConfig, run_round
from apportion.store import open_store
from apportion.store_history import job_histories

CLUSTER = Cluster("hist", [NodeGroup("a", 2, "A100-40GB", 8, 64, 512.0)])


def _alloc(job: str, gpus: int, action: Action) -> Allocation:
    place = {"a-0": min(gpus, 8)} | ({"a-1": gpus - 8} if gpus > 8 else {})
    a = Allocation(job, "A100-40GB", gpus, 1, ExecutionPlan(dp=gpus), place, 1.0)
    a.action = action
    return a


def _commit(store, allocs: list[Allocation], at: float, preempted: tuple[str, ...] = (),
            waiting: tuple[str, ...] = ()) -> None:
    snap = store.round_input()
    pending = [Pending(j, Reason.PREEMPTED, action=Action.PREEMPT) for j in preempted]
    pending += [Pending(j, Reason.NO_CAPACITY) for j in waiting]
    d = Decision(allocs, pending, SolveReport("greedy", "feasible", 0.0, None, None, 0.0, False))
    store.commit_round(d, snap, CLUSTER, at, round_key=f"r{at}", at=at)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 4, 8]), st.floats(1.0, 500.0)),
                min_size=1, max_size=6))
def test_attained_service_adds_up_the_rounds(tmp_path_factory, steps) -> None:
    """GPUs held in each round times the time to the next round (or to now), summed."""
    db = tmp_path_factory.mktemp("h") / "s.db"
    store = open_store(db, create=True)
    try:
        store.submit([JobSpec("j", "bert-336m", 64, 10**6, 1)], at=0.0)
        t, prev, expect_gpu_s, expect_run_s, first = 0.0, 0, 0.0, 0.0, None
        for gpus, dt in steps:
            if gpus:
                act = Action.START if prev == 0 else (Action.KEEP if gpus == prev
                                                      else Action.RESIZE)
                _commit(store, [_alloc("j", gpus, act)], t)
                first = t if first is None else first
            else:
                _commit(store, [], t, preempted=("j",) if prev else (),
                        waiting=() if prev else ("j",))
            expect_gpu_s += gpus * dt
            expect_run_s += dt if gpus else 0.0
            prev = gpus
            t += dt
        h = job_histories(store, t)["j"]
        assert h.gpu_seconds == pytest.approx(expect_gpu_s, rel=1e-9, abs=1e-6)
        assert h.run_seconds == pytest.approx(expect_run_s, rel=1e-9, abs=1e-6)
        assert h.first_start == first
        assert sum(h.time_on_type.values()) == pytest.approx(expect_run_s, abs=1e-6)
    finally:
        store.close()


def test_history_reaches_the_policy_on_the_operator_path(tmp_path: Path) -> None:
    """Tiresias demotes a job that has had much service: with the store's history it ranks
    below a fresh one; without history (no store) it would rank by arrival."""
    store = open_store(tmp_path / "s.db", create=True)
    try:
        old = JobSpec("old", "bert-336m", 64, 10**6, 16, submit_time_s=0.0)
        new = JobSpec("new", "bert-336m", 64, 10**6, 16, submit_time_s=10.0)
        store.submit([old], at=0.0)
        _commit(store, [_alloc("old", 16, Action.START)], 1.0)
        store.submit([new], at=5000.0)
        _commit(store, [], 5000.0, preempted=("old",), waiting=("new",))  # after 4999 s
        snap = store.round_input()
        hist = job_histories(store, 5001.0)
        assert hist["old"].gpu_seconds == pytest.approx(16 * 4999.0)
        assert hist["old"].preemptions == 1 and hist["new"].gpu_seconds == 0.0
        cfg = RoundConfig(time_budget_s=2.0, isolate=False, policy="tiresias")
        with_h = run_round(CLUSTER, snap.jobs, 5001.0, cfg, history=hist).decision
        without = run_round(CLUSTER, snap.jobs, 5001.0, cfg).decision
        for d in (with_h, without):
            assert validate(d, CLUSTER, snap.jobs).ok
        assert [a.job for a in with_h.allocations] == ["new"]
        assert [a.job for a in without.allocations] == ["old"]
    finally:
        store.close()


def test_solve_round_with_state_gives_policies_the_stores_history(tmp_path: Path) -> None:
    """``solve-round --state --policy tiresias``: the job that had 22 GPU-hours waits."""
    import json

    import yaml
    from typer.testing import CliRunner

    from apportion.cli import app

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "hist", "node_groups": [
        {"prefix": "a", "count": 2, "gpu_type": "A100-40GB", "gpus_per_node": 8, "cpus_per_node": 64,
         "host_memory_gib": 512}]}))
    import time

    db = tmp_path / "s.db"
    t0 = time.time() - 5001.0  # the store's clock is wall time: history ends about now
    store = open_store(db, create=True)
    try:
        store.submit([JobSpec("old", "bert-336m", 64, 10**6, 16, submit_time_s=t0)], at=t0)
        _commit(store, [_alloc("old", 16, Action.START)], t0 + 1.0)
        store.submit([JobSpec("new", "bert-336m", 64, 10**6, 16, submit_time_s=t0 + 4990.0)],
                     at=t0 + 4990.0)
        _commit(store, [], t0 + 5000.0, preempted=("old",), waiting=("new",))
    finally:
        store.close()
    r = CliRunner().invoke(app, ["solve-round", "--state", str(db), "--cluster",
                                 str(tmp_path / "c.yaml"), "--policy", "tiresias", "--json",
                                 str(tmp_path / "d.json"), "--time-budget", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "d.json").read_text())
    assert [a["job"] for a in d["allocations"]] == ["new"], d


def test_finished_jobs_are_what_the_tail_is_ranked_against(tmp_path: Path) -> None:
    """``finished_jcts`` reads each finished job's JCT from the store; given to a round as
    ``seen_jct`` it is the memory apportion's ``tail_quantile`` ranks against: long finished
    jobs put none of the round's jobs in the tail, short ones all, none the round's own."""
    from dataclasses import replace

    from apportion.formulations.candidates import CandidateOptions
    from apportion.formulations.schema import job_node

    from apportion.store_history import finished_jcts

    store = open_store(tmp_path / "s.db", create=True)
    try:
        store.submit([JobSpec("done", "bert-336m", 64, 100, 8, submit_time_s=50.0)], at=50.0)
        _commit(store, [_alloc("done", 8, Action.START)], 60.0)
        store.record_progress("done", 40, 3000.0)
        assert finished_jcts(store) == {}  # still running
        store.record_progress("done", 100, 7250.0)
        assert finished_jcts(store) == {"done": pytest.approx(7200.0)}
    finally:
        store.close()
    jobs = [JobSpec(f"j{i}", "bert-336m", 64, 2000 * 10 ** i, 8, submit_time_s=0.0)
            for i in range(3)]
    opts = replace(CandidateOptions(), tail_share=None, tail_quantile=0.5)
    cfg = RoundConfig(time_budget_s=2.0, isolate=False, candidates=opts)
    tails = {}
    for name, seen in (("none", None), ("long", {f"f{i}": 1e12 for i in range(10)}),
                       ("short", {f"f{i}": 1.0 for i in range(10)})):
        res = run_round(CLUSTER, jobs, 600.0, cfg, seen_jct=seen)
        assert validate(res.decision, CLUSTER, jobs).ok
        tails[name] = {j.id for j in jobs if res.graph.nodes[job_node(j.id)]["tail"]}
    assert tails["none"] == {"j1", "j2"}  # the median of the round's three and above
    assert tails["long"] == set()
    assert tails["short"] == {"j0", "j1", "j2"}
