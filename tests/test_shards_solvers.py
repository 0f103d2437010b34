"""Hydra shard-unit solvers: greedy list schedulers, CP-SAT, the MILP, large-instance schemes
and the solve-shards entry point. Every schedule goes through the independent validator."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from apportion.formulations.shards import (
    ShardDevice,
    ShardModel,
    ShardProblem,
    load_problem,
    makespan,
)
from apportion.solvers.base import Status
from apportion.solvers.shards import (
    aggregate,
    expand,
    list_schedule,
    random_schedule,
    sharded_lrtf,
    solve,
    solve_shards_file,
)
from apportion.solvers.shards_validator import check_schedule, placements_from_output
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.errors import InputError

EPS = 1e-9


@st.composite
def problems(draw: st.DrawFn, max_models: int = 3, max_units: int = 4) -> ShardProblem:
    """Small random instances: 1-3 devices of mixed speed and memory, chains of 1..max_units
    integer runtimes, some with memory needs only the first (unbounded) device holds."""
    n_dev = draw(st.integers(1, 3))
    devices = [ShardDevice(f"d{p}", draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])),
                           math.inf if p == 0 else draw(st.sampled_from([math.inf, 100.0, 40.0])))
               for p in range(n_dev)]
    models = []
    for i in range(draw(st.integers(1, max_models))):
        n = draw(st.integers(1, max_units))
        rt = tuple(float(draw(st.integers(1, 9))) for _ in range(n))
        mem = tuple(float(draw(st.sampled_from([10, 50, 90]))) for _ in range(n)) \
            if draw(st.booleans()) else ()
        models.append(ShardModel(f"m{i}", rt, mem))
    return ShardProblem(devices, models)


@settings(max_examples=60, deadline=None)
@given(problems(max_models=4, max_units=6), st.integers(0, 10))
def test_greedy_schedules_are_valid_and_above_the_bound(p: ShardProblem, seed: int) -> None:
    lb = p.lower_bound()
    for sched in (sharded_lrtf(p), random_schedule(p, seed)):
        check_schedule(p, sched)
        assert makespan(sched) >= lb * (1 - EPS)


@settings(max_examples=12, deadline=None)
@given(problems(max_models=3, max_units=3))
def test_cpsat_optimum_equals_milp_optimum_on_tiny_instances(p: ShardProblem) -> None:
    cp = solve(p, "cp-sat", 20.0)
    mi = solve(p, "milp", 20.0)
    for sol in (cp, mi):
        check_schedule(p, sol.schedule)
        assert sol.makespan >= sol.lower_bound * (1 - EPS)
    assert cp.status is Status.OPTIMAL and mi.status is Status.OPTIMAL
    # CP-SAT works in ticks of 1e-7 x horizon (durations rounded up), hence the tolerance.
    assert cp.makespan == pytest.approx(mi.makespan, rel=1e-5)


@settings(max_examples=15, deadline=None)
@given(problems(max_models=4, max_units=6))
def test_cpsat_with_lrtf_hint_never_worse_than_lrtf(p: ShardProblem) -> None:
    lrtf = solve(p, "lrtf", 1.0)
    cp = solve(p, "cp-sat", 0.5)
    check_schedule(p, lrtf.schedule)
    check_schedule(p, cp.schedule)
    assert cp.makespan <= lrtf.makespan * (1 + EPS)
    assert cp.greedy_makespan == pytest.approx(lrtf.makespan)
    assert cp.status in (Status.OPTIMAL, Status.FEASIBLE, Status.FALLBACK)


def _random_problem(seed: int, models: int, devices: int, units: tuple[int, int],
                    hetero_speed: bool = False) -> ShardProblem:
    rng = random.Random(seed)
    devs = [ShardDevice(f"g{p}", rng.choice([1.0, 2.0]) if hetero_speed else 1.0)
            for p in range(devices)]
    mods = [ShardModel(f"m{i}", tuple(rng.uniform(0.5, 5.0) for _ in range(rng.randint(*units))))
            for i in range(models)]
    return ShardProblem(devs, mods)


def test_fewer_models_than_devices_gives_the_longest_chain() -> None:
    """Hydra's case (2): with more identical devices than models there is no contention,
    so every list schedule's makespan is the longest chain (the lower bound)."""
    p = _random_problem(3, models=3, devices=5, units=(5, 40))
    for sched in (sharded_lrtf(p), random_schedule(p, 1)):
        check_schedule(p, sched)
        assert makespan(sched) == pytest.approx(p.chain_bound())


