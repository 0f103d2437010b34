"""The solver-neutral model's row activity and columns (numpy only) agree with its sparse
matrix."""

from __future__ import annotations

import numpy as np
from apportion.formulations.model import LinearModel
from hypothesis import given, settings
from hypothesis import strategies as st

coef = st.floats(-1e3, 1e3, allow_nan=False)


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
