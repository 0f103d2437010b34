"""Issue 42 item 4 (first part): the objective's round length and restart cost are the
round's (the view's ``interval_s`` and ``restart_s``), unless the user set them; one
``ObjectiveOptions`` nested in the candidate and plan options, with named presets.
No test reads the wall clock."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.formulations.candidates import CandidateOptions
from apportion.formulations.objectives import (
    CELLS_ONLY,
    PRESETS,
    RESTART_S,
    ROUND_S,
    FromRound,
    ObjectiveOptions,
    from_round,
)
from apportion.formulations.plans import PlanOptions
from apportion.formulations.sla import SlaOptions
from apportion.policies import RoundConfig, make_policy, objective_policies, run_round
from apportion.policies.formulation import FormulationPolicy, round_figures
from apportion.policies.scheduler import policy_for
from test_quality_objective import _scale_or_place
from test_sim_properties import small_cluster

from apportion.cli.round_config import RoundFlags, round_config
from apportion.errors import InputError
from apportion.view import View


def _objective_of(res: object) -> dict:
    return res.graph.graph["objective"]  # type: ignore[attr-defined]


def test_a_round_of_360_s_is_the_objectives_round() -> None:
    """A FormulationPolicy under a 360-s view whose restarts cost 78 s charges those."""
    cl, jobs = _scale_or_place()
    res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, backend="highs"),
                    interval_s=360.0, restart_s=78.0)
    obj = _objective_of(res)
    assert (obj["round_s"], obj["restart_s"]) == (360.0, 78.0)
    assert (obj["round_s_from"], obj["restart_s_from"]) == ("round", "round")


def test_a_figure_the_user_set_wins_over_the_rounds() -> None:
    cl, jobs = _scale_or_place()
    opts = CandidateOptions(round_s=300.0, restart_s=45.0)
    res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, backend="highs",
                                                 candidates=opts),
                    interval_s=360.0, restart_s=78.0)
    obj = _objective_of(res)
    assert (obj["round_s"], obj["restart_s"]) == (300.0, 45.0)
    assert (obj["round_s_from"], obj["restart_s_from"]) == ("user", "user")
    # one set, one from the round
    res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, backend="highs",
                                                 candidates=CandidateOptions(restart_s=0.0)),
                    interval_s=360.0, restart_s=78.0)
    assert (_objective_of(res)["round_s"], _objective_of(res)["restart_s"]) == (360.0, 0.0)


def test_a_one_off_round_keeps_300_and_60_s() -> None:
    """solve-round with no history: the figures the objective always had."""
    cl, jobs = _scale_or_place()
    res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, backend="highs"))
    obj = _objective_of(res)
    assert (obj["round_s"], obj["restart_s"]) == (300.0, 60.0)
    assert CandidateOptions().round_s == 300.0 and CandidateOptions().restart_s == 60.0
    assert from_round(CandidateOptions().round_s) and from_round(None)
    assert not from_round(300.0)
    # None asks for the round's figure explicitly: with no round, the same 300 / 60 s
    res = run_round(cl, jobs, 600.0, RoundConfig(time_budget_s=5.0, backend="highs",
                                                 candidates=CandidateOptions(round_s=None,
                                                                             restart_s=None)))
    assert (_objective_of(res)["round_s"], _objective_of(res)["restart_s"]) == (300.0, 60.0)


def test_round_figures_fill_the_candidates_the_plans_and_the_sla_grace() -> None:
    cl, jobs = _scale_or_place()
    view = View(0.0, cl, [], rates=None, interval_s=60.0, restart_s=30.4)
    cfg = RoundConfig(plan_options=PlanOptions(), sla_options=SlaOptions())
    got = round_figures(cfg, view)
    assert (got.candidates.round_s, got.candidates.restart_s) == (60.0, 30.4)
    assert (got.plan_options.round_s, got.plan_options.restart_s) == (60.0, 30.4)
    assert got.sla_options.round_s == 60.0
    assert isinstance(got.candidates.round_s, FromRound)  # the next round sets it again
    again = round_figures(got, View(0.0, cl, [], rates=None, interval_s=360.0))
    assert (again.candidates.round_s, again.candidates.restart_s) == (360.0, 30.4)
    assert cfg.candidates.round_s == 300.0  # the configured options are not changed
    # a view that knows no restart cost leaves the objective's own
    plain = round_figures(RoundConfig(), View(0.0, cl, [], rates=None))
    assert (plain.candidates.round_s, plain.candidates.restart_s) == (300.0, 60.0)
    user = RoundConfig(candidates=CandidateOptions(round_s=120.0),
                       sla_options=SlaOptions(round_s=120.0))
    kept = round_figures(user, view)
    assert kept.candidates.round_s == 120.0 and kept.sla_options.round_s == 120.0
    assert kept.candidates.restart_s == 30.4


def test_the_simulator_gives_its_interval_and_restart_cost_to_the_policy() -> None:
    """A replay's rounds: the FormulationPolicy charges the simulator's own figures."""
    cl = small_cluster()
    jobs = [tr.SimJob(f"j{i}", 0.0, 2, 400.0, "bert-0.76b", model="bert-0.76b", batch=256)
            for i in range(2)]
    pol = make_policy("apportion", backend="highs", deterministic=True)
    seen: list[tuple[float, float]] = []
    candidates = pol.candidates

    def spy(view: View):  # type: ignore[no-untyped-def]
        g = candidates(view)
        seen.append((g.graph["objective"]["round_s"], g.graph["objective"]["restart_s"]))
        return g

    pol.candidates = spy  # type: ignore[method-assign]
    sim = Simulator(cl, tr.Trace("figures", jobs), pol, AnalyticTruth(cl),
                    SimConfig(information="oracle", interval_s=360.0, restart_cost_s=78.0,
                              jct_bound=False))
    assert sim.run().summary["finished"] == 2
    assert seen and set(seen) == {(360.0, 78.0)}
    assert isinstance(pol, FormulationPolicy) and pol.cfg.candidates.round_s == 360.0


def test_the_deadline_formulation_charges_the_rounds_restart() -> None:
    cl, jobs = _scale_or_place()
    cfg = RoundConfig(time_budget_s=5.0, backend="highs", formulation="deadline")
    res = run_round(cl, jobs, 600.0, cfg, interval_s=360.0, restart_s=78.0)
    assert _objective_of(res)["restart_s"] == 78.0
    pol = policy_for(cfg)
    view = View(0.0, cl, [], rates=None, interval_s=360.0, restart_s=78.0)
    assert round_figures(pol.cfg, view).candidates.objective.restart_s_value == 78.0


def test_the_presets_construct_and_differ_where_documented() -> None:
    crius, sia, ours = (ObjectiveOptions.preset(n) for n in ("crius", "sia-like", "apportion"))
    assert set(PRESETS) == {"crius", "sia-like", "apportion", "jct-aware", "seconds"}
    assert crius == ObjectiveOptions()  # Crius's objective is the objective's default
    assert (crius.kind, crius.normalize, crius.place_bonus, crius.keep_bonus,
            crius.amortize_s) == ("normalized", "requested", 0.0, 0.3, None)
    assert (sia.kind, sia.normalize, sia.place_bonus, sia.keep_bonus, sia.amortize_s) == (
        "normalized", "least-efficient", 1.0, 0.0, None)
    assert ours == CandidateOptions().objective  # apportion's default
    # one quantity in seconds, a finishing job credited its wait, and two further terms
    assert (ours.kind, ours.finish_credit, ours.amortize_s, ours.speed_bounds) == (
        "seconds", "wait", 1800.0, (0.7, 1.4))
    assert (ours.place_bonus, ours.keep_bonus, ours.queue_weight, ours.tail_share) == (
        0.0, 0.0, 0.0, None)
    tuned = ObjectiveOptions.preset("jct-aware")  # the default before it, kept by name
    assert (tuned.kind, tuned.speed_unit, tuned.tail_share) == ("jct-aware",
                                                                "best-outside-tail", 0.1)
    assert len({crius, sia, ours, tuned}) == 4
    for p in PRESETS.values():  # every preset reads its figures from the round
        assert from_round(p.round_s) and from_round(p.restart_s)
    assert ObjectiveOptions.preset("crius", keep_bonus=0.1).keep_bonus == 0.1
    with pytest.raises(ValueError, match="unknown objective preset"):
        ObjectiveOptions.preset("gavel")


def test_the_objective_is_nested_and_every_flat_keyword_still_works() -> None:
    default = CandidateOptions()
    tuned = CandidateOptions(objective=ObjectiveOptions.preset("jct-aware"))
    assert isinstance(default.objective, ObjectiveOptions)
    assert default.objective == "seconds"  # compares with its kind's name, as it did
    assert tuned.objective == "jct-aware"
    flat = CandidateOptions(objective="normalized", keep_bonus=0.3, normalize="requested",
                            place_bonus=0.0, amortize_s=None)
    assert flat.objective.kind == "normalized" and flat.keep_bonus == 0.3
    assert flat.speed_bounds == (0.7, 1.4)  # the kind over apportion's other knobs
    nested = CandidateOptions(objective=ObjectiveOptions.preset("crius"), scales=(1.0,))
    assert nested.normalize == "requested" and nested.scales == (1.0,)
    assert replace(default, keep_bonus=0.5).keep_bonus == 0.5
    assert replace(default, keep_bonus=0.5).objective.keep_bonus == 0.5
    assert default.updated(objective="jct", keep_bonus=0.1).objective.kind == "jct"
    assert default.updated(objective="jct").speed_bounds == (0.7, 1.4)
    assert tuned.updated(objective="jct").tail_share == 0.1
    assert hash(default) == hash(CandidateOptions())  # the candidate cache keys on it
    assert pickle.loads(pickle.dumps(default)) == default  # isolated chains, workers
    assert isinstance(pickle.loads(pickle.dumps(ROUND_S)), FromRound)
    assert (float(ROUND_S), float(RESTART_S)) == (300.0, 60.0)
    with pytest.raises(TypeError, match="unexpected"):
        CandidateOptions(nope=1)
    with pytest.raises(ValueError, match="round_s"):
        CandidateOptions(round_s=0.0)
    # the plans take the candidates' objective but the cells formulation's own knobs
    assert PlanOptions.like(default).objective.kind == "seconds"
    plans = PlanOptions.like(tuned)
    assert plans.objective.kind == "jct-aware" and plans.speed_unit == "best-outside-tail"
    assert all(getattr(plans, k) == getattr(ObjectiveOptions(), k) for k in CELLS_ONLY)
    assert PlanOptions().objective == ObjectiveOptions()
    assert PlanOptions.like(tuned, objective="jct").normalize == "least-efficient"


def test_the_preset_reaches_the_round_config_and_apportions_policies() -> None:
    cfg = round_config(RoundFlags(objective_preset="crius", isolate=False), 0.0)
    assert cfg.candidates.objective == ObjectiveOptions.preset("crius")
    assert cfg.candidates.scales == CandidateOptions().scales
    with pytest.raises(InputError, match="objective-preset"):
        round_config(RoundFlags(objective_preset="nope", isolate=False), 0.0)
    with pytest.raises(InputError, match="objective-preset"):
        round_config(RoundFlags(policy="sia", objective_preset="crius", isolate=False), 0.0)
    pol = make_policy("apportion-plans", objective=ObjectiveOptions.preset("sia-like"))
    assert pol.cfg.candidates.objective == ObjectiveOptions.preset("sia-like")
    assert "crius-greedy" not in objective_policies() and "apportion" in objective_policies()
    # crius-greedy, a baseline, keeps the figures it was measured with
    greedy = make_policy("crius-greedy").cfg.candidates
    assert (greedy.round_s, greedy.restart_s) == (300.0, 60.0)
    assert not from_round(greedy.round_s)


def test_runs_loop_charges_the_restart_its_executor_measured() -> None:
    """``run``/``serve``: the restart the objective charges is the median decision-to-first-
    iteration of the executor's launches (each launch once), none before one reports."""
    from apportion.runtime.executors.executor import Health, Progress
    from apportion.runtime.loop import RestartMeter

    meter = RestartMeter()
    assert meter.seconds() is None
    meter.observe([Progress("a", 3, 10, Health.RUNNING, reconfig_overhead_s=4.0, launch_id="1"),
                   Progress("b", 0, 10, Health.STARTING, launch_id="1")])
    assert meter.seconds() == 4.0
    meter.observe([Progress("a", 5, 10, Health.RUNNING, reconfig_overhead_s=4.0, launch_id="1"),
                   Progress("a", 6, 10, Health.RUNNING, reconfig_overhead_s=10.0, launch_id="2"),
                   Progress("b", 1, 10, Health.RUNNING, reconfig_overhead_s=6.0, launch_id="1")])
    assert meter.seconds() == 6.0  # 4, 10, 6: a launch seen twice counts once
