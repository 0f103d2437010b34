"""`apportion solve-round` end to end through the real CLI (in-process typer runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import default_jobs
from apportion.solvers.chain import MIP_REL_GAP

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_default_round_writes_contract_json(tmp_path: Path) -> None:
    out, dump = tmp_path / "d.json", tmp_path / "p.json"
    r = _run("solve-round", "--json", str(out), "--dump-problem", str(dump), "--time-budget", "10",
             "--deterministic")
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    for key in ("backend", "status", "objective", "bound", "gap", "wall_s", "fallback"):
        assert key in d["solver"]
    # proved optimal, within the chain's tolerance of the bound, or the rounded LP's answer
    # taken as final on the cell model (the default queue asks for more GPUs than the
    # cluster has), which the attempts say
    sol = d["solver"]
    assert sol["status"] == "optimal" or (sol["status"] == "feasible" and (
        sol["gap"] <= MIP_REL_GAP or (sol["backend"] == "lp-round" and any(
            a["message"] == "skipped: LP rounding answered" for a in sol["attempts"])))), sol
    # a backend the chain did not run is `skipped`, never `error` (an alert on errors would
    # fire on every round); it names why
    for a in sol["attempts"]:
        if a["message"].startswith(("skipped", "no budget left", "no work budget left")):
            assert a["status"] == "skipped", a
        assert a["status"] != "error", a
    assert d["allocations"] and isinstance(d["pending"], list)
    for a in d["allocations"]:
        for key in ("job", "gpu_type", "gpus", "stages", "plan", "placement", "est_throughput"):
            assert key in a
        assert {"dp", "tp", "pp"} <= set(a["plan"])
        assert a["plan"]["dp"] * a["plan"]["tp"] * a["plan"]["pp"] == a["gpus"]
        assert sum(a["placement"].values()) == a["gpus"]
    for p in d["pending"]:
        assert {"job", "reason"} <= set(p)
    ids = {a["job"] for a in d["allocations"]} | {p["job"] for p in d["pending"]}
    assert ids == {j.id for j in default_jobs()[0]}
    prob = json.loads(dump.read_text())
    assert prob["jobs"] and all("normalization" in j for j in prob["jobs"])
    for j in prob["jobs"]:
        for c in j["candidates"]:
            assert {"gpu_type", "gpus", "stages", "est_throughput"} <= set(c)
    assert "job" in r.stdout and "placement" in r.stdout


def _resolve(prob: dict) -> float:
    """The dumped round re-solved by a tiny independent model: one cell per job, every GPU
    of a chosen cell placed, node GPUs, and the host CPUs, memory and tenant quotas the
    dump gives (the plans formulation's rows)."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    cap = {n["name"]: n["capacity"] for n in prob["nodes"]}
    host = {n["name"]: (n.get("cpus"), n.get("host_memory_gib")) for n in prob["nodes"]}
    members = {grp["name"]: grp["nodes"] for grp in prob["groups"]}
    node_terms: dict[str, list] = {n: [] for n in cap}
    cpu_terms: dict[str, list] = {n: [] for n in cap}
    mem_terms: dict[str, list] = {n: [] for n in cap}
    quota_terms: dict[str, list] = {}
    obj = []
    for j in prob["jobs"]:
        xs = []
        for c in j["candidates"]:
            x = h.addVariable(0, 1)
            h.changeColIntegrality(h.getNumCol() - 1, highspy.HighsVarType.kInteger)
            xs.append(x)
            obj.append((x, c["value"]))
            if c.get("quota_tenant") is not None:
                quota_terms.setdefault(c["quota_tenant"], []).append(c["gpus"] * x)
            ys = []
            tp = c["plan"]["tp"]
            allowed = dict(c["nodes"])  # pinned nodes of a running job's present cell
            for grp, mx in c["groups"].items():  # a group edge: any of its nodes, up to mx in all
                for node in members[grp]:
                    allowed[node] = min(cap[node], mx)
            for node, mx in allowed.items():
                y = h.addVariable(0, mx // tp)
                h.changeColIntegrality(h.getNumCol() - 1, highspy.HighsVarType.kInteger)
                ys.append(y)
                node_terms[node].append(tp * y)
                cpu_terms[node].append(tp * c.get("cpus_per_gpu", 0.0) * y)
                mem_terms[node].append(tp * c.get("host_mem_gib_per_gpu", 0.0) * y)
            h.addConstr(sum(tp * y for y in ys) == c["gpus"] * x)
        if xs:
            h.addConstr(sum(xs) <= 1)
    for n, terms in node_terms.items():
        if terms:
            h.addConstr(sum(terms) <= cap[n])
            cpus, mem = host[n]
            if cpus is not None:
                h.addConstr(sum(cpu_terms[n]) <= cpus)
            if mem is not None:
                h.addConstr(sum(mem_terms[n]) <= mem)
    for t, terms in quota_terms.items():
        if t in prob.get("quotas", {}):
            h.addConstr(sum(terms) <= prob["quotas"][t])
    h.maximize(sum(v * x for x, v in obj))
    return h.getInfo().objective_function_value


def test_problem_dump_resolves_independently(tmp_path: Path) -> None:
    """Re-solve the dumped problem with a tiny independent model and compare objectives."""
    out, dump = tmp_path / "d.json", tmp_path / "p.json"
    assert _run("solve-round", "--json", str(out), "--dump-problem", str(dump)).exit_code == 0
    prob, dec = json.loads(dump.read_text()), json.loads(out.read_text())
    assert _resolve(prob) == pytest.approx(dec["solver"]["objective"], abs=1e-4)


def test_plans_dump_resolves_independently(tmp_path: Path) -> None:
    """The plans formulation's dump holds its plans (ZeRO, offload, accumulation,
    recomputation), the CPUs and host memory each cell asks per GPU, every node's CPUs and
    memory and the tenants' quotas: enough to re-solve it (it used to lack all of them)."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [
        {"id": f"j{i}", "model": m, "global_batch_size": 256, "iterations": 5000,
         "requested_gpus": g, "tenant": "a" if i % 2 else "b", "guaranteed": i % 3 == 0}
        for i, (m, g) in enumerate([("bert-1.3b", 8), ("moe-0.69b", 4), ("wresnet-1b", 16),
                                    ("bert-336m", 2), ("gpt2-1.5b", 8), ("t5-1.2b", 8)])]}))
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants: [{name: a, quota_gpus: 16}, {name: b, quota_gpus: 24}]\n")
    out, dump = tmp_path / "d.json", tmp_path / "p.json"
    r = _run("solve-round", "--formulation", "plans", "--cluster", "morphling-64", "--jobs",
             str(jobs), "--tenants", str(tenants), "--json", str(out), "--dump-problem",
             str(dump), "--time-budget", "20", "--deterministic", "--mip-gap", "0")
    assert r.exit_code == 0, r.output
    prob, dec = json.loads(dump.read_text()), json.loads(out.read_text())
    assert prob["formulation"] == "plans" and prob["quotas"] == {"a": 16, "b": 24}
    cand = prob["jobs"][0]["candidates"][0]
    assert {"zero_stage", "offload", "accumulation", "checkpointing"} <= set(cand["plan"])
    assert cand["cpus_per_gpu"] > 0 and prob["nodes"][0]["cpus"] > 0
    assert dec["solver"]["status"] == "optimal", dec["solver"]
    assert _resolve(prob) == pytest.approx(dec["solver"]["objective"], rel=1e-6, abs=1e-4)


@pytest.mark.parametrize("backend", ["highs", "cp-sat", "greedy"])
def test_backends_from_the_cli(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "d.json"
    r = _run("solve-round", "--backend", backend, "--json", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["solver"]["backend"] == backend
    assert d["solver"]["fallback"] is False


BAD = {
    "malformed.yaml": ("jobs:\n  - id: a\n    model: [unclosed\n", "malformed YAML"),
    "unknown_gpu.yaml": None,  # cluster file, built below
    "unknown_model.yaml": ("jobs:\n  - {id: a, model: gpt-9, global_batch_size: 8, iterations: 1, "
                           "requested_gpus: 1}\n", "jobs[0].model"),
    "negative.yaml": ("jobs:\n  - {id: a, model: bert-336m, global_batch_size: 8, iterations: 1, "
                      "requested_gpus: -2}\n", "jobs[0].requested_gpus"),
    "duplicate.yaml": ("jobs:\n  - {id: a, model: bert-336m, global_batch_size: 8, iterations: 1, "
                       "requested_gpus: 1}\n  - {id: a, model: bert-336m, global_batch_size: 8, "
                       "iterations: 1, requested_gpus: 1}\n", "jobs[1].id"),
    "wrong_type.yaml": ("jobs:\n  - {id: a, model: bert-336m, global_batch_size: many, iterations: 1,"
                        " requested_gpus: 1}\n", "jobs[0].global_batch_size"),
    "not_a_mapping.yaml": ("- just\n- a list\n", "(top level)"),
}


@pytest.mark.parametrize("name", sorted(k for k, v in BAD.items() if v))
def test_bad_jobs_exit_2_name_the_field_and_write_nothing(tmp_path: Path, name: str) -> None:
    text, field = BAD[name]  # type: ignore[misc]
    f = tmp_path / name
    f.write_text(text)
    out = tmp_path / "d.json"
    r = _run("solve-round", "--jobs", str(f), "--json", str(out))
    assert r.exit_code == 2, r.output
    assert str(f) in r.stderr and field in r.stderr
    assert not out.exists()


def test_bad_cluster_names_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text("name: x\nnode_groups:\n  - {prefix: a, count: 2, gpu_type: Z900, gpus_per_node: 8}\n")
    out = tmp_path / "d.json"
    r = _run("solve-round", "--cluster", str(f), "--json", str(out))
    assert r.exit_code == 2
    assert "node_groups[0].gpu_type" in r.stderr and "Z900" in r.stderr
    assert not out.exists()


def test_unknown_backend_and_missing_output_dir_exit_2(tmp_path: Path) -> None:
    assert _run("solve-round", "--backend", "gurobi").exit_code == 2
    r = _run("solve-round", "--json", str(tmp_path / "no" / "such" / "d.json"))
    assert r.exit_code == 2 and "--json" in r.stderr


def test_job_that_fits_nowhere_is_pending_not_a_crash(tmp_path: Path) -> None:
    c = tmp_path / "c.yaml"
    c.write_text("node_groups:\n  - {prefix: t, count: 1, gpu_type: T4, gpus_per_node: 1, "
                 "intra_node_link: pcie}\n")
    j = tmp_path / "j.yaml"
    j.write_text("jobs:\n  - {id: big, model: llama-30b, global_batch_size: 8, iterations: 1, "
                 "requested_gpus: 1}\n")
    out = tmp_path / "d.json"
    r = _run("solve-round", "--cluster", str(c), "--jobs", str(j), "--json", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["allocations"] == [] and d["pending"][0]["reason"] == "no-fit-memory"


def test_catalog_commands() -> None:
    assert "llama2-7b" in _run("models").stdout
    assert "H100-80GB" in _run("gpus").stdout
