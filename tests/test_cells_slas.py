"""Guaranteed jobs, SLAs and tenant quotas in the cells formulation (the default), through
its doors: ``solve-round --tenants``, ``simulate --tenants``, the library's round, and the
POP-partitioned solve. The rule is the plans formulation's (formulations/sla.py); a round
without guaranteed jobs or quotas is exactly the plain cells' (checked graph by graph)."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.formulations.candidates import build_candidates
from apportion.formulations.cells import build_cells_model
from apportion.formulations.schema import cells_of, job_node
from apportion.formulations.sla import SlaOptions, apply_slas
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round
from apportion.policies.formulation import choice_vector
from apportion.solvers.greedy import GreedyCells
from apportion.solvers.partition import Part, split_quotas
from apportion.validator import validate

runner = CliRunner()

ONE_A100_NODE = {"node_groups": [{"prefix": "a", "count": 1, "gpu_type": "A100-40GB",
                                  "gpus_per_node": 8, "cpus_per_node": 96,
                                  "host_memory_gib": 1024}]}
V100_NODE = {"prefix": "v", "count": 1, "gpu_type": "V100-32GB", "gpus_per_node": 8,
             "cpus_per_node": 96, "host_memory_gib": 1024}


def _guaranteed(jid: str, submit: float) -> dict:
    return {"id": jid, "model": "gpt2-1.5b", "global_batch_size": 32, "iterations": 5000,
            "requested_gpus": 8, "requested_gpu_type": "A100-40GB", "tenant": "a",
            "guaranteed": True, "submit_time_s": submit}


def _best_effort(jid: str, model: str) -> dict:
    batch = 64 if model.startswith("vit") else 32
    return {"id": jid, "model": model, "global_batch_size": batch, "iterations": 300,
            "requested_gpus": 4, "tenant": "b"}


def _write(tmp: Path, cluster: dict, jobs: list[dict], quota: int = 8) -> list[str]:
    (tmp / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp / "j.yaml").write_text(yaml.safe_dump({"jobs": jobs}))
    (tmp / "t.yaml").write_text(yaml.safe_dump({"tenants": [{"name": "a",
                                                             "quota_gpus": quota}]}))
    return ["solve-round", "--cluster", str(tmp / "c.yaml"), "--jobs", str(tmp / "j.yaml"),
            "--no-isolate", "--tenants", str(tmp / "t.yaml")]


def _solve(argv: list[str], tmp: Path) -> tuple[dict, dict]:
    out, problem = tmp / "d.json", tmp / "p.json"
    r = runner.invoke(app, [*argv, "--json", str(out), "--dump-problem", str(problem)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), json.loads(problem.read_text())


def test_a_guaranteed_job_in_quota_runs_on_an_sla_cell_before_best_effort_work(
        tmp_path: Path) -> None:
    """On main the default formulation refused --tenants (exit 2), and without it the four
    best-effort jobs took the node's 8 GPUs (four place bonuses beat one): the guaranteed
    job waited. Now it runs first, on the speed it asked for; the second guaranteed job of
    its tenant is over the quota."""
    jobs = [_best_effort("b1", "bert-336m"), _best_effort("b2", "bert-336m"),
            _best_effort("b3", "vit-86m"), _best_effort("b4", "vit-86m"),
            _guaranteed("g1", 10.0), _guaranteed("g2", 20.0)]
    d, problem = _solve(_write(tmp_path, ONE_A100_NODE, jobs), tmp_path)
    placed = {a["job"]: a for a in d["allocations"]}
    assert set(placed) == {"g1"}
    g1 = placed["g1"]
    assert (g1["gpu_type"], g1["gpus"]) == ("A100-40GB", 8)
    pending = {p["job"]: p["reason"] for p in d["pending"]}
    assert pending["g2"] == "quota"
    # every cell g1 was offered keeps its SLA and draws on its tenant's quota; g2's none
    cands = {j["job"]: j["candidates"] for j in problem["jobs"]}
    assert cands["g1"] and all(c["quota_tenant"] == "a" and c["gpus"] == 8
                               and c["gpu_type"] == "A100-40GB" for c in cands["g1"])
    assert all(c["quota_tenant"] is None for c in cands["g2"])
    assert problem["quotas"] == {"a": 8}


def test_an_over_quota_guaranteed_job_runs_best_effort(tmp_path: Path) -> None:
    cluster = {"node_groups": [*ONE_A100_NODE["node_groups"], V100_NODE]}
    d, problem = _solve(_write(tmp_path, cluster, [_guaranteed("g1", 10.0),
                                                   _guaranteed("g2", 20.0)]), tmp_path)
    placed = {a["job"]: a for a in d["allocations"]}
    assert (placed["g1"]["gpu_type"], placed["g1"]["gpus"]) == ("A100-40GB", 8)
    # g2 is best-effort: the slower type it would never get as guaranteed is its to take
    assert placed["g2"]["gpu_type"] == "V100-32GB"
    cands = {j["job"]: j["candidates"] for j in problem["jobs"]}
    assert {c["gpu_type"] for c in cands["g2"]} >= {"V100-32GB"}


def test_tenants_with_a_formulation_that_keeps_no_quotas_is_refused_by_name(
        tmp_path: Path) -> None:
    argv = _write(tmp_path, ONE_A100_NODE, [_guaranteed("g1", 0.0)])
    r = runner.invoke(app, [*argv, "--formulation", "gavel", "--json", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--tenants" in r.stderr and "gavel" in r.stderr
    assert "cells" in r.stderr and "deadline" in r.stderr  # it names those that keep them
    # the deadline formulation keeps guaranteed jobs and quotas too (issue 61 item 9)
    r = runner.invoke(app, [*argv, "--formulation", "deadline", "--json", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output


def test_simulate_takes_tenants_with_the_default_policy(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"tenants": [
        {"name": "A", "quota_gpus": 8}, {"name": "B", "quota_gpus": 16}]}))
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "morphling-mt", "--cluster", "morphling-64",
                            "--policy", "apportion", "--max-jobs", "6", "--tenants",
                            str(tmp_path / "t.yaml"),
                            "--deterministic", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["policy"] == "apportion" and s["sla_jobs"] > 0


# -- the rule on the graph -------------------------------------------------------------------
def _cluster() -> Cluster:
    return Cluster("q", [NodeGroup("a", 2, "A100-40GB", 4, 64, 512.0),
                         NodeGroup("v", 2, "V100-32GB", 4, 48, 256.0)])


MODELS = ["bert-336m", "vit-86m", "gpt2-1.5b", "roberta-355m"]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[JobSpec], dict[str, int]]:
    jobs = [JobSpec(f"j{i}", draw(st.sampled_from(MODELS)), 32, draw(st.sampled_from([100, 2000])),
                    draw(st.sampled_from([1, 2, 4, 8])),
                    draw(st.sampled_from([None, "A100-40GB", "V100-32GB"])),
                    submit_time_s=float(i), tenant=draw(st.sampled_from(["a", "b"])),
                    guaranteed=draw(st.booleans()))
            for i in range(draw(st.integers(1, 6)))]
    return jobs, {"a": draw(st.sampled_from([1, 2, 4, 8])), "b": draw(st.sampled_from([4, 16]))}


def _guaranteed_gpus(g: nx.DiGraph, cells: list[str]) -> dict[str, int]:
    used: dict[str, int] = {}
    for cn in cells:
        t = g.nodes[cn].get("quota_tenant")
        if t is not None:
            used[t] = used.get(t, 0) + int(g.nodes[cn]["gpus"])
    return used


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rounds())
def test_the_quota_rows_hold_in_every_answer(case: tuple[list[JobSpec], dict[str, int]]) -> None:
    """Guaranteed GPUs per tenant never pass its quota: in the model's rows (every backend's
    answer and the greedy floor are checked against them), in the round's decision, and in
    the greedy's own answer; and every guaranteed job placed keeps its promised speed."""
    jobs, quotas = case
    cl = _cluster()
    r = run_round(cl, jobs, 60.0, RoundConfig(backend="highs", quotas=quotas, isolate=False,
                                              time_budget_s=30.0, deterministic=True))
    d = r.decision
    assert validate(d, cl, jobs).ok
    g = r.graph
    assert g.graph["quotas"] == quotas
    used: dict[str, int] = {}
    for a in d.allocations:
        jd = g.nodes[job_node(a.job)]
        if jd.get("guaranteed"):
            assert a.est_throughput >= jd["sla_throughput"] * (1 - 1e-6)
            used[jd["tenant"]] = used.get(jd["tenant"], 0) + a.gpus
    assert all(n <= quotas[t] for t, n in used.items())
    model = build_cells_model(g)
    assert {r.name for r in model.rows if r.name.startswith("quota[")} <= \
        {f"quota[{t}]" for t in quotas}
    choices, _, _ = GreedyCells().solve(g)
    assert not model.violations(choice_vector(model, choices))
    assert all(n <= quotas[t] for t, n in _guaranteed_gpus(g, [c.cell for c in choices]).items())


