"""The objective stated as one quantity (kind ``seconds``, preset ``seconds``): the JCT
seconds a job saves on a cell this round, in rounds, weighed by one fairness exponent and
net of a move's restart; reached through the library, every policy that takes apportion's
objective, and ``--objective-preset`` on the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from apportion.formulations.objectives import PRESETS, ObjectiveOptions, _terms, apply_objective
from apportion.formulations.schema import job_node
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli.app import app
from apportion.cli.complete import objective_presets
from apportion.jobs import JobSpec, RunningState

REF = 64 * 1000 / 3600.0  # one hour of work at the reference rate


def _graph(cells: dict[str, dict[str, float]], jobs: list[JobSpec],
           current: dict[str, str] | None = None) -> nx.DiGraph:
    g = nx.DiGraph()
    for j, by_type in cells.items():
        g.add_node(job_node(j), kind="job", ref_throughput=REF)
        for t, n in by_type.items():
            g.add_node(f"{j}:{t}", kind="cell", job=j, est_throughput=n * REF, normalized=n,
                       current=(current or {}).get(j) == t, bonus=0.0)
            g.add_edge(job_node(j), f"{j}:{t}")
    return g


def _job(j: str, iterations: int = 1000, done: int = 0, running: bool = False) -> JobSpec:
    return JobSpec(j, "bert-336m", 64, iterations, 4, submit_time_s=0.0, iterations_done=done,
                   running=RunningState("fast", 4, 1, {"n0": 4}) if running else None)


def test_a_cell_is_worth_the_share_of_its_best_speed_so_the_job_losing_more_seconds_keeps_the_fast_type() -> None:
    """X runs 9x the reference on the fast type and 7.5x on the slow one (it loses 17 % of
    its round's JCT seconds on the slow type); Y 3x and 1.7x (43 %). X can finish sooner
    (its weight is larger: sqrt(3) times Y's), yet Y loses more seconds on the slow type
    and keeps the fast one."""
    jobs = [_job("X"), _job("Y")]
    g = _graph({"X": {"fast": 9.0, "slow": 7.5}, "Y": {"fast": 3.0, "slow": 1.7}}, jobs)
    apply_objective(g, jobs, 0.0, ObjectiveOptions.preset("seconds"))
    w = {j: g.nodes[job_node(j)]["jct_weight"] for j in "XY"}
    assert w["X"] == pytest.approx(w["Y"] * 3.0 ** 0.5)
    for j, fast, slow in (("X", 9.0, 7.5), ("Y", 3.0, 1.7)):
        assert g.nodes[f"{j}:fast"]["value"] == pytest.approx(w[j])  # a whole round saved
        assert g.nodes[f"{j}:slow"]["value"] == pytest.approx(w[j] * slow / fast)
    lost = {j: g.nodes[f"{j}:fast"]["value"] - g.nodes[f"{j}:slow"]["value"] for j in "XY"}
    assert lost["Y"] > lost["X"]


def test_with_speed_bounds_speed_beyond_the_reference_takes_the_speed_weight() -> None:
    """``speed_bounds`` splits a cell's seconds at the reference rate's share: running at
    all (up to 1 / n_best of a round) by the fairness weight, the rest by the narrower
    speed weight, so a long job (small fairness weight) still values its fast type's extra
    speed near its own seconds; without them both parts take the fairness weight."""
    jobs = [_job("L", iterations=20000), _job("S", iterations=500), _job("T", iterations=500)]
    cells = {"L": {"fast": 4.0, "ref": 1.0, "slow": 0.5}, "S": {"fast": 4.0, "ref": 1.0},
             "T": {"fast": 4.0}}
    g = _graph(cells, jobs)
    apply_objective(g, jobs, 0.0, ObjectiveOptions.preset("seconds", speed_bounds=(0.7, 1.4)))
    w = g.nodes[job_node("L")]["jct_weight"]
    v = g.nodes[job_node("L")]["speed_weight"]
    assert w < 0.7 == pytest.approx(v)  # the long job: a small weight, the speed floor
    assert g.nodes["L:fast"]["value"] == pytest.approx(w * 0.25 + v * 0.75)
    assert g.nodes["L:ref"]["value"] == pytest.approx(w * 0.25)
    assert g.nodes["L:slow"]["value"] == pytest.approx(w * 0.125)
    plain = _graph(cells, jobs)
    apply_objective(plain, jobs, 0.0, ObjectiveOptions.preset("seconds"))
    wp = plain.nodes[job_node("L")]["jct_weight"]
    assert plain.nodes["L:fast"]["value"] == pytest.approx(wp)


def test_speed_from_the_slowest_cell_weighs_every_difference_between_cells_as_speed() -> None:
    """``speed_from="slowest"``: only the job's slowest cell's share is running at all (the
    fairness weight); what any faster cell adds is speed (the speed weight), so a long
    job's fast type is worth its own seconds below the reference rate too."""
    jobs = [_job("L", iterations=20000), _job("S", iterations=500), _job("T", iterations=500)]
    cells = {"L": {"fast": 4.0, "ref": 1.0, "slow": 0.5}, "S": {"fast": 4.0}, "T": {"fast": 4.0}}
    g = _graph(cells, jobs)
    apply_objective(g, jobs, 0.0, ObjectiveOptions.preset(
        "seconds", speed_bounds=(0.7, 1.4), speed_from="slowest"))
    w = g.nodes[job_node("L")]["jct_weight"]
    v = g.nodes[job_node("L")]["speed_weight"]
    assert g.nodes["L:slow"]["value"] == pytest.approx(w * 0.125)
    assert g.nodes["L:ref"]["value"] == pytest.approx(w * 0.125 + v * 0.125)
    assert g.nodes["L:fast"]["value"] == pytest.approx(w * 0.125 + v * 0.875)
    with pytest.raises(ValueError, match="speed_from"):
        ObjectiveOptions.preset("seconds", speed_from="fastest")


def test_a_job_saves_at_most_the_time_it_has_left() -> None:
    """A job with 60 s left on its best cell saves 60 s of a 300-s round there (0.2 of a
    round), and on a cell half as fast 150 s of its work is still more than it has: also
    60 s; on a cell 20x slower, 0.05 of a round."""
    short = _job("S", iterations=1000, done=1000 - 25)  # 90 s at the reference, 60 s (floor) at n = 10
    jobs = [short]
    g = _graph({"S": {"fast": 10.0, "half": 5.0, "slow": 0.5}}, jobs)
    opt = ObjectiveOptions.preset("seconds", round_s=300.0)
    apply_objective(g, jobs, 0.0, opt)
    soon = g.nodes[job_node("S")]["soonest_s"]
    w = g.nodes[job_node("S")]["jct_weight"]
    assert soon == pytest.approx(60.0)
    assert g.nodes["S:fast"]["value"] == pytest.approx(w * 0.2)
    assert g.nodes["S:half"]["value"] == pytest.approx(w * 0.2)
    assert g.nodes["S:slow"]["value"] == pytest.approx(w * 0.05)


def test_with_the_wait_credit_a_job_ending_within_the_round_saves_the_round_it_would_wait() -> None:
    """``finish_credit="wait"``: the same job (60 s left at its best, R = 0.2 of a round)
    ends 300 s sooner by starting now on its best cell (a whole round), 300 - 60 s on the
    half-speed cell (1 + R - R / s = 0.8 of a round), and on the cell 20x slower, which
    it cannot finish on this round, its work alone (0.05)."""
    short = _job("S", iterations=1000, done=1000 - 25)
    jobs = [short]
    g = _graph({"S": {"fast": 10.0, "half": 5.0, "slow": 0.5}}, jobs)
    apply_objective(g, jobs, 0.0, ObjectiveOptions.preset("seconds", round_s=300.0,
                                                          finish_credit="wait"))
    w = g.nodes[job_node("S")]["jct_weight"]
    assert g.nodes["S:fast"]["value"] == pytest.approx(w * 1.0)
    assert g.nodes["S:half"]["value"] == pytest.approx(w * 0.8)
    assert g.nodes["S:slow"]["value"] == pytest.approx(w * 0.05)
    assert g.graph["objective"]["finish_credit"] == "wait"
    with pytest.raises(ValueError, match="finish_credit"):
        ObjectiveOptions.preset("seconds", finish_credit="all")


@settings(max_examples=60, deadline=None)
@given(left=st.floats(0.01, 3.0), share=st.floats(0.01, 1.0))
def test_the_wait_credit_is_continuous_and_never_below_the_work(left: float, share: float) -> None:
    """Where the job just ends within the round (R = s) both credits are s; below, the wait
    credit is at least the work credited (R) and at most a round; above, both are s."""
    js = {"n_best": 1.0, "soon_rounds": left, "n_floor": 1.0, "weight": 1.0,
          "speed_weight": 1.0}
    d = {"normalized": share}
    wait = _terms("seconds", d, js, {"round_excess": 0.0, "finish_wait": True})
    work = _terms("seconds", d, js, {"round_excess": 0.0, "finish_wait": False})
    assert work == pytest.approx(min(share, left))
    assert work - 1e-12 <= wait <= 1.0 + 1e-12
    if left >= share:
        assert wait == pytest.approx(share)

@settings(max_examples=40, deadline=None)
@given(restart=st.floats(0.0, 600.0), round_s=st.floats(60.0, 3600.0),
       alpha=st.sampled_from([0.0, 0.5, 1.0]))
def test_a_move_nets_its_restart_seconds_and_one_exponent_orders_the_jobs(
        restart: float, round_s: float, alpha: float) -> None:
    """A running job's move keeps (1 - restart_s / round_s) of the seconds it saves (none
    past a whole round); its own cell loses nothing; the weight is (median / soonest) **
    alpha, so a job with less left never weighs less."""
    jobs = [_job("R", running=True), _job("Q", iterations=250)]
    g = _graph({"R": {"fast": 4.0, "other": 3.0}, "Q": {"fast": 4.0, "other": 3.0}}, jobs,
               current={"R": "fast"})
    opt = ObjectiveOptions.preset("seconds", restart_s=restart, round_s=round_s,
                                  remaining_exponent=alpha)
    apply_objective(g, jobs, 0.0, opt)
    w = {j: g.nodes[job_node(j)]["jct_weight"] for j in "RQ"}
    assert w["Q"] >= w["R"]
    if alpha == 0.0:
        assert w["Q"] == pytest.approx(w["R"])
    assert g.nodes["R:fast"]["value"] == pytest.approx(g.nodes["R:fast"]["term"])
    kept = max(0.0, 1.0 - restart / round_s)
    assert g.nodes["R:other"]["value"] == pytest.approx(g.nodes["R:other"]["term"] * kept)
    assert g.nodes["Q:other"]["value"] == pytest.approx(g.nodes["Q:other"]["term"])


runner = CliRunner()


def test_every_preset_is_a_door_on_solve_round_and_completes(tmp_path: Path) -> None:
    """``solve-round --objective-preset NAME`` for every named objective: a validated
    decision; the names complete and an unknown one exits 2 naming the flag."""
    assert [n for n, _ in objective_presets("")] == sorted(PRESETS)
    assert [n for n, _ in objective_presets("sec")] == ["seconds"]
    for name in PRESETS:
        out = tmp_path / f"{name}.json"
        res = runner.invoke(app, ["solve-round", "--objective-preset", name, "--deterministic",
                                  "--json", str(out)])
        assert res.exit_code == 0, res.output
        decision = json.loads(out.read_text())
        assert decision["allocations"], name
    res = runner.invoke(app, ["solve-round", "--objective-preset", "minutes"])
    assert res.exit_code == 2 and "objective-preset" in res.output
