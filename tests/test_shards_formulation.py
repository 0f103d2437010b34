"""Hydra shard-unit formulation: loading, graph, bounds, the big-M MILP, the validator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from apportion.formulations.shards import (
    MILP_MAX_UNITS,
    Placement,
    ShardDevice,
    ShardModel,
    ShardProblem,
    build_milp,
    chain_runtimes,
    load_problem,
    orders_of,
    problem_from_dict,
    problem_to_dict,
    schedule_from_orders,
    unit_graph,
)
from apportion.solvers.shards import sharded_lrtf
from apportion.solvers.shards_validator import InvalidSchedule, check_schedule, validate_schedule
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.errors import InputError

VALID = {
    "devices": [{"name": "a100", "speed": 2.0}, {"name": "v100", "speed": 1.0}],
    "models": [{"name": "bert", "units": [1.0, 2.0, 3.0]}, {"name": "vit", "units": [4.0]}],
}


@st.composite
def problems(draw: st.DrawFn, max_models: int = 3, max_units: int = 4,
             with_memory: bool = True) -> ShardProblem:
    n_dev = draw(st.integers(1, 3))
    speeds = [draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])) for _ in range(n_dev)]
    mems = [draw(st.sampled_from([math.inf, 100.0, 40.0])) if with_memory else math.inf
            for _ in range(n_dev)]
    mems[0] = math.inf  # every unit fits somewhere
    devices = [ShardDevice(f"d{p}", s, m) for p, (s, m) in enumerate(zip(speeds, mems))]
    models = []
    for i in range(draw(st.integers(1, max_models))):
        n = draw(st.integers(1, max_units))
        rt = tuple(float(draw(st.integers(1, 9))) for _ in range(n))
        mem = tuple(float(draw(st.sampled_from([10, 50, 90]))) for _ in range(n)) \
            if with_memory and draw(st.booleans()) else ()
        models.append(ShardModel(f"m{i}", rt, mem))
    return ShardProblem(devices, models)


def test_load_valid_file(tmp_path: Path) -> None:
    f = tmp_path / "u.json"
    f.write_text(json.dumps(VALID))
    p = load_problem(f)
    assert [d.name for d in p.devices] == ["a100", "v100"]
    assert p.num_units == 4
    assert p.duration(0, 2, 0) == 1.5
    assert problem_from_dict(problem_to_dict(p)).models == p.models


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (lambda d: d.pop("devices"), "devices"),
        (lambda d: d["devices"][1].update(speed=0), "devices[1].speed"),
        (lambda d: d["devices"][0].update(speed="fast"), "devices[0].speed"),
        (lambda d: d["devices"][1].update(name="a100"), "devices[1].name"),
        (lambda d: d["models"][1].update(units=[]), "models[1].units"),
        (lambda d: d["models"][0]["units"].__setitem__(2, -1), "models[0].units[2]"),
        (lambda d: d["models"][0]["units"].__setitem__(1, True), "models[0].units[1]"),
        # NaN is refused by the JSON reader itself, at its line and column
        (lambda d: d["models"][0]["units"].__setitem__(0, float("nan")), "line 1, column 117"),
        (lambda d: d["models"][0].update(memory=[1, 2]), "models[0].memory"),
        (lambda d: d.update(buffer_fraction=1.5), "buffer_fraction"),
        (lambda d: (d["devices"][0].update(memory=100), d["devices"][1].update(memory=100),
                    d["models"][0].update(memory=[10, 90, 10])), "models[0].memory[1]"),
        (lambda d: d["models"].append("x"), "models[2]"),
    ],
)
def test_bad_input_names_the_field(patch, field: str, tmp_path: Path) -> None:
    data = json.loads(json.dumps(VALID))
    patch(data)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_problem(f)
    assert err.value.field == field
    assert err.value.source == str(f)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_problem(tmp_path / "missing.json")
    f = tmp_path / "x.json"
    f.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_problem(f)


def test_chain_runtimes_forward_then_backward_reversed() -> None:
    assert chain_runtimes([1, 2, 3], [10, 20, 30], minibatches=2) == [1, 2, 3, 30, 20, 10] * 2


def test_unit_graph_and_bounds() -> None:
    """The shard-unit graph: unit and device vertices, precedence and runs-on edges."""
    from apportion import shards_spec as ss

    p = problem_from_dict(VALID)
    g = unit_graph(p)
    units = [n for n, d in g.nodes(data=True) if d["kind"] == "unit"]
    devices = [n for n, d in g.nodes(data=True) if d["kind"] == "device"]
    assert len(units) == 4 and len(devices) == 2
    kinds = [d["kind"] for _, _, d in g.edges(data=True)]
    assert kinds.count("precedence") == 2 and kinds.count("runs-on") == 8
    u = ss.unit_key(0, 2)
    assert g.nodes[u]["runtime"] == 3.0 and g.nodes[u]["model"] == "bert"
    assert ss.runs_on(g, u) == [(0, 1.5), (1, 3.0)]
    assert ss.chains(g) == [[ss.unit_key(0, j) for j in range(3)], [ss.unit_key(1, 0)]]
    assert ss.lower_bound(g) == pytest.approx(p.lower_bound())
    assert ss.problem_from_graph(g).models == p.models
    assert p.work_bound() == pytest.approx(10.0 / 3.0)
    assert p.chain_bound() == pytest.approx(3.0)
    assert p.lower_bound() == pytest.approx(10.0 / 3.0)


def test_memory_restricts_eligibility() -> None:
    p = ShardProblem([ShardDevice("big", 1.0, 100.0), ShardDevice("small", 4.0, 50.0)],
                     [ShardModel("m", (1.0, 1.0), (80.0, 10.0))])
    assert p.eligible(0, 0) == [0] and p.eligible(0, 1) == [0, 1]
    assert p.chain_bound() == pytest.approx(1.25)  # unit 0 only on the slow big device


def test_validator_catches_each_rule() -> None:
    p = ShardProblem([ShardDevice("d0", 1.0, 100.0), ShardDevice("d1", 1.0, 10.0)],
                     [ShardModel("a", (2.0, 2.0), (5.0, 50.0)), ShardModel("b", (1.0,))])
    good = [Placement(0, 0, 1, 0, 2), Placement(0, 1, 0, 2, 4), Placement(1, 0, 0, 0, 1)]
    assert validate_schedule(p, good) == []
    cases = {
        "overlap": [Placement(0, 0, 0, 0, 2), Placement(0, 1, 0, 2, 4), Placement(1, 0, 0, 1, 2)],
        "before unit": [Placement(0, 0, 1, 0, 2), Placement(0, 1, 0, 1, 3), Placement(1, 0, 0, 3, 4)],
        "double-buffer": [Placement(0, 0, 0, 0, 2), Placement(0, 1, 1, 2, 4),
                          Placement(1, 0, 0, 2, 3)],
        "not scheduled": good[:2],
        "needs 2s": [Placement(0, 0, 1, 0, 3), Placement(0, 1, 0, 3, 5), Placement(1, 0, 0, 0, 1)],
        "twice": good + [good[0]],
        "< 0": [Placement(0, 0, 1, -1, 1), Placement(0, 1, 0, 2, 4), Placement(1, 0, 0, 0, 1)],
    }
    for needle, sched in cases.items():
        bad = validate_schedule(p, sched)
        assert any(needle in b for b in bad), (needle, bad)
        with pytest.raises(InvalidSchedule):
            check_schedule(p, sched)


def test_schedule_from_orders_rejects_cycles() -> None:
    p = ShardProblem([ShardDevice("d", 1.0)], [ShardModel("a", (1.0, 1.0))])
    with pytest.raises(ValueError, match="cycle"):
        schedule_from_orders(p, {(0, 0): 0, (0, 1): 0}, [[(0, 1), (0, 0)]])


@settings(max_examples=40, deadline=None)
@given(problems())
def test_milp_accepts_the_greedy_hint_and_decodes_it(p: ShardProblem) -> None:
    """The LRTF schedule is a feasible point of the MILP, and decoding it gives a valid
    schedule no longer than the hint: the model and the decoder agree."""
    hint = sharded_lrtf(p)
    check_schedule(p, hint)
    lm = build_milp(p, hint=hint)
    x = np.array([lm.hint[k] for k in range(lm.num_vars)])
    assert lm.is_feasible(x, tol=1e-6)
    assert lm.decode is not None
    back = lm.decode(x)
    check_schedule(p, back)
    assert max(q.end for q in back) <= max(q.end for q in hint) + 1e-9
    assignment, orders = orders_of(hint, len(p.devices))
    assert schedule_from_orders(p, assignment, orders) == sorted(
        hint, key=lambda q: (q.start, q.end, q.model, q.unit))


def test_milp_size_limit() -> None:
    p = ShardProblem([ShardDevice("d", 1.0)], [ShardModel("a", (1.0,) * (MILP_MAX_UNITS + 1))])
    with pytest.raises(ValueError, match="MILP limit"):
        build_milp(p)