def test_a_graph_without_guaranteed_jobs_or_quotas_is_left_as_it_was() -> None:
    cl = _cluster()
    jobs = [JobSpec(f"j{i}", m, 32, 500, n, tenant="a", submit_time_s=float(i))
            for i, (m, n) in enumerate([("bert-336m", 2), ("vit-86m", 4), ("gpt2-1.5b", 8)])]
    g = build_candidates(cl, jobs, 30.0)
    before = (list(g.nodes(data=True)), list(g.edges(data=True)), dict(g.graph))
    before = json.dumps(before, sort_keys=True, default=repr)
    apply_slas(g, jobs, 30.0, None, SlaOptions())
    after = json.dumps((list(g.nodes(data=True)), list(g.edges(data=True)), dict(g.graph)),
                       sort_keys=True, default=repr)
    assert after == before


def test_a_lost_sla_is_best_effort() -> None:
    """A guaranteed job that waited past its SLA window keeps its slower cells, no priority."""
    cl = _cluster()
    job = JobSpec("late", "bert-336m", 32, 200, 4, "A100-40GB", tenant="a", guaranteed=True)
    g = build_candidates(cl, [job], 10 * 3600.0)
    n = len(cells_of(g, "late"))
    apply_slas(g, [job], 10 * 3600.0, {"a": 4}, SlaOptions())
    jd = g.nodes[job_node("late")]
    assert jd["sla_lost"] and not jd["guaranteed"] and len(cells_of(g, "late")) == n
    assert all(g.nodes[c].get("quota_tenant") is None for c in cells_of(g, "late"))


