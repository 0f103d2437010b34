"""The greedy's answer is a floor: a backend answer worse than it (an LP rounding the clock
stopped HiGHS from improving) neither replaces the hint the next backend starts from nor
becomes the round's answer."""

from __future__ import annotations

import numpy as np
import pytest
from apportion.formulations.candidates import build_candidates
from apportion.formulations.cells import build_cells_model, hint_from_choices
from apportion.solvers.base import Backend, SolveResult, Status
from apportion.solvers.chain import solve_chain
from apportion.solvers.greedy import GreedyCells
from apportion.validator import validate

import apportion.policies.formulation as round_mod
from apportion.config import cluster_from_data, jobs_from_data
from apportion.policies import RoundConfig, run_round


class ZeroBackend(Backend):
    """A backend whose (feasible) answer places nothing: worse than any greedy answer."""

    name = "zero"

    def solve(self, model, time_limit_s):  # type: ignore[no-untyped-def]
        return SolveResult(self.name, Status.FEASIBLE, x=np.zeros(model.num_vars),
                           objective=model.objective_value(np.zeros(model.num_vars)))


def _round() -> tuple:
    cl = cluster_from_data({"node_groups": [
        {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4},
        {"prefix": "a10", "count": 2, "gpu_type": "A10", "gpus_per_node": 4}]}, "test")
    jobs, now = jobs_from_data({"jobs": [
        {"id": f"j{i}", "model": m, "global_batch_size": 128, "iterations": 1000,
         "requested_gpus": n, "submit_time_s": 60 * i}
        for i, (m, n) in enumerate([("bert-0.76b", 2), ("bert-1.3b", 4), ("moe-0.69b", 4),
                                    ("wresnet-1b", 4)])]}, "test")
    return cl, jobs, now


def _greedy_made_before_the_chain(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for each round formulated, whether the greedy's answer was made before the
    chain (its hint) or left for after it."""
    made: list[bool] = []
    real_formulate = round_mod.FormulationPolicy.formulate

    def formulate(self, view, g, full=False):  # type: ignore[no-untyped-def]
        f = real_formulate(self, view, g, full)
        made.append(f.greedy_choices is not None)
        return f

    monkeypatch.setattr(round_mod.FormulationPolicy, "formulate", formulate)
    return made


def test_a_worse_answer_does_not_replace_the_greedy_hint() -> None:
    cl, jobs, now = _round()
    g = build_candidates(cl, jobs, now)
    model = build_cells_model(g)
    choices, obj, _ = GreedyCells(0).solve(g)
    assert obj > 0
    hint = hint_from_choices(model, choices)
    model.set_hint(hint)
    best, attempts = solve_chain(model, [ZeroBackend()], 10.0)
    assert best is not None and best.objective is not None and best.objective < obj
    assert model.hint == hint  # the next backend would still start from the greedy's answer


def test_the_round_takes_the_greedy_when_the_backends_did_worse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cl, jobs, now = _round()
    real = round_mod.solve_chain
    monkeypatch.setattr(round_mod, "solve_chain",
                        lambda model, backends, *a, **kw: real(model, [ZeroBackend()], *a, **kw))
    res = run_round(cl, jobs, now, RoundConfig(time_budget_s=10.0, isolate=False))
    rep = res.decision.report
    assert rep.backend == "greedy" and not rep.fallback, rep
    assert "worse than the greedy" in rep.fallback_reason
    assert rep.objective is not None and rep.objective > 0
    assert len(res.decision.allocations) > 0
    assert validate(res.decision, cl, jobs).ok


def test_a_large_round_without_a_hint_still_never_answers_worse_than_the_greedy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A large round's chain runs without the greedy (LP rounding needs no hint). When LP
    rounding fails and HiGHS ends on an early incumbent that stops nearly every running job
    (Philly day 1's burst under load), the greedy is made after the chain and must win."""
    cl, jobs, now = _round()
    monkeypatch.setattr(round_mod, "LARGE_MODEL_COLUMNS", 0)  # every model is "large"
    made = _greedy_made_before_the_chain(monkeypatch)
    real = round_mod.solve_chain
    monkeypatch.setattr(round_mod, "solve_chain",
                        lambda model, backends, *a, **kw: real(model, [ZeroBackend()], *a, **kw))
    res = run_round(cl, jobs, now, RoundConfig(time_budget_s=10.0, isolate=False))
    assert made == [False]  # no hint before the chain: the check is after it
    rep = res.decision.report
    assert rep.backend == "greedy" and "worse than the greedy" in rep.fallback_reason, rep
    assert len(res.decision.allocations) > 0
    assert validate(res.decision, cl, jobs).ok


@pytest.mark.parametrize(("gap", "before"), [(1e-3, False), (1e-4, True)])
def test_the_greedy_waits_for_the_chain_where_lp_rounding_goes_first_and_is_final(
        gap: float, before: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default tolerance the cell model's chain starts with LP rounding, whose answer
    ends it: the greedy is made only after the chain, when the answer is not proved within
    the tolerance, so a round answered within it lists no greedy attempt. Below it HiGHS
    goes first, warm-started from the greedy's answer made before the chain."""
    cl, jobs, now = _round()
    made = _greedy_made_before_the_chain(monkeypatch)
    res = run_round(cl, jobs, now, RoundConfig(time_budget_s=10.0, isolate=False, mip_gap=gap,
                                               deterministic=True))
    assert made == [before]
    rep = res.decision.report
    assert rep.gap is not None and rep.gap <= gap, rep
    assert (rep.backend == "lp-round") is not before, rep
    greedy = [a for a in rep.attempts if a["backend"] == "greedy"]
    assert bool(greedy) is before, rep.attempts
    assert validate(res.decision, cl, jobs).ok
