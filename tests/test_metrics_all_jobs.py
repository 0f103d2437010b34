"""The all-jobs JCT (``avg_jct_all_s``): unfinished jobs count until the replay's end.

A policy that leaves its long jobs unstarted must not rank ahead of one that finishes
them; the finished-only average would let it (Morphling's heuristic on its own trace).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.experiments.metrics import jct_all, summarize
from test_sim_properties import small_cluster as _cluster

jobs_st = st.lists(st.tuples(st.floats(0, 1e5), st.floats(1, 1e5), st.booleans()),
                   min_size=1, max_size=40)


def _frame(rows: list[tuple[float, float, bool]]) -> pd.DataFrame:
    return pd.DataFrame({
        "submit_s": [s for s, _, _ in rows],
        "jct_s": [d if f else np.nan for _, d, f in rows],
        "finish_s": [s + d if f else np.nan for s, d, f in rows],
        "finished": [f for _, _, f in rows], "queue_s": [0.0] * len(rows),
        "restarts": [0] * len(rows), "dropped": [False] * len(rows),
        "deadline_s": [None] * len(rows), "met_deadline": [None] * len(rows),
        "ftf_rho": [np.nan] * len(rows)})


@settings(max_examples=60, deadline=None)
@given(jobs_st)
def test_all_jobs_jct_bounds_the_finished_only_view(rows: list[tuple[float, float, bool]]) -> None:
    df = _frame(rows)
    end = max(s + d for s, d, _ in rows)
    every = jct_all(df, end)
    assert len(every) == len(df)
    fin = df["finished"].to_numpy()
    assert np.allclose(every[fin], df["jct_s"].to_numpy()[fin])
    # an unfinished job counts its whole stay, until the end
    assert np.allclose(every[~fin], end - df["submit_s"].to_numpy()[~fin])
    s = summarize(df, pd.DataFrame(), pd.DataFrame(), _cluster(), 0.0, end_s=end)
    assert s["avg_jct_all_s"] is not None
    if fin.all():
        assert s["avg_jct_all_s"] == s["avg_jct_s"]


def test_leaving_a_long_job_unstarted_does_not_lower_the_all_jobs_average() -> None:
    """Two policies on the same three jobs: one finishes the long job late, one never
    starts it. The finished-only average prefers the second; the all-jobs one does not."""
    finishes = _frame([(0.0, 100.0, True), (0.0, 100.0, True), (0.0, 5000.0, True)])
    starves = _frame([(0.0, 100.0, True), (0.0, 100.0, True), (0.0, 0.0, False)])
    cl = _cluster()
    a = summarize(finishes, pd.DataFrame(), pd.DataFrame(), cl, 0.0, end_s=5000.0)
    b = summarize(starves, pd.DataFrame(), pd.DataFrame(), cl, 0.0, end_s=5000.0)
    assert b["avg_jct_s"] < a["avg_jct_s"]
    assert b["avg_jct_all_s"] >= a["avg_jct_all_s"]
