"""The partitioned (POP-style) round and the budget: recombination, repair, honest gaps.

Every answer is decoded and checked by the independent validator; the gap is against
the whole round's LP relaxation, which must bound the exact optimum and POP alike.
The Ray tests run a real local Ray instance of their own (own temporary directory,
ports Ray picks) and shut it down.
"""

from __future__ import annotations

import os
import time

import pytest
from apportion.formulations.candidates import build_candidates
from apportion.formulations.cells import build_cells_model
from apportion.formulations.decode import to_decision
from apportion.formulations.schema import cells_of, job_node, jobs_in
from apportion.solvers.base import Status
from apportion.solvers.highs import HighsBackend
from apportion.solvers.partition import (
    LocalEngine,
    partition_round,
    repair,
    solve_partitioned,
    subgraph,
)
from apportion.validator import validate

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import SolveReport
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round


def cluster() -> Cluster:
    return Cluster("pop", [NodeGroup("a100", 6, "A100-40GB", 4, 64, 512.0, "nvlink", 600.0, 25.0),
                           NodeGroup("a40", 8, "A40", 2, 48, 256.0, "pcie", 32.0, 12.5)])


def jobs(n: int = 40) -> list[JobSpec]:
    models = ["bert-0.76b", "wresnet-0.5b", "moe-0.69b"]
    out = [JobSpec(f"j{i}", models[i % 3], 256, 1000 + 37 * i, [1, 2, 4, 8][i % 4],
                   submit_time_s=float(i)) for i in range(n)]
    # two running jobs, one spread over two nodes: each must stay with its nodes
    out[0] = JobSpec("j0", "bert-0.76b", 256, 5000, 8, "A100-40GB", running=RunningState(
        "A100-40GB", 8, 1, {"a100-0": 4, "a100-1": 4}, 4))
    out[1] = JobSpec("j1", "wresnet-0.5b", 256, 5000, 2, "A40", running=RunningState(
        "A40", 2, 1, {"a40-3": 2}, 1))
    return out


def _valid(g, choices, cl, js) -> bool:  # type: ignore[no-untyped-def]
    dec = to_decision(g, choices, cl, js, SolveReport("-", "-", None, None, None, 0.0, False))
    return validate(dec, cl, js).ok


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_parts_are_disjoint_balanced_and_keep_running_jobs_with_their_nodes(k: int) -> None:
    cl, js = cluster(), jobs()
    g = build_candidates(cl, js, 100.0)
    parts = partition_round(g, k)
    nodes = [n for p in parts for n in p.nodes]
    ids = [j for p in parts for j in p.jobs]
    assert sorted(nodes) == sorted(n for n, d in g.nodes(data=True) if d["kind"] == "node")
    assert sorted(ids) == sorted(jobs_in(g)) and len(set(ids)) == len(ids)
    where = {n: i for i, p in enumerate(parts) for n in p.nodes}
    home = {j: i for i, p in enumerate(parts) for j in p.jobs}
    assert where["node:a100-0"] == where["node:a100-1"] == home["j0"]
    assert where["node:a40-3"] == home["j1"]
    gpus = [p.gpus for p in parts]
    assert max(gpus) - min(gpus) <= 12  # within about one node of a kind of each other
    for p in parts:  # each sub-graph holds only its part's nodes and jobs
        sg = subgraph(g, p)
        assert {n for n, d in sg.nodes(data=True) if d["kind"] == "node"} == set(p.nodes)
        assert sorted(jobs_in(sg)) == sorted(p.jobs)
        for gv, d in sg.nodes(data=True):
            if d["kind"] == "group":
                assert set(d["nodes"]) <= set(p.nodes)


def test_pop_answer_is_valid_and_its_bound_bounds_the_exact_optimum() -> None:
    cl, js = cluster(), jobs()
    g = build_candidates(cl, js, 100.0)
    model = build_cells_model(g)
    exact = HighsBackend().solve(model, 30)
    assert exact.status is Status.OPTIMAL and exact.objective is not None
    eng = LocalEngine(2).start()
    try:
        best, attempts = solve_partitioned(g, model, 3, build_cells_model, eng, 60.0,
                                           accept=lambda r: _valid(g, r.extra["choices"], cl, js))
    finally:
        eng.close()
    pop = attempts[0]
    assert pop.backend == "pop-3" and best is pop and pop.status.has_solution
    assert _valid(g, pop.extra["choices"], cl, js)
    assert pop.bound is not None and pop.objective is not None
    # the whole round's LP bounds the exact optimum, which bounds POP: the gap is honest
    assert pop.objective <= exact.objective + 1e-6 <= pop.bound + 2e-6
    assert attempts[1].backend == "lp-round" and attempts[1].x is None  # a bound, not an answer
    assert len(pop.extra["parts"]) == 3
    kept = {c.job: c.placement for c in pop.extra["choices"]}
    assert kept.get("j0") in (None, {"a100-0": 4, "a100-1": 4})


