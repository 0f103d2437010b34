"""A deterministic solve budget: work, not the clock, decides when a backend stops.

HiGHS stopping on the wall clock made two replays of one row differ by 1-4 s in the mean
(experiments/results/quality, session 20): the rounds whose incumbent stalled stopped at
different points. With ``work_s`` the same model gets the same answer whatever the time
limit, the machine or its load; the clock is only a safety stop, and a run it cut short
says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.policies import FormulationPolicy, RoundConfig
from apportion.solvers.base import WORK_PER_S, Status
from apportion.solvers.chain import backends_for, solve_chain
from apportion.solvers.highs import HighsBackend
from tests.test_highs_stall import markshare

runner = CliRunner()
SLACK_CALLS = 10


def _solve(model_seed: int, work_s: float, limit_s: float) -> tuple[np.ndarray, float, str]:
    model = markshare(4, 30, model_seed)
    be = HighsBackend(stall_share=0.25)
    be.work_s = work_s
    res = be.solve(model, limit_s)
    assert res.x is not None and model.is_feasible(res.x)
    assert res.extra["time_limited"] is False
    # it stops within a few callbacks' work of its budget (one costs the model's width;
    # HiGHS reads the interrupt at its next check, a callback or two later)
    assert res.extra["work_s"] <= work_s + SLACK_CALLS * model.num_vars / WORK_PER_S
    return np.asarray(res.x), float(res.extra["work_s"]), res.message


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.05, 0.1, 0.2]))
def test_the_same_work_budget_gives_the_same_answer_whatever_the_time_limit(
        seed: int, work_s: float) -> None:
    # a clock-based stall window scales with the time limit (stall_share x limit): these
    # two runs would stop at different points; a work-based one stops at the same
    x1, w1, m1 = _solve(seed, work_s, 20.0)
    x2, w2, m2 = _solve(seed, work_s, 60.0)
    assert np.array_equal(x1, x2)
    assert w1 == w2
    assert m1 == m2


def test_work_stops_a_search_that_would_run_on() -> None:
    model = markshare(5, 40, 3)  # never closed in seconds: only the budget stops it
    be = HighsBackend()  # no stall rule: the work cap alone
    be.work_s = 0.05
    res = be.solve(model, 30.0)
    if res.status is Status.OPTIMAL:  # a perfect split found at once (rare)
        return
    assert "its work budget of 0.05 s was spent" in res.message
    assert res.wall_s < 30.0


def test_a_chain_with_a_work_budget_repeats_and_accounts_for_it() -> None:
    runs = []
    for limit in (20.0, 40.0):
        model = markshare(5, 40, 11)
        best, attempts = solve_chain(model, backends_for("auto", gap=1e-3), limit,
                                     gap=1e-3, work_s=0.3)
        assert best is not None and model.is_feasible(best.x)
        ran = [a for a in attempts if "work_s" in a.extra]
        assert ran, [a.as_dict() for a in attempts]
        assert sum(a.extra["work_s"] for a in ran) <= 0.3 + SLACK_CALLS * model.num_vars / WORK_PER_S
        assert all("work_s" in a.as_dict() for a in ran)  # reported with the attempt
        runs.append((best.backend, np.asarray(best.x), [a.message for a in attempts]))
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]


def test_isolated_backends_cannot_take_a_work_budget() -> None:
    model = markshare(3, 10, 0)
    with pytest.raises(ValueError, match="isolated backends cannot take one"):
        solve_chain(model, backends_for("highs", isolate=True), 5.0, work_s=1.0)
    with pytest.raises(ValueError, match="cannot be combined with isolate"):
        FormulationPolicy(RoundConfig(deterministic=True, isolate=True))


def test_a_deterministic_replay_repeats_and_says_it_was(tmp_path: Path) -> None:
    outs = []
    for i in range(2):
        js, csv = tmp_path / f"s{i}.json", tmp_path / f"j{i}.csv"
        r = runner.invoke(app, ["simulate", "--trace", "synthetic:40", "--cluster",
                                "crius-testbed", "--policy", "apportion", "--deterministic",
                                "--json", str(js), "--jobs-csv", str(csv)])
        assert r.exit_code == 0, r.output
        summary = json.loads(js.read_text())
        assert summary["deterministic"] is True
        assert summary["rounds_time_limited"] == 0
        outs.append((summary["avg_jct_s"], csv.read_text()))
    assert outs[0] == outs[1]


def test_a_deterministic_round_solves_under_its_work_budget() -> None:
    from apportion.policies import make_policy
    from apportion.experiments.simulator import deterministic_policy

    pol = make_policy("apportion")
    assert pol.cfg.deterministic is False  # the default: the clock, as operators run it
    deterministic_policy(pol)
    assert pol.cfg.deterministic is True
    deterministic_policy(make_policy("sia"))  # a baseline without a round config: unchanged


@pytest.mark.parametrize("parts", [[], ["--partitions", "2"], ["--partitions", "3"]])
def test_solve_round_deterministic_repeats_and_refuses_what_leaves_the_process(
        tmp_path: Path, parts: list[str]) -> None:
    """`solve-round --deterministic`: the same decision twice, byte for byte but the timings,
    whole or in POP's parts (each part's chain with its share of the work, in its own
    worker); with --isolate (a chain child on the clock) it exits 2 naming the flag."""
    decisions = []
    for i in range(2):
        out = tmp_path / f"d{i}.json"
        r = runner.invoke(app, ["solve-round", "--deterministic", "--time-budget", "5",
                                *parts, "--json", str(out)])
        assert r.exit_code == 0, r.output
        d = json.loads(out.read_text())
        decisions.append((d["allocations"], d["pending"], d["solver"]["objective"],
                          [(a["backend"], a["status"], a.get("work_s"))
                           for a in d["solver"]["attempts"]]))
        if parts:
            pop = d["solver"]["attempts"][0]
            assert pop["backend"] == f"pop-{parts[1]}" and pop["time_limited"] is False
            share = 5.0 / int(parts[1])
            assert f"deterministic: {share:.3g} s of work a part" in pop["message"]
    assert decisions[0] == decisions[1]
    if not parts:  # a partitioned solve has no chain child: --isolate changes nothing there
        r = runner.invoke(app, ["solve-round", "--deterministic", "--isolate"])
        assert r.exit_code == 2 and "--isolate" in r.output, r.output


def test_a_deterministic_partitioned_solve_is_the_same_on_one_worker_or_many() -> None:
    """The parts' answers are combined in the parts' order, never in the order they
    finish: one worker (parts in turn) and three (in parallel) give the same answer."""
    from apportion.formulations.candidates import build_candidates
    from apportion.formulations.cells import build_cells_model
    from apportion.solvers.partition import LocalEngine, solve_partitioned

    from apportion.cluster import Cluster, NodeGroup
    from apportion.jobs import JobSpec

    cl = Cluster("det", [NodeGroup("a100", 6, "A100-40GB", 4),
                         NodeGroup("a40", 8, "A40", 2, intra_node_link="pcie")])
    js = [JobSpec(f"j{i}", ["bert-0.76b", "wresnet-0.5b", "moe-0.69b"][i % 3], 256,
                  1000 + 37 * i, [1, 2, 4, 8][i % 4], submit_time_s=float(i))
          for i in range(40)]
    g = build_candidates(cl, js, 100.0)
    answers = []
    for workers in (1, 3):
        eng = LocalEngine(workers).start()
        try:
            best, attempts = solve_partitioned(g, build_cells_model(g), 3, build_cells_model,
                                               eng, 120.0, work_s=3.0)
        finally:
            eng.close()
        assert best is not None and best.extra["time_limited"] is False
        answers.append((sorted((c.job, c.cell, tuple(sorted(c.placement.items())))
                               for c in best.extra["choices"]), best.objective, best.bound,
                        [p.get("work_s") for p in best.extra["parts"]]))
    assert answers[0] == answers[1]


def test_work_columns_charge_each_callback_as_that_many_columns() -> None:
    """A restricted MIP is charged as the model it restricts (``work_columns``): the same
    work budget then stops it after the same number of HiGHS's callbacks."""
    model = markshare(5, 40, 3)
    runs = {}
    for width in (None, 50 * model.num_vars):
        be = HighsBackend()
        be.work_s = 0.05
        be.work_columns = width
        res = be.solve(model, 30.0)
        if res.status is Status.OPTIMAL:  # a perfect split found at once (rare)
            return
        runs[width] = res.extra["work_s"]
        assert "its work budget of 0.05 s was spent" in res.message
        # every callback charged as `width` columns: the budget spent within a few of them
        assert res.extra["work_s"] <= 0.05 + SLACK_CALLS * (width or model.num_vars) / WORK_PER_S
    assert len(runs) == 2
