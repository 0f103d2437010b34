"""Measured tables: log-log interpolation, leave-one-out, persistence, a real gloo benchmark."""

from __future__ import annotations

import math

import pytest
from apportion.estimation.models.comm import Link, allreduce_time
from apportion.estimation.models.tables import CommTables, Curve, alpha_beta_fit
from hypothesis import given, settings
from hypothesis import strategies as st


def test_curve_hits_points_and_interpolates_log_log():
    c = Curve.from_points([(1e3, 1e-4), (1e5, 1e-3), (1e7, 1e-1)])
    assert c.at(1e5) == pytest.approx(1e-3)
    assert c.at(1e4) == pytest.approx(math.sqrt(1e-4 * 1e-3))  # geometric midpoint
    assert c.at(10) == pytest.approx(1e-4)  # latency floor below the smallest size
    assert c.at(2e7) == pytest.approx(2e-1)  # linear in size beyond the largest


@given(st.floats(1e-6, 1e-2), st.floats(0.3, 1.5))
@settings(max_examples=50, deadline=None)
def test_power_laws_are_reproduced_exactly(a, e):
    xs = [2.0 ** k for k in range(10, 28, 2)]
    c = Curve.from_points([(x, a * x ** e) for x in xs])
    assert max(c.leave_one_out()) < 1e-9
    mid = 3.0 * 2 ** 15
    assert c.at(mid) == pytest.approx(a * mid ** e, rel=1e-9)


def test_two_regime_data_defeat_one_line_but_not_the_table():
    # bandwidth halves above 16 MB (as gloo's all-gather does)
    def t(x):
        return 5e-5 + x / 2e9 if x <= 16 * 2**20 else 5e-5 + 16 * 2**20 / 2e9 + (x - 16 * 2**20) / 1e9
    xs = [2.0 ** k for k in range(10, 29)]
    c = Curve.from_points([(x, t(x)) for x in xs])
    loo = c.leave_one_out()
    alpha, bw = alpha_beta_fit(xs, [t(x) for x in xs])
    assert alpha < 0  # the least-squares latency is negative: one line cannot fit
    line_err = [abs(alpha + x / bw - t(x)) / t(x) for x in xs]
    assert sum(loo) / len(loo) < 0.05
    assert sum(line_err) / len(line_err) > 1.0


def test_comm_tables_round_trip_and_fallback(tmp_path):
    tb = CommTables()
    tb.add("all_reduce", "loopback", 2, [(1e3, 1e-4), (1e6, 1e-3)])
    p = tb.save(tmp_path / "t.json")
    again = CommTables.load(p)
    assert again.time("all_reduce", 1e6, 2, "loopback") == pytest.approx(1e-3)
    # unmeasured rank count: scaled by the ring factor (4 ranks move 1.5x of 2 ranks' bytes)
    assert again.time("all_reduce", 1e6, 4, "loopback") > again.time("all_reduce", 1e6, 2,
                                                                      "loopback")
    # never-measured link: the alpha-beta model
    link = Link("nvlink", 300.0)
    assert again.time("all_reduce", 1e8, 8, link) == pytest.approx(allreduce_time(1e8, 8, link))
    with pytest.raises(ValueError):
        tb.add("broadcast", "x", 2, [(1, 1)])


def test_real_gloo_microbenchmark_writes_tables(tmp_path):
    pytest.importorskip("torch")
    from apportion.estimation.profilers.collectives import measure, sizes_between

    assert sizes_between(1024, 65536, 4) == [1024, 4096, 16384, 65536]
    tb = measure(ranks=(2,), max_bytes=64 * 1024, repeats=2)
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        c = tb.curves[f"{coll}|loopback|2"]
        assert len(c.xs) == 4 and all(y > 0 for y in c.ys)
    assert tb.meta["backend"] == "gloo"
    p = tb.save(tmp_path / "gloo.json")
    assert CommTables.load(p).time("all_reduce", 32 * 1024, 2, "loopback") > 0
    assert set(tb.leave_one_out()) == set(tb.curves)
