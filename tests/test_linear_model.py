"""The solver-neutral model's row activity and columns (numpy only) agree with its sparse
matrix."""

from __future__ import annotations

from itertools import repeat

import numpy as np
import pytest
from apportion.formulations.model import LinearModel
from hypothesis import given, settings
from hypothesis import strategies as st

coef = st.floats(-1e3, 1e3, allow_nan=False)


def test_add_columns_takes_each_field_apart_and_refuses_unequal_lengths() -> None:
    """``add_columns`` is ``add_vars`` with each field its own sequence (shared ones as
    ``repeat``); fields shorter than the keys add nothing."""
    m, ref = LinearModel("cols"), LinearModel("ref")
    keys = [("y", c) for c in "abc"]
    assert list(m.add_columns(keys, repeat(0.0), [1.0, 2.0, 3.0], repeat(True), repeat(0.0))) \
        == [0, 1, 2]
    ref.add_vars((k, 0.0, ub, True, 0.0) for k, ub in zip(keys, (1.0, 2.0, 3.0)))
    for attr in ("var_keys", "lb", "ub", "integer", "obj"):
        assert getattr(m, attr) == getattr(ref, attr)
    with pytest.raises(ValueError, match="2 upper bounds"):
        m.add_columns([("z", 1), ("z", 2), ("z", 3)], repeat(0.0), [1.0, 2.0], repeat(True),
                      repeat(0.0))
    assert m.num_vars == 3 and ("z", 1) not in m._index


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.lists(st.tuples(st.integers(0, n - 1), coef), max_size=6), max_size=6),
    st.lists(coef, min_size=n, max_size=n))))
def test_activity_is_the_matrix_product(case: tuple[int, list, list]) -> None:
    n, rows, x = case
    m = LinearModel("t")
    for i in range(n):
        m.add_var(i, lb=-1e4, ub=1e4)
    for r in rows:
        m.add_row(r, lb=-1e9, ub=1e9)
    if not m.rows:
        return
    got = m.activity(np.asarray(x))
    want = m.matrix() @ np.asarray(x)
    assert got.shape == (len(m.rows),)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.lists(st.tuples(st.integers(0, n - 1), coef), max_size=6), max_size=6))))
def test_columns_are_the_sparse_matrix_by_columns(case: tuple[int, list]) -> None:
    """What HiGHS is handed (numpy alone) is exactly scipy's CSC of the same rows, and a
    row added later is in the next read (the cache follows the rows)."""
    n, rows = case
    m = LinearModel("t")
    for i in range(n):
        m.add_var(i)
    for r in rows:
        m.add_row(r, lb=-1e9, ub=1e9)
        want = m.matrix().tocsc()
        got = m.columns()
        assert np.array_equal(got.indptr, want.indptr)
        assert np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data)


def test_a_nan_coefficient_shows_in_the_activity() -> None:
    m = LinearModel("t")
    m.add_var("a")
    m.add_row({0: float("nan")})
    assert not np.isfinite(m.activity(np.array([1.0]))).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.floats(-5, 5), st.floats(0, 5), st.booleans(),
                          st.floats(-10, 10)), max_size=25),
       st.integers(0, 3))
