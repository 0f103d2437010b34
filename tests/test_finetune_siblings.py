"""Fine-tuning siblings inside apportion's own round model: a transfer option (a cell whose
work is cut) and a merged cell (one column serving two jobs) appear in a round of siblings
and in no other, reach the decision, pass the validator, and a replay credits them as it
credits YMIR's (formulations/siblings.py, policies/siblings.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from apportion.estimation.finetune.transferability import (
    Task2VecProbe,
    TransferabilityEstimator,
    synthetic_task,
)
from apportion.experiments.finetune_truth import finetune_root
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Allocation, Decision, Pending, Reason, SolveReport
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.validator import validate

runner = CliRunner()
DIM = 8


@pytest.fixture
def siblings(tmp_path: Path) -> tuple[Path, Path]:
    """A cluster, a task-data folder (mrpc, stsb, qnli drawn from one distribution) and a
    jobs file of three queued RoBERTa-base siblings and one finished one."""
    rng = np.random.default_rng(0)
    shared = rng.normal(size=(4, DIM)) * 2
    data = tmp_path / "task-data"
    data.mkdir()
    for i, task in enumerate(("mrpc", "stsb", "qnli", "rte")):
        t = synthetic_task(task, DIM, 4, 400, 10 + i, base=shared, shift=0.05)
        np.savez(data / f"roberta-base@{task}.npz", x=t.x, y=t.y)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({"name": "v", "node_groups": [
        {"prefix": "v", "count": 2, "gpu_type": "V100-32GB", "gpus_per_node": 4}]}))
    jobs = [{"id": j, "model": "roberta-base", "global_batch_size": 32, "iterations": it,
             "requested_gpus": 1, "backbone": "roberta-base", "task": task,
             "accepts_sharing": True}
            for j, task, it in (("b", "stsb", 2000), ("c", "qnli", 3000), ("d", "rte", 2500))]
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(
        {"jobs": jobs, "finished": [{"id": "a", "backbone": "roberta-base", "task": "mrpc"}]}))
    plain = [{k: v for k, v in j.items() if k not in ("backbone", "task", "accepts_sharing")}
             for j in jobs]
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({"jobs": plain}))
    return tmp_path, data


def _round(folder: Path, jobs: str, policy: str) -> tuple[dict, dict]:
    args = ["solve-round", "--cluster", str(folder / "cluster.yaml"), "--jobs",
            str(folder / jobs), "--policy", policy, "--time-budget", "5", "--json",
            str(folder / "d.json"), "--dump-problem", str(folder / "p.json")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return (json.loads((folder / "d.json").read_text()),
            json.loads((folder / "p.json").read_text()))


def _options(problem: dict) -> tuple[list[dict], list[dict]]:
    cands = [c for j in problem["jobs"] for c in j["candidates"]]
    return [c for c in cands if "source" in c], [c for c in cands if "members" in c]


def test_solve_round_offers_transfer_and_merged_cells_to_siblings(siblings, monkeypatch):
    folder, data = siblings
    monkeypatch.setenv("APPORTION_TASK_DATA", str(data))
    decision, problem = _round(folder, "jobs.yaml", "apportion-task2vec")
    transfer, merged = _options(problem)
    assert transfer and all(c["source"] == "a" and c["transfer_gain"] > 0 for c in transfer)
    assert merged and all(len(c["members"]) == 1 for c in merged)
    # a merged cell is worth its members' seconds too
    assert all(c["member_values"] and c["value"] > 0 for c in merged)
    meta = decision["meta"]
    assert set(meta) >= {"transfer", "merged"}
    placed = {a["job"] for a in decision["allocations"]}
    for lead, members in meta["merged"].items():  # a member trains inside its lead
        assert lead in placed and not set(members) & placed
        assert all(p["reason"] == "merged" for p in decision["pending"]
                   if p["job"] in members)
    assert set(meta["transfer"]) <= placed and set(meta["transfer"].values()) <= {"a"}


def test_merged_cells_reach_their_members_elastic_scale_up(siblings, monkeypatch):
    """Siblings are elastic (the default): each member is offered counts past twice its
    request of 1, and the merged cells are offered those counts and their sums, each within
    the cluster's 8 GPUs."""
    folder, data = siblings
    monkeypatch.setenv("APPORTION_TASK_DATA", str(data))
    _, problem = _round(folder, "jobs.yaml", "apportion-task2vec")
    singles = [c for j in problem["jobs"] for c in j["candidates"] if "members" not in c]
    _, merged = _options(problem)
    assert max(c["gpus"] for c in singles) > 2
    assert max(c["gpus"] for c in merged) > 2
    assert all(1 <= c["gpus"] <= 8 for c in merged)


def test_no_option_without_siblings(siblings, monkeypatch):
    folder, data = siblings
    monkeypatch.setenv("APPORTION_TASK_DATA", str(data))
    for jobs, policy in (("plain.yaml", "apportion-task2vec"), ("jobs.yaml", "apportion")):
        # no backbone: no sibling; the estimator's rates know no transfer: no gain
        decision, problem = _round(folder, jobs, policy)
        assert _options(problem) == ([], [])
        assert not decision["meta"].get("merged") and not decision["meta"].get("transfer")


