"""Hydra's formulations and solvers read the shard-unit graph (apportion.shards_spec)."""

from __future__ import annotations

import networkx as nx
import pytest
from apportion.formulations.shards import build_milp, makespan
from apportion.formulations.shards_cpsat import build_cpsat
from apportion.solvers.highs import HighsBackend
from apportion.solvers.shards import list_schedule, solve
from apportion.solvers.shards_validator import check_schedule

from apportion import shards_spec as ss


def hand_graph() -> nx.DiGraph:
    """Two models on two devices, written as the schema says (no ShardProblem)."""
    g = nx.DiGraph(models=["bert", "vit"], devices=["fast", "slow"], buffer_fraction=0.15,
                   source="<hand>")
    for p, (name, sp) in enumerate((("fast", 2.0), ("slow", 1.0))):
        g.add_node(ss.device_key(p), kind="device", name=name, index=p, speed=sp,
                   memory=float("inf"), budget=float("inf"))
    for i, (name, runtimes) in enumerate((("bert", (2.0, 4.0, 2.0)), ("vit", (3.0, 3.0)))):
        for j, r in enumerate(runtimes):
            u = ss.unit_key(i, j)
            g.add_node(u, kind="unit", model=name, model_index=i, index=j, runtime=r,
                       memory=0.0)
            if j:
                g.add_edge(ss.unit_key(i, j - 1), u, kind="precedence")
            for p, sp in ((0, 2.0), (1, 1.0)):
                g.add_edge(u, ss.device_key(p), kind="runs-on", duration=r / sp)
    return g


def test_schema_accessors_and_round_trip():
    g = hand_graph()
    assert ss.chains(g) == [[ss.unit_key(0, j) for j in range(3)],
                            [ss.unit_key(1, 0), ss.unit_key(1, 1)]]
    assert ss.runs_on(g, ss.unit_key(0, 1)) == [(0, 2.0), (1, 4.0)]
    p = ss.problem_from_graph(g)
    assert [m.runtimes for m in p.models] == [(2.0, 4.0, 2.0), (3.0, 3.0)]
    again = ss.shard_graph(p)
    assert set(again.nodes) == set(g.nodes) and set(again.edges) == set(g.edges)
    for u, v, d in g.edges(data=True):
        assert again.edges[u, v] == d
    assert ss.lower_bound(g) == pytest.approx(p.lower_bound())


@pytest.mark.parametrize("method", ["cp-sat", "milp", "lrtf"])
def test_solvers_take_the_graph(method):
    g = hand_graph()
    sol = solve(g, method, time_budget_s=5.0)
    check_schedule(ss.problem_from_graph(g), sol.schedule)
    assert sol.makespan >= ss.lower_bound(g) - 1e-9
    if method != "lrtf":
        assert sol.status.value == "optimal"


def test_eligibility_comes_from_the_runs_on_edges():
    """Drop a unit's edge to the fast device: every formulation keeps it off that device."""
    g = hand_graph()
    u = ss.unit_key(0, 1)
    g.remove_edge(u, ss.device_key(0))
    for sched in (list_schedule(g), solve(g, "cp-sat", 5.0).schedule,
                  solve(g, "milp", 5.0).schedule):
        pl = next(q for q in sched if (q.model, q.unit) == (0, 1))
        assert pl.device == 1 and pl.end - pl.start == pytest.approx(4.0)
    lm = build_milp(g)
    res = HighsBackend().solve(lm, 5.0)
    assert lm.decode is not None and res.x is not None
    assert all(q.device == 1 for q in lm.decode(res.x) if (q.model, q.unit) == (0, 1))
    built = build_cpsat(g)
    assert (u[1:], 0) not in built.presence
    assert makespan(list_schedule(g)) >= ss.lower_bound(g) - 1e-9