def test_repair_places_left_out_jobs_only_where_capacity_is_left() -> None:
    cl, js = cluster(), jobs(12)
    g = build_candidates(cl, js, 100.0)
    choices, added = repair(g, [])
    assert added == len(choices) > 0
    assert _valid(g, choices, cl, js)
    again, more = repair(g, choices)  # nothing more fits where everything placeable is placed
    assert _valid(g, again, cl, js) and len(again) == len(choices) + more
    for c in choices:
        assert c.cell in cells_of(g, c.job) and g.nodes[job_node(c.job)]["reason"] is None


def test_solve_round_partitioned_through_the_pipeline() -> None:
    cl, js = cluster(), jobs()
    res = run_round(cl, js, 100.0, RoundConfig(time_budget_s=60.0, partitions=2))
    rep = res.decision.report
    assert rep.backend == "pop-2" and not rep.fallback
    assert validate(res.decision, cl, js).ok
    assert rep.gap is not None and rep.bound is not None and rep.bound >= rep.objective - 1e-6


def test_the_isolated_chain_answers_within_its_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A backend that ignores its budget is killed at the deadline; earlier answers stand."""
    from apportion.solvers.chain import solve_chain
    from apportion.solvers.isolation import IsolatedBackend

    cl, js = cluster(), jobs()
    g = build_candidates(cl, js, 100.0)
    model = build_cells_model(g)
    # the first answer is never a proof (a proof would end the chain before the sleeper)
    chain = [IsolatedBackend("tests.test_solver_isolation:UnprovenBackend"),
             IsolatedBackend("tests.test_solver_isolation:SleepBackend")]
    t0 = time.perf_counter()
    # never stop early; 15 s: a child's start (imports) under a loaded machine comes out of it
    best, attempts = solve_chain(model, chain, 15.0, gap=-1.0)
    wall = time.perf_counter() - t0
    # killed, not waited for: the sleeper sleeps an hour (no tighter bound on the wall: how
    # long the kill and the pipe take depends on the machine's load, and the test must not)
    assert wall < 600, wall
    assert attempts[0].backend == "unproven" and best is attempts[0], attempts
    assert attempts[0].status is Status.FEASIBLE and len(attempts) == 2, attempts
    assert attempts[1].status is Status.ERROR and "killed at the deadline" in attempts[1].message
    assert _valid(g, model.decode(best.x), cl, js)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        pytest.skip("a Ray instance is already attached in this process")
    tmp = f"/tmp/ray-t{os.getpid()}"
    ray.init(address="local", _temp_dir=tmp, include_dashboard=False, log_to_driver=False,
             num_cpus=2)
    yield ray
    ray.shutdown()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def test_pop_on_a_real_local_ray_cluster(local_ray) -> None:  # type: ignore[no-untyped-def]
    from apportion.solvers.ray_engine import RayEngine

    cl, js = cluster(), jobs()
    g = build_candidates(cl, js, 100.0)
    model = build_cells_model(g)
    eng = RayEngine()  # attaches to the instance the fixture started; never shuts it down
    assert not eng.owned
    best, _ = solve_partitioned(g, model, 2, build_cells_model, eng, 120.0,
                                accept=lambda r: _valid(g, r.extra["choices"], cl, js))
    eng.close()
    assert local_ray.is_initialized()
    assert best is not None and best.backend == "pop-2" and best.extra["engine"] == "ray"
    assert all("error" not in p for p in best.extra["parts"])
    assert best.bound is not None and best.objective <= best.bound + 1e-6
    # a deterministic budget: the same answer from Ray's workers as from local processes
    answers = []
    for engine in (RayEngine(), LocalEngine(2).start()):
        try:
            det, _ = solve_partitioned(g, model, 2, build_cells_model, engine, 120.0, work_s=4.0)
        finally:
            engine.close()
        assert det is not None and det.extra["time_limited"] is False
        answers.append((sorted((c.job, c.cell, tuple(sorted(c.placement.items())))
                               for c in det.extra["choices"]), det.objective, det.bound))
    assert answers[0] == answers[1]


def test_compare_runs_over_ray_and_resumes(local_ray, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from apportion.experiments.harness import compare

    kw = {"show_progress": False, "plots": False, "engine": "ray", "max_jobs": 6}
    root = compare("synthetic:6", "crius-testbed", ["fcfs", "srtf"], 1, tmp_path / "out", **kw)
    first = (root / "fcfs-s0" / "summary.json").stat().st_mtime_ns
    assert (root / "summary.md").exists() and (root / "srtf-s0" / "jobs.csv").exists()
    assert "fcfs" in (root / "summary.md").read_text()
    compare("synthetic:6", "crius-testbed", ["fcfs", "srtf"], 1, tmp_path / "out", **kw)
    assert (root / "fcfs-s0" / "summary.json").stat().st_mtime_ns == first  # not redone