def test_lrtf_beats_random_on_a_skewed_tail() -> None:
    """One long model among short ones: LRTF starts it at once, random may not."""
    p = ShardProblem([ShardDevice("a"), ShardDevice("b")],
                     [ShardModel("long", (1.0,) * 20)] + [ShardModel(f"s{i}", (1.0,) * 5)
                                                          for i in range(4)])
    lrtf = sharded_lrtf(p)
    check_schedule(p, lrtf)
    assert makespan(lrtf) == pytest.approx(p.lower_bound())
    worst = max(makespan(random_schedule(p, s)) for s in range(10))
    assert worst > makespan(lrtf)


def test_memory_restricted_list_scheduling() -> None:
    p = ShardProblem([ShardDevice("big", 1.0, 1000.0), ShardDevice("small", 2.0, 100.0)],
                     [ShardModel("a", (2.0,) * 6, (500.0, 10.0) * 3),
                      ShardModel("b", (2.0,) * 6, (10.0,) * 6)])
    for sched in (sharded_lrtf(p), random_schedule(p, 2)):
        check_schedule(p, sched)
        assert all(pl.device == 0 for pl in sched if pl.model == 0 and pl.unit % 2 == 0)
    sol = solve(p, "cp-sat", 2.0)
    check_schedule(p, sol.schedule)


def test_ready_times_and_tails_are_respected() -> None:
    p = _random_problem(5, models=3, devices=2, units=(3, 6))
    sched = list_schedule(p, "lrtf", device_ready=[5.0, 0.0], model_ready=[0.0, 3.0, 0.0],
                          tails=[0.0, 100.0, 0.0])
    check_schedule(p, sched)
    assert all(pl.start >= 5.0 for pl in sched if pl.device == 0)
    assert all(pl.start >= 3.0 for pl in sched if pl.model == 1)


@pytest.mark.parametrize("scheme", ["aggregate", "rolling"])
def test_large_instances_use_a_scheme_and_stay_valid(scheme: str) -> None:
    p = _random_problem(11, models=6, devices=3, units=(50, 150), hetero_speed=True)
    sol = solve(p, "cp-sat", 3.0, scheme=scheme, direct_max_units=100, max_blocks=60, window=6)
    check_schedule(p, sol.schedule)
    assert sol.extra["scheme"] == scheme
    assert sol.makespan <= sol.greedy_makespan * (1 + EPS)
    assert sol.makespan >= sol.lower_bound * (1 - EPS)


def test_aggregate_then_expand_is_valid() -> None:
    p = _random_problem(2, models=4, devices=2, units=(10, 80))
    agg, ranges = aggregate(p, 20)
    assert agg.num_units <= 20
    assert [sum(hi - lo for lo, hi in r) for r in ranges] == [len(m.runtimes) for m in p.models]
    sched = expand(p, ranges, sharded_lrtf(agg))
    check_schedule(p, sched)


def test_milp_beyond_its_size_limit_aggregates() -> None:
    p = _random_problem(4, models=4, devices=2, units=(20, 30))
    sol = solve(p, "milp", 2.0)
    check_schedule(p, sol.schedule)
    assert sol.extra["scheme"] == "aggregate"
    assert sol.makespan <= sol.greedy_makespan * (1 + EPS)


def test_thousands_of_units_with_lrtf() -> None:
    p = _random_problem(9, models=10, devices=4, units=(500, 1500), hetero_speed=True)
    sol = solve(p, "lrtf", 1.0)
    check_schedule(p, sol.schedule)
    assert sol.makespan <= p.lower_bound() * 1.05


def test_solve_shards_file_contract(tmp_path: Path) -> None:
    data = {"devices": [{"name": "a", "speed": 1.0}, {"name": "b", "speed": 2.0}],
            "models": [{"name": "x", "units": [3, 1, 2]}, {"name": "y", "units": [2, 2]}]}
    f = tmp_path / "units.json"
    f.write_text(json.dumps(data))
    problem = load_problem(f)
    for method in ("cp-sat", "milp", "lrtf", "random"):
        out = solve_shards_file(str(f), method, 2.0)
        assert {"makespan", "lower_bound", "status", "schedule"} <= set(out)
        assert set(out["schedule"][0]) >= {"model", "unit", "device", "start", "end"}
        check_schedule(problem, placements_from_output(problem, out))
        assert out["makespan"] >= out["lower_bound"] * (1 - EPS)
        json.dumps(out)
    with pytest.raises(InputError, match="method"):
        solve_shards_file(str(f), "gurobi", 1.0)
    with pytest.raises(InputError, match="positive"):
        solve_shards_file(str(f), "lrtf", 0)
    with pytest.raises(InputError):
        solve_shards_file(str(tmp_path / "none.json"), "lrtf", 1.0)