def test_a_finished_entry_must_not_be_a_job(siblings):
    folder, _ = siblings
    data = yaml.safe_load((folder / "jobs.yaml").read_text())
    data["finished"][0]["id"] = "b"
    (folder / "bad.yaml").write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["solve-round", "--cluster", str(folder / "cluster.yaml"),
                            "--jobs", str(folder / "bad.yaml")])
    assert r.exit_code == 2 and "finished" in r.output and "bad.yaml" in r.output


def _cluster() -> Cluster:
    return Cluster("v", [NodeGroup("v", 1, "V100-32GB", 4)])


def test_validator_accepts_a_merged_decision_and_refuses_a_broken_one():
    jobs = [JobSpec("a", "roberta-base", 32, 100, 1), JobSpec("b", "roberta-base", 32, 100, 1)]
    alloc = Allocation("a", "V100-32GB", 2, 1, ExecutionPlan(dp=2), {"v-0": 2}, 1.0)
    report = SolveReport("-", "-", None, None, None, 0.0, False)
    ok = Decision([alloc], [Pending("b", Reason.MERGED, "trains inside merged job a")], report,
                  meta={"merged": {"a": ["b"]}})
    assert validate(ok, _cluster(), jobs).ok
    alone = replace(alloc, job="b", placement={"v-0": 2})
    both = Decision([alloc, alone], [], report, meta={"merged": {"a": ["b"]}})
    assert any("merged" in v for v in validate(both, _cluster(), jobs).violations)
    idle = Decision([], [Pending("a", Reason.NO_CAPACITY), Pending("b", Reason.MERGED)],
                    report, meta={"merged": {"a": ["b"]}})
    assert any("lead" in v for v in validate(idle, _cluster(), jobs).violations)


@pytest.mark.skipif(not finetune_root().is_dir(), reason="titan-finetune data not present")
def test_a_replay_credits_apportions_transfers_and_merges():
    """apportion's merged and transferred jobs run in the replay as YMIR's do: a transfer
    at the truth's rate from its source, a merged member done when its lead is."""
    from apportion.experiments.harness import cluster_from_arg, resolve
    from apportion.experiments.simulator import PROFILES, Simulator

    from apportion.policies import make_policy

    cl = cluster_from_arg("16:0:0")
    trace, truth = resolve("fm-1-roberta-base", cl)
    trace = replace(trace, jobs=trace.jobs[:40])
    cfg = replace(PROFILES["ymir"], information="oracle", deterministic=True)
    pol = make_policy("apportion")
    sim = Simulator(cl, trace, pol, truth, cfg)
    res = sim.run()
    states = sim._replay.states
    transferred = [js for js in states.values() if "source" in js.mode]
    assert transferred and res.summary["finished"] == res.summary["jobs"]
    for js in transferred:
        src = js.mode["source"]
        assert truth.rate(js.trace, "V100-32GB", 1, source=src) > truth.rate(js.trace,
                                                                             "V100-32GB", 1)
    # merging only, on a busier stretch (queued siblings together): merged pairs run merged
    cl = cluster_from_arg("8:0:0")
    trace, truth = resolve("fm-2-roberta-base", cl)
    trace = replace(trace, jobs=trace.jobs[:40])
    pol = make_policy("apportion")
    pol.siblings.transfer = False
    sim = Simulator(cl, trace, pol, truth, cfg)
    sim.run()
    leads = [js for js in sim._replay.states.values() if js.members]
    assert leads
    for js in leads:
        m = sim._replay.states[js.members[0]]
        assert js.mode["members"] == (m.trace,) and m.merged_into == js.id
        assert m.finish == js.finish and m.alloc is None


def test_task2vec_separates_related_from_unrelated_on_held_out_draws():
    """Tasks drawn from one distribution score near 0, unrelated ones far, on fresh draws
    none of the probe's settings were chosen on."""
    for trial in range(3):
        rng = np.random.default_rng(1000 + trial)
        shared = rng.normal(size=(4, DIM)) * 2
        tasks = [synthetic_task(f"r{i}", DIM, 4, 500, 200 + 10 * trial + i, base=shared,
                                shift=0.1) for i in range(3)]
        tasks += [synthetic_task(f"u{i}", DIM, 4, 500, 300 + 10 * trial + i,
                                 base=rng.normal(size=(4, DIM)) * 2) for i in range(3)]
        est = TransferabilityEstimator(Task2VecProbe(DIM, subset=400)).fit(tasks)
        names = [t.name for t in tasks]
        related = [est.temporal_score(a, b) for a in names for b in names
                   if a != b and a[0] == b[0] == "r"]
        unrelated = [est.temporal_score(a, b) for a in names for b in names
                     if a != b and (a[0] == "u" or b[0] == "u")]
        assert max(related) < 0.15 and min(unrelated) > 0.25, (related, unrelated)
