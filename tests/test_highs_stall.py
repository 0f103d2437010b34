"""HiGHS in a chain stops once its incumbent stalls, and CP-SAT then does not get the rest.

Market-share problems (Cornuéjols and Dawande) are tiny MIPs no branch and bound closes
in seconds: incumbents come early, then nothing for a long time. The stall rule must
stop there with the best answer found, say so, and end the chain: a budget-bound round
spent its tail on a search that no longer moved (experiments/results/bench/speed.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.formulations.model import LinearModel
from apportion.solvers.base import Status
from apportion.solvers.chain import backends_for, solve_chain
from apportion.solvers.chain_rules import skipped
from apportion.solvers.highs import MIN_STALL_S, HighsBackend


def markshare(rows: int, cols: int, seed: int) -> LinearModel:
    """min |s| subject to a x + s+ - s- = b / 2 rows, x binary; hint: x = 0."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, size=(rows, cols))
    b = a.sum(axis=1) // 2
    lm = LinearModel("markshare", sense="min")
    xs = [lm.binary(("x", j)) for j in range(cols)]
    plus = [lm.add_var(("s+", i), 0.0, 1e6, False, 1.0) for i in range(rows)]
    minus = [lm.add_var(("s-", i), 0.0, 1e6, False, 1.0) for i in range(rows)]
    for i in range(rows):
        lm.add_row({**{xs[j]: float(a[i, j]) for j in range(cols)}, plus[i]: 1.0,
                    minus[i]: -1.0}, float(b[i]), float(b[i]))
    hint = {x: 0.0 for x in xs} | {plus[i]: float(b[i]) for i in range(rows)} \
        | {minus[i]: 0.0 for i in range(rows)}
    lm.set_hint(hint)
    return lm


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10_000))
def test_a_stalled_search_stops_early_with_a_valid_answer(seed: int) -> None:
    model = markshare(5, 40, seed)
    limit = 30.0
    res = HighsBackend(stall_share=0.02).solve(model, limit)  # a 0.6 s window
    assert res.x is not None and model.is_feasible(res.x)
    assert res.objective is not None and res.objective <= model.objective_value(
        np.array([model.hint[i] for i in range(model.num_vars)]))  # never worse than its start
    assert res.bound is not None and res.bound <= res.objective + 1e-6  # an honest bound
    if res.status is Status.OPTIMAL:  # a perfect split (slack 0) is optimal at once: rare
        assert res.objective == pytest.approx(0.0, abs=1e-6)
        return
    # otherwise a market-share instance of this size is never closed in 30 s: the stall
    # stopped it, well before the limit
    assert "stopped: no better answer" in res.message, res.message
    assert res.wall_s < limit


def test_the_window_has_a_floor() -> None:
    model = markshare(4, 30, 1)
    res = HighsBackend(stall_share=1e-6).solve(model, 10.0)
    if res.status is Status.OPTIMAL:  # a perfect split found at once (rare): no stall
        return
    assert "stopped: no better answer for" in res.message
    stalled_for = float(res.message.split("no better answer for ")[1].split(" s")[0])
    assert stalled_for >= MIN_STALL_S


def test_in_a_chain_cp_sat_runs_only_if_highs_failed() -> None:
    names = ["lp-round", "highs", "cp-sat"]
    assert skipped(names, 2, {"highs"}) == "skipped: HiGHS answered"
    assert skipped(names, 2, {"lp-round"}) is None  # a model that does not say so
    assert skipped(names, 1, {"lp-round"}) is None
    model = markshare(5, 40, 7)
    best, attempts = solve_chain(model, backends_for("auto", gap=1e-3), 12.0)
    assert best is not None and model.is_feasible(best.x)
    if best.status is Status.OPTIMAL:  # a perfect split found at once: nothing to stop
        return
    by_name = {a.backend: a for a in attempts}
    assert "stopped: no better answer" in by_name["highs"].message or \
        "limit" in by_name["highs"].message.lower()
    assert by_name["cp-sat"].message in ("skipped: HiGHS answered", "no budget left")


def _knapsack(final: bool) -> LinearModel:
    """A 0-1 knapsack whose rounded relaxation is far from its bound; ``final``:
    its meta says LP rounding's answer ends the chain (as the cell model's does)."""
    m = LinearModel("knapsack", sense="max")
    for i in range(3):  # room for one item and two thirds of another: bound 16.7, best 10
        m.binary(("x", i), obj=10.0)
    m.add_row({i: 6.0 for i in range(3)}, ub=10.0)
    m.meta["lp_rounding_final"] = final
    return m


def test_an_answer_of_lp_rounding_ends_the_chain_where_the_model_says_so() -> None:
    """At the tolerant gap a cell-like model (``meta["lp_rounding_final"]``) takes LP
    rounding's answer as final: HiGHS and CP-SAT are skipped and say why; a model that does
    not say so, or a tolerance below ``LP_FIRST_GAP``, still gets HiGHS's branch and bound."""
    names = ["lp-round", "highs", "cp-sat"]
    assert skipped(names, 1, {"lp-round"}, 1e-3, True) == "skipped: LP rounding answered"
    assert skipped(names, 2, {"lp-round"}, 1e-3, True) == "skipped: LP rounding answered"
    assert skipped(names, 1, set(), 1e-3, True) is None  # LP rounding failed: HiGHS rescues
    assert skipped(["highs", "lp-round", "highs", "cp-sat"], 2, {"lp-round"}, 1e-4, True) is None
    for final in (True, False):
        model = _knapsack(final)
        best, attempts = solve_chain(model, backends_for("auto", gap=1e-3), 10.0,
                                     work_s=2.0)
        assert best is not None and model.is_feasible(best.x)
        by_name = {a.backend: a for a in attempts}
        lp = by_name["lp-round"]
        assert lp.x is not None and lp.bound is not None
        assert lp.bound - lp.objective > 1e-3 * abs(lp.bound)  # not final by the gap alone
        if final:
            assert by_name["highs"].message == "skipped: LP rounding answered"
            assert by_name["cp-sat"].message == "skipped: LP rounding answered"
            assert best.backend == "lp-round"
        else:
            assert by_name["highs"].x is not None  # it ran, from LP rounding's answer
            assert best.objective >= lp.objective - 1e-9
