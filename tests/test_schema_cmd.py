"""`apportion schema`: the JSON Schema of every input and output file, checked against what the
loaders accept and what the commands really write."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from apportion.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def schema(name: str | None = None) -> dict:
    r = runner.invoke(app, ["schema"] + ([name] if name else []))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def check(name: str, doc: object) -> list[str]:
    v = jsonschema.Draft202012Validator(schema(name))
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in v.iter_errors(doc)]


def run(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def test_every_schema_is_valid_json_schema_and_names_its_doors() -> None:
    doc = schema()
    assert set(doc) >= {"inputs", "outputs"}
    assert set(doc["inputs"]) >= {"cluster", "jobs", "tenants", "k8s-config", "gpu-map",
                                  "units", "finetune-tasks", "export-decision"}
    assert set(doc["outputs"]) >= {"decision", "problem", "simulate-summary", "status",
                                   "history", "export-k8s-index", "export-slurm-index",
                                   "compare-plots"}
    for kind in ("inputs", "outputs"):
        for name, s in doc[kind].items():
            jsonschema.Draft202012Validator.check_schema(s)
            assert s["title"] == f"apportion {name}" and s["description"].startswith(
                kind[:-1] + ": ")
            assert s == schema(name)  # one format alone is the same schema
    for name, s in doc["inputs"].items():  # strict loaders: unknown fields refused
        if name not in ("export-decision", "gpu-map"):  # extra keys ignored / a mapping
            assert s["additionalProperties"] is False, name


def test_readme_and_bundled_inputs_validate_and_a_typo_fails_both_doors(tmp_path: Path
                                                                         ) -> None:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    blocks = dict(re.findall(r"<!-- file: (\S+) -->\s*\n```\w*\n(.*?)```", text, re.DOTALL))
    for file, name in (("cluster.yaml", "cluster"), ("jobs.yaml", "jobs"),
                       ("tenants.yaml", "tenants")):
        assert check(name, yaml.safe_load(blocks[file])) == [], file
    data = ROOT / "apportion" / "data"
    assert check("cluster", yaml.safe_load((data / "default_cluster.yaml").read_text())) == []
    assert check("jobs", yaml.safe_load((data / "default_jobs.yaml").read_text())) == []
    for p in sorted((data / "clusters").glob("*.yaml")):
        assert check("cluster", yaml.safe_load(p.read_text())) == [], p.name
    # a misspelt field: the loader exits 2 naming it, and the schema refuses it too
    bad = yaml.safe_load(blocks["cluster.yaml"])
    bad["node_groups"][0]["gpus_per_nod"] = 8
    assert check("cluster", bad)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    r = runner.invoke(app, ["solve-round", "--cluster", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2 and "gpus_per_nod" in r.output
    assert check("k8s-config", {"namespace": "training", "kueue_api": "v1beta1",
                                "gang": "volcano"}) == []
    assert check("k8s-config", {"kueue_api": "v1alpha1"})
    assert check("gpu-map", {"a100_80g": "A100-80GB"}) == [] and check("gpu-map", {"x": 3})


def test_what_solve_round_writes_validates(tmp_path: Path) -> None:
    d, p = tmp_path / "d.json", tmp_path / "p.json"
    run("solve-round", "--backend", "greedy", "--json", str(d), "--dump-problem", str(p))
    decision = json.loads(d.read_text())
    assert check("decision", decision) == [] and check("problem", json.loads(p.read_text())) == []
    assert check("export-decision", decision) == []  # what export reads of it
    # the README's decision keys are required by the schema (a contract: only ever added)
    s = schema("decision")
    assert set(s["required"]) >= {"formulation", "solver", "allocations", "pending"}
    alloc = s["$defs"]["AllocationOut"]["required"]
    assert set(alloc) >= {"job", "gpu_type", "gpus", "stages", "plan", "placement",
                          "est_throughput", "action", "iter_time_s"}
    broken = dict(decision, allocations=[{k: v for k, v in decision["allocations"][0].items()
                                          if k != "placement"}])
    assert check("decision", broken)


def test_simulate_status_history_and_exports_validate(tmp_path: Path) -> None:
    summary = json.loads(run("simulate", "--trace", "synthetic:6", "--cluster", "crius-testbed",
                             "--policy", "fcfs", "--information", "oracle"))
    assert check("simulate-summary", summary) == []
    db = tmp_path / "s.db"
    jobs = ROOT / "apportion" / "data" / "default_jobs.yaml"
    run("submit", str(jobs), "--state", str(db))
    run("solve-round", "--state", str(db), "--backend", "greedy")
    assert check("status", json.loads(run("status", "--state", str(db), "--json"))) == []
    assert check("history", json.loads(run("history", "--state", str(db), "--json"))) == []
    (tmp_path / "c.yaml").write_text("node_groups: [{prefix: a, count: 2, gpu_type: A40, "
                                     "gpus_per_node: 4, cpus_per_node: 32}]\n")
    (tmp_path / "j.yaml").write_text("jobs: [{id: x, model: gpt-tiny, global_batch_size: 8, "
                                     "iterations: 10, requested_gpus: 4}]\n")
    (tmp_path / "dx.json").write_text(json.dumps({"allocations": [{
        "job": "x", "gpu_type": "A40", "gpus": 4, "plan": {"dp": 4},
        "placement": {"a-0": 4}, "iter_time_s": 2.0}]}))
    common = ["--decision", str(tmp_path / "dx.json"), "--cluster", str(tmp_path / "c.yaml"),
              "--jobs", str(tmp_path / "j.yaml")]
    run("export", "k8s", *common, "--out", str(tmp_path / "k8s"))
    run("export", "slurm", *common, "--out", str(tmp_path / "slurm"))
    for name, folder in (("export-k8s-index", "k8s"), ("export-slurm-index", "slurm")):
        assert check(name, json.loads((tmp_path / folder / "index.json").read_text())) == []


def test_compare_plots_json_validates(tmp_path: Path) -> None:
    r = runner.invoke(app, ["compare", "--trace", "synthetic:6", "--cluster", "crius-testbed",
                            "--policies", "fcfs", "--seeds", "1", "--out", str(tmp_path),
                            "--information", "oracle", "--workers", "1"])
    assert r.exit_code == 0, r.output
    root = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert check("compare-plots", json.loads((root / "plots.json").read_text())) == []
    assert check("simulate-summary", json.loads((root / "fcfs-s0" / "summary.json")
                                                .read_text())) == []


def test_unknown_name_exits_2_and_out_writes_a_file(tmp_path: Path) -> None:
    r = runner.invoke(app, ["schema", "decisions"])
    assert r.exit_code == 2 and "decision" in r.output
    r = runner.invoke(app, ["schema", "jobs", "--out", str(tmp_path / "jobs.schema.json")])
    assert r.exit_code == 0 and r.stdout == ""
    assert json.loads((tmp_path / "jobs.schema.json").read_text()) == schema("jobs")
    listing = run("schema", "--list")
    assert "export-slurm-index" in listing and "status --json" in listing


@pytest.mark.parametrize("name", ["jobs", "cluster"])
def test_input_schemas_refuse_unknown_fields(name: str) -> None:
    s = schema(name)
    assert s["additionalProperties"] is False
