"""An LP kept alive across rounds (solvers/persistent.py) answers as a fresh one does.

The session brings HiGHS's kept LP to each round's model by incremental changes (columns
and rows matched by key and name, added, deleted, re-costed, re-bounded, coefficients
changed) and re-solves from the last basis; the fresh path builds the LP anew. On random
sequences of models the two give the same LP optimum, and whole rounds solved through
either path give answers within the chain's tolerance of each other, every one valid.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.config import cluster_from_data, jobs_from_data
from apportion.formulations.model import LinearModel
from apportion.jobs import RunningState
from apportion.policies import FormulationPolicy, RoundConfig, run_round
from apportion.solvers.base import Status
from apportion.solvers.highs import HighsBackend
from apportion.solvers.persistent import HighsSession, run_limit
from apportion.validator import validate

KEYS = 24  # the variables a sequence draws its rounds' columns from
ROWS = 8


def _round_model(draw: st.DrawFn, base: np.ndarray) -> LinearModel:
    """One round: a random subset of the columns and rows, in a random order, with random
    costs and bounds and a few coefficients moved off the sequence's base matrix."""
    cols = draw(st.permutations(range(KEYS)))[:draw(st.integers(1, KEYS))]
    rows = draw(st.permutations(range(ROWS)))[:draw(st.integers(0, ROWS))]
    m = LinearModel("t", sense=draw(st.sampled_from(["max", "min"])))
    for k in cols:
        m.add_var(("x", k), 0.0, float(draw(st.integers(1, 4))),
                  obj=float(draw(st.integers(-5, 9))))
    a = base.copy()
    for _ in range(draw(st.integers(0, 4))):  # a coefficient moves (or appears, or goes)
        a[draw(st.integers(0, ROWS - 1)), draw(st.integers(0, KEYS - 1))] = \
            float(draw(st.integers(0, 3)))
    for r in rows:
        coeffs = {i: a[r, k] for i, k in enumerate(cols) if a[r, k] != 0.0}
        # x = 0 satisfies every row: the LP is feasible and, with finite bounds, bounded
        m.add_row(coeffs, lb=-float(draw(st.integers(0, 3))),
                  ub=float(draw(st.integers(0, 12))), name=f"row{r}")
    return m


@st.composite
def sequences(draw: st.DrawFn) -> list[LinearModel]:
    base = np.array(draw(st.lists(st.integers(0, 3), min_size=ROWS * KEYS,
                                  max_size=ROWS * KEYS)), float).reshape(ROWS, KEYS)
    return [_round_model(draw, base) for _ in range(draw(st.integers(2, 6)))]


def _fresh_lp(m: LinearModel) -> float:
    relaxed = copy.copy(m)
    relaxed.integer = [False] * m.num_vars
    res = HighsBackend().solve(relaxed, 10.0)
    assert res.status is Status.OPTIMAL and res.objective is not None
    return res.objective


@settings(max_examples=60, deadline=None)
@given(sequences())
def test_a_kept_lp_has_the_fresh_lps_optimum_round_after_round(models: list[LinearModel]
                                                               ) -> None:
    session = HighsSession()
    for m in models:
        got = session.relaxation(m, 10.0, reduced_costs=True)
        assert got.status is Status.OPTIMAL and got.x is not None, got.message
        assert abs(got.objective - _fresh_lp(m)) <= 1e-7 * max(1.0, abs(got.objective))
        assert not m.violations(got.x), m.violations(got.x)  # x in the model's own order
        assert got.extra["reduced_costs"].shape == (m.num_vars,)
    assert session.stats.solves == len(models)
    assert session.stats.builds + session.stats.hot_starts == len(models)
    assert session.stats.builds >= 1  # the first round is built afresh


def test_the_first_round_is_built_and_the_next_starts_from_it() -> None:
    m1 = LinearModel("t")
    for k in range(4):
        m1.add_var(k, 0, 1, obj=1.0 + k)
    m1.add_row({0: 1, 1: 1, 2: 1, 3: 1}, ub=2, name="cap")
    m2 = copy.deepcopy(m1)
    m2.obj[0] = 10.0  # the clock moved a cost
    session = HighsSession()
    first = session.relaxation(m1, 5.0)
    second = session.relaxation(m2, 5.0)
    assert first.extra["hot_start"] is False and second.extra["hot_start"] is True
    assert second.objective == 14.0  # columns 0 and 3: 10 + 4
    assert session.stats.why_built == {"first round": 1}


def test_repeated_row_names_are_built_afresh_every_round() -> None:
    m = LinearModel("t")
    m.add_var("a", 0, 1, obj=1.0)
    m.add_row({0: 1.0}, ub=1.0, name="same")
    m.add_row({0: 2.0}, ub=1.0, name="same")
    session = HighsSession()
    for _ in range(2):
        assert session.relaxation(m, 5.0).objective == 0.5
    assert session.stats.why_built == {"first round": 1, "row names repeat": 1}


MODELS = ["bert-0.76b", "bert-1.3b", "moe-0.69b", "wresnet-1b", "bert-2.6b"]
CLUSTER = cluster_from_data({"node_groups": [
    {"prefix": "a40", "count": 3, "gpu_type": "A40", "gpus_per_node": 4},
    {"prefix": "a10", "count": 3, "gpu_type": "A10", "gpus_per_node": 4}]}, "test")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8])),
                         min_size=1, max_size=5), min_size=2, max_size=5),
       st.integers(0, 3))
