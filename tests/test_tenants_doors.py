"""Tenants and their quotas through every door: ``--tenants`` on ``simulate``, ``compare``
and ``run`` (it existed on ``solve-round`` only), given alike to every policy that keeps
quotas (apportion, the default, apportion-plans, Morphling's, AntMan's), and refused by
name where the policy would ignore them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from apportion.cli import app
from apportion.experiments.harness import prepare_one
from apportion.policies import quota_options

runner = CliRunner()
QUOTAS = {"A": 8, "B": 16}


@pytest.fixture()
def tenants(tmp_path: Path) -> Path:
    p = tmp_path / "tenants.yaml"
    p.write_text(yaml.safe_dump({"tenants": [{"name": k, "quota_gpus": v}
                                             for k, v in QUOTAS.items()]}))
    return p


@pytest.mark.parametrize("policy,option", [("apportion", "quotas"), ("apportion-plans", "quotas"),
                                           ("morphling", "quota"), ("antman", "quota")])
def test_every_policy_that_keeps_quotas_is_given_the_same(policy: str, option: str) -> None:
    opts = quota_options(policy, QUOTAS)
    assert opts == {option: QUOTAS}
    replay = prepare_one("synthetic:4", "crius-testbed", policy, policy_options=opts)
    held = replay.policy  # the policy the replay built
    assert hasattr(held, "decide"), "no policy in the replay"
    got = getattr(held, option, None)
    if got is None:  # apportion's policy keeps its quotas in its round config
        got = held.cfg.quotas
    assert got == QUOTAS


def test_simulate_and_compare_take_tenants(tenants: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "morphling-mt", "--cluster", "morphling-64",
                            "--policy", "apportion-plans", "--max-jobs", "6", "--tenants",
                            str(tenants), "--deterministic", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["policy"] == "apportion-plans"
    r = runner.invoke(app, ["compare", "--trace", "morphling-mt", "--cluster", "morphling-64",
                            "--policies", "apportion,apportion-plans,morphling,fcfs",
                            "--max-jobs", "4", "--tenants", str(tenants),
                            "--out", str(tmp_path / "cmp"),
                            "--workers", "1", "--deterministic"])
    assert r.exit_code == 0, r.output


def test_a_policy_without_quotas_is_refused_by_name(tenants: Path, tmp_path: Path) -> None:
    r = runner.invoke(app, ["simulate", "--trace", "synthetic:4", "--cluster", "crius-testbed",
                            "--policy", "fcfs", "--tenants", str(tenants)])
    assert r.exit_code == 2 and "--tenants" in r.stderr and "fcfs" in r.stderr, r.output
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "a", "model": "bert-336m", "global_batch_size": 32, "iterations": 10,
         "requested_gpus": 1, "tenant": "A", "guaranteed": True}]}))
    db = tmp_path / "s.db"
    assert runner.invoke(app, ["submit", str(tmp_path / "j.yaml"), "--state", str(db)]
                         ).exit_code == 0
    r = runner.invoke(app, ["run", "--state", str(db), "--cluster", "crius-testbed",
                            "--tenants", str(tenants), "--policy", "fcfs", "--timeout", "2",
                            "--interval", "1", "--workdir", str(tmp_path / "w")])
    assert r.exit_code == 2 and "--tenants" in r.stderr and "fcfs" in r.stderr, r.output
    # the default policy (the cells formulation) keeps quotas, as apportion-plans does
    for policy in ([], ["--policy", "apportion-plans"]):
        r = runner.invoke(app, ["run", "--state", str(db), "--cluster", "crius-testbed",
                                "--tenants", str(tenants), *policy, "--timeout", "3",
                                "--interval", "1", "--time-budget", "2",
                                "--workdir", str(tmp_path / "w")])
        assert r.exit_code == 0, r.output
