"""`solve-round --formulation plans|deadline` and `--tenants` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()


def _files(tmp: Path) -> tuple[Path, Path, Path]:
    c = tmp / "c.yaml"
    c.write_text("node_groups:\n  - {prefix: s, count: 2, gpu_type: A800-80GB, gpus_per_node: 8,"
                 " cpus_per_node: 96, host_memory_gib: 1600}\n")
    j = tmp / "j.yaml"
    j.write_text("jobs:\n"
                 "  - {id: g1, model: llama2-7b, global_batch_size: 32, iterations: 100,"
                 " requested_gpus: 8, tenant: a, guaranteed: true}\n"
                 "  - {id: g2, model: gpt2-1.5b, global_batch_size: 32, iterations: 100,"
                 " requested_gpus: 8, tenant: a, guaranteed: true}\n"
                 "  - {id: be, model: bert-336m, global_batch_size: 32, iterations: 100,"
                 " requested_gpus: 4, tenant: b, deadline_s: 100000}\n")
    t = tmp / "t.yaml"
    t.write_text("tenants:\n  - {name: a, quota_gpus: 8}\n")
    return c, j, t


def test_plans_with_quota(tmp_path: Path) -> None:
    c, j, t = _files(tmp_path)
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(c), "--jobs", str(j), "--tenants",
                            str(t), "--formulation", "plans", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["formulation"] == "plans"
    a_gpus = sum(a["gpus"] for a in d["allocations"] if a["job"] in ("g1", "g2"))
    # only g1 fits tenant a's quota as guaranteed; g2 is best effort or pending with 'quota'
    assert any(a["job"] == "g1" for a in d["allocations"])
    assert a_gpus <= 16
    for a in d["allocations"]:
        assert a["cpus"] > 0 and a["host_memory_gib"] > 0


def test_deadline_formulation(tmp_path: Path) -> None:
    c, j, _ = _files(tmp_path)
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(c), "--jobs", str(j),
                            "--formulation", "deadline", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["formulation"] == "deadline" and d["meta"]["deadline_jobs"] == 1


def test_bad_tenants_file(tmp_path: Path) -> None:
    c, j, t = _files(tmp_path)
    t.write_text("tenants:\n  - {name: a, quota_gpus: -1}\n")
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(c), "--jobs", str(j), "--tenants",
                            str(t), "--formulation", "plans", "--json", str(out)])
    assert r.exit_code == 2 and "tenants[0].quota_gpus" in r.stderr and not out.exists()
    r = runner.invoke(app, ["solve-round", "--formulation", "magic"])
    assert r.exit_code == 2