def test_rounds_through_a_kept_lp_and_fresh_ones_agree_within_the_tolerance(
        arrivals: list[list[tuple[str, int]]], leave: int) -> None:
    """A sequence of rounds: each round some jobs arrive, the oldest ``leave`` finish, and
    the jobs placed last round run where the fresh path put them. The same queue goes to a
    policy that keeps its LP (persistent) and one that builds it afresh each round."""
    gap = 1e-3
    kept = FormulationPolicy(RoundConfig(time_budget_s=20.0, mip_gap=gap, isolate=False,
                                         persistent=True))
    fresh = FormulationPolicy(RoundConfig(time_budget_s=20.0, mip_gap=gap, isolate=False,
                                          persistent=False))
    queue: list = []
    n = 0
    for t, batch in enumerate(arrivals):
        new, _ = jobs_from_data({"jobs": [
            {"id": f"j{n + i}", "model": m, "global_batch_size": 128, "iterations": 5000,
             "requested_gpus": g, "submit_time_s": 300.0 * t} for i, (m, g) in
            enumerate(batch)]}, "t")
        n += len(batch)
        queue = queue[leave:] + new
        now = 300.0 * t + 1.0
        answers = []
        for pol in (fresh, kept):
            res = run_round(CLUSTER, queue, now, pol.cfg, policy=pol)
            d = res.decision
            assert validate(d, CLUSTER, queue).ok  # every answer, either path
            answers.append(d)
        a, b = (d.report for d in answers)
        assert not a.fallback and not b.fallback
        if a.gap is not None and b.gap is not None and a.gap <= gap and b.gap <= gap:
            # both within the tolerance of the same optimum: within it of each other
            scale = max(1.0, abs(a.bound or a.objective), abs(b.bound or b.objective))
            assert abs(a.objective - b.objective) <= gap * scale + 1e-6, (a, b)
        placed = {al.job: al for al in answers[0].allocations}
        queue = [replace(j, running=RunningState(placed[j.id].gpu_type, placed[j.id].gpus,
                                                 placed[j.id].stages,
                                                 dict(placed[j.id].placement),
                                                 placed[j.id].plan.tp))
                 if j.id in placed else replace(j, running=None) for j in queue]
    assert kept.session is not None and kept.session.stats.solves >= 1
    assert fresh.session is None


def test_a_policy_keeps_its_lp_by_default_and_a_one_off_round_answers_as_afresh() -> None:
    """``RoundConfig.persistent`` is on: a replay's, ``run``'s or ``serve``'s policy keeps
    its LP; a one-off round's first LP is built afresh, so its answer is the fresh path's."""
    assert RoundConfig().persistent is True
    jobs, _ = jobs_from_data({"jobs": [
        {"id": f"j{i}", "model": MODELS[i % len(MODELS)], "global_batch_size": 128,
         "iterations": 5000, "requested_gpus": 2 ** (i % 3)} for i in range(8)]}, "t")
    answers = []
    for persistent in (True, False):
        cfg = RoundConfig(time_budget_s=20.0, isolate=False, deterministic=True,
                          persistent=persistent)
        d = run_round(CLUSTER, jobs, 1.0, cfg).decision
        answers.append((sorted((a.job, a.gpu_type, a.gpus) for a in d.allocations),
                        d.report.objective, d.report.backend))
    assert answers[0] == answers[1]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0.5, 4.0), st.floats(-2.0, 3.0)),
                min_size=1, max_size=6),
       st.floats(1.0, 6.0))
def test_a_kept_lp_follows_the_costs_and_bounds_that_moved(
        moves: list[tuple[int, float, float]], cap: float) -> None:
    """The session hands HiGHS only the costs and bounds that moved since the last round:
    one that moved is always the LP's next round's, whichever others stayed."""
    def model(ub: list[float], obj: list[float], row_ub: float) -> LinearModel:
        m = LinearModel("m", "max")
        for j in range(6):
            m.add_var(("v", j), 0.0, ub[j], obj=obj[j])
        m.add_row({j: 1.0 + j % 3 for j in range(6)}, ub=row_ub, name="cap")
        m.add_row({0: 1.0, 1: 1.0}, ub=3.0, name="pair")
        return m

    ub, obj = [2.0] * 6, [1.0, 2.0, 0.5, 1.5, 3.0, 1.0]
    session = HighsSession()
    session.relaxation(model(ub, obj, 5.0), 10.0)
    for j, bound, cost in moves:
        ub[j], obj[j] = bound, cost
        m = model(ub, obj, cap)
        kept = session.relaxation(m, 10.0)
        relaxed = copy.copy(m)
        fresh = HighsBackend().solve(relaxed, 10.0)
        assert kept.status is Status.OPTIMAL and fresh.status is Status.OPTIMAL
        assert kept.objective == pytest.approx(fresh.objective, abs=1e-7)
    assert session.stats.hot_starts == len(moves)


def test_each_round_of_a_kept_lp_gets_its_whole_time_limit() -> None:
    """HiGHS reads its time limit against the Highs object's run clock, which adds up over
    the kept LP's runs: each round's limit counts from where that clock stands
    (``run_limit``), so a long replay's LP is never cut short by the rounds before it (which
    made replays not repeat)."""
    m = LinearModel("m", "max")
    for j in range(4):
        m.add_var(("v", j), 0.0, 1.0, obj=1.0 + j)
    m.add_row({j: 1.0 for j in range(4)}, ub=2.0, name="cap")
    session = HighsSession()
    for _ in range(3):
        assert session.relaxation(m, 30.0).status is Status.OPTIMAL
    h = session._h
    assert h.getRunTime() > 0.0  # the clock has run: a limit set as is would lag it
    assert run_limit(h, 5.0) == pytest.approx(h.getRunTime() + 5.0)
    assert run_limit(h, 0.0) == pytest.approx(h.getRunTime() + 0.01)
    # and the session sets it so: its last round's limit lies past the clock as it stood
    assert h.getOptionValue("time_limit")[1] > h.getRunTime() + 29.0