def test_add_vars_is_add_var_in_order_and_all_or_nothing(
        specs: list[tuple[int, float, float, bool, float]], before: int) -> None:
    """``add_vars`` adds what the same ``add_var`` calls add, in their order; where one of
    them would fail (a repeated key, lb > ub) it adds nothing and says why."""
    bulk, one = LinearModel("bulk"), LinearModel("one")
    for m in (bulk, one):
        for i in range(before):
            m.add_var(("pre", i))
    cols = [(("k", k), lb, lb + span, integer, obj) for k, lb, span, integer, obj in specs]
    try:
        for key, lb, ub, integer, obj in cols:
            one.add_var(key, lb, ub, integer, obj)
        failed = None
    except ValueError as exc:
        failed = exc
    if failed is None:
        assert list(bulk.add_vars(cols)) == list(range(before, before + len(cols)))
        for attr in ("var_keys", "lb", "ub", "integer", "obj"):
            assert getattr(bulk, attr) == getattr(one, attr)
        assert all(bulk.index(k) == one.index(k) for k in one.var_keys)
    else:
        with pytest.raises(ValueError, match="duplicate"):
            bulk.add_vars(cols)
        assert bulk.num_vars == before and len(bulk._index) == before
    with pytest.raises(ValueError, match="lb"):
        bulk.add_vars([(("bad",), 2.0, 1.0, False, 0.0)])
    assert ("bad",) not in bulk._index


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.dictionaries(st.integers(0, n - 1), st.floats(-4, 4).filter(bool), max_size=n),
             min_size=0, max_size=6),
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.lists(st.integers(0, 3), min_size=n, max_size=n))))
def test_restricted_is_the_model_with_the_other_columns_at_zero(
        case: tuple[int, list, list, list]) -> None:
    n, rows, kept, values = case
    m = LinearModel("m", "max")
    for j in range(n):
        m.add_var(("v", j), 0.0, 3.0, integer=j % 2 == 0, obj=float(j) - 2.5)
    for i, coeffs in enumerate(rows):
        m.add_row(coeffs, -1.0 - i, 2.0 + i, name=f"row{i}")
    m.set_hint({j: float(values[j]) for j in range(n)})
    keep = np.flatnonzero(kept)
    sub = m.restricted(keep)
    assert sub.var_keys == [("v", int(j)) for j in keep]
    assert sub.num_rows == m.num_rows and [r.name for r in sub.rows] == [r.name for r in m.rows]
    assert sub.integer == [m.integer[j] for j in keep]
    assert sub.hint == {i: float(values[j]) for i, j in enumerate(keep)}
    x_sub = np.asarray([values[j] for j in keep], float)
    x = np.zeros(n)
    x[keep] = x_sub
    # the same point, read by either model: the same objective, activity and verdict
    assert sub.objective_value(x_sub) == pytest.approx(m.objective_value(x))
    np.testing.assert_allclose(sub.activity(x_sub), m.activity(x))
    assert sub.is_feasible(x_sub) == m.is_feasible(x)


def test_restricted_refuses_a_column_zero_cannot_take() -> None:
    m = LinearModel("m", "max")
    m.add_var("a", 1.0, 2.0)
    m.add_var("b", 0.0, 2.0)
    assert m.restricted(np.array([0])).var_keys == ["a"]
    with pytest.raises(ValueError, match="'a' cannot be taken at zero"):
        m.restricted(np.array([1]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.dictionaries(st.integers(0, n + 1), st.floats(-3, 3), max_size=n),
                       st.floats(-5, 0), st.floats(0, 5), st.sampled_from(["", "r"])),
             max_size=5))))
def test_add_rows_is_add_row_in_order_and_all_or_nothing(case: tuple[int, list]) -> None:
    n, rows = case
    one, bulk = LinearModel("a"), LinearModel("b")
    for m in (one, bulk):
        m.add_vars((("v", j), 0.0, 1.0, False, 0.0) for j in range(n))
    try:
        want = [one.add_row(dict(c), lb, ub, name=name) for c, lb, ub, name in rows]
    except IndexError as exc:
        with pytest.raises(IndexError, match=str(exc).split(":")[0]):
            bulk.add_rows([(dict(c), lb, ub, name) for c, lb, ub, name in rows])
        assert bulk.rows == []  # nothing added when one fails
        return
    got = bulk.add_rows([(dict(c), lb, ub, name) for c, lb, ub, name in rows])
    assert list(got) == want
    assert bulk.rows == one.rows


def test_lp_roundings_restricted_mip_keeps_a_column_its_bounds_keep_off_zero() -> None:
    """A researcher's model may force an integer column off zero: the restricted MIP keeps
    it (a model over the other columns would have to take it at zero)."""
    from apportion.solvers.lpround import LpRoundBackend

    m = LinearModel("m", "max")
    n = 600  # past the restricted MIP's nearest columns (solvers.lpround.MIN_EXTRA)
    for j in range(n):
        m.add_var(("x", j), 0.0, 1.0, integer=True, obj=1.0 + (j % 7) / 10)
    # below zero: the LP's support (its columns above zero) never holds it
    forced = m.add_var("forced", -2.0, -1.0, integer=True, obj=50.0)
    m.add_row({j: 2.0 + j % 3 for j in range(n)} | {forced: 1.0}, ub=17.5, name="cap")
    res = LpRoundBackend(mip_rel_gap=None).solve(m, 10.0)
    assert res.x is not None and m.is_feasible(res.x)
    assert res.x[forced] in (-1.0, -2.0)