# -- POP: quotas span the parts --------------------------------------------------------------
def test_quota_shares_of_the_parts_sum_to_at_most_the_quota() -> None:
    cl = _cluster()
    jobs = [JobSpec(f"g{i}", "bert-336m", 32, 500, 2, tenant="a", guaranteed=True,
                    submit_time_s=float(i)) for i in range(3)]
    g = build_candidates(cl, jobs, 0.0)
    apply_slas(g, jobs, 0.0, {"a": 7}, SlaOptions())
    parts = [Part(jobs=["g0", "g1"]), Part(jobs=["g2"]), Part()]
    shares = split_quotas(g, parts)
    assert sum(s["a"] for s in shares) == 7
    assert shares[0]["a"] >= 4 and shares[1]["a"] >= 2 and shares[2]["a"] == 0
    g.graph["quotas"] = {"a": 3}  # needs beyond the quota: each part its share, rounded down
    assert sum(s["a"] for s in split_quotas(g, parts)) <= 3


def test_a_partitioned_round_keeps_the_quota() -> None:
    """Each part alone would give its guaranteed job 8 GPUs (room, and faster): 16 against
    the quota's 8, an answer the whole model's row rejects (the round fell back to the
    greedy before the quota was split). With the split, POP's own answer keeps it."""
    cl = Cluster("pop", [NodeGroup("a", 4, "A100-40GB", 4, 64, 512.0)])
    jobs = [JobSpec(f"g{i}", "gpt2-1.5b", 32, 5000, 4, "A100-40GB", tenant="a",
                    guaranteed=True, submit_time_s=float(i)) for i in range(2)]
    r = run_round(cl, jobs, 0.0, RoundConfig(quotas={"a": 8}, partitions=2,
                                             time_budget_s=60.0))
    d = r.decision
    assert validate(d, cl, jobs).ok
    assert d.report.backend == "pop-2" and not d.report.fallback, d.report.fallback_reason
    assert sorted(a.gpus for a in d.allocations) == [4, 4]
