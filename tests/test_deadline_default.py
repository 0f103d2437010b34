"""Deadlines as ElasticFlow keeps them, inside apportion's default policy (issue 60 item 4):
admission by each job's minimum satisfactory share (elastic counts included), then spare
GPUs; a job no allocation meets runs best effort under ``apportion`` and is dropped by
``apportion-deadline``; a replay reports the share of jobs that met their deadline."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Reason
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round

runner = CliRunner()

CLUSTER = "name: a100\nnode_groups:\n  - {prefix: a, count: 4, gpu_type: A100-40GB, " \
          "gpus_per_node: 8}\n"
# bert-336m at batch 256 on A100s (the analytic model): 10,000 iterations take about 6.3 h
# on its 2 GPUs, 1.6 h on 8 and 0.9 h on 16; a deadline of 4,000 s is met on 16 or more
JOBS = """now_s: 0
jobs:
  - {id: due, model: bert-336m, global_batch_size: 256, iterations: 10000, requested_gpus: 2,
     deadline_s: 4000}
  - {id: late, model: bert-336m, global_batch_size: 256, iterations: 10000, requested_gpus: 2,
     deadline_s: 1000}
  - {id: free, model: bert-336m, global_batch_size: 256, iterations: 100000, requested_gpus: 2}
"""


def _round(tmp_path: Path, policy: str) -> dict:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "j.yaml").write_text(JOBS)
    out = tmp_path / f"{policy}.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(tmp_path / "c.yaml"), "--jobs",
                            str(tmp_path / "j.yaml"), "--policy", policy, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def test_the_default_admits_on_the_minimum_share_and_keeps_a_late_job(tmp_path: Path) -> None:
    d = _round(tmp_path, "apportion")
    given = {a["job"]: a["gpus"] for a in d["allocations"]}
    assert given["due"] >= 16  # its minimum satisfactory share is 8x its request
    assert "late" in given and "free" in given  # a late job runs best effort, never dropped
    assert not any(p["action"] == "drop" for p in d["pending"])
    assert d["meta"]["deadline_jobs"] == 2 and d["meta"]["placed_on_time"] == 1


def test_apportion_deadline_still_drops_what_no_allocation_meets(tmp_path: Path) -> None:
    d = _round(tmp_path, "apportion-deadline")
    given = {a["job"]: a["gpus"] for a in d["allocations"]}
    assert given["due"] >= 16
    (late,) = [p for p in d["pending"] if p["job"] == "late"]
    assert late["reason"] == "deadline-unmeetable" and late["action"] == "drop"


def test_admission_comes_before_another_jobs_scale_up() -> None:
    """A shorter running job grown to 16 of 24 GPUs keeps them when the new job has no
    deadline (the shorter job's speed is worth more), and gives half back when the new job
    meets its deadline only on 16: admission on the minimum share first, spare GPUs to
    speed after."""
    cluster = Cluster("c", [NodeGroup("a", 3, "A100-40GB", 8)])
    big = JobSpec("big", "bert-336m", 256, 5000, 2, iterations_done=10,
                  running=RunningState("A100-40GB", 16, 1, {"a-0": 8, "a-1": 8}))
    given = {}
    for deadline in (None, 4000.0):
        due = JobSpec("due", "bert-336m", 256, 10_000, 2, deadline_s=deadline)
        d = run_round(cluster, [big, due], 0.0, RoundConfig(time_budget_s=2.0)).decision
        given[deadline] = {a.job: a.gpus for a in d.allocations}
    assert given[None] == {"big": 16, "due": 8}
    assert given[4000.0] == {"big": 8, "due": 16}


def test_a_round_without_deadlines_is_unchanged() -> None:
    """The default's rounds without deadlines carry no deadline figures (the rule applies
    only where jobs carry deadlines)."""
    cluster = Cluster("c", [NodeGroup("a", 1, "A100-40GB", 8)])
    d = run_round(cluster, [JobSpec("j", "bert-336m", 256, 1000, 2)], 0.0,
                  RoundConfig(time_budget_s=2.0)).decision
    assert "deadline_jobs" not in d.meta and d.allocation("j") is not None


def test_a_replay_reports_the_deadlines_met(tmp_path: Path) -> None:
    """Through ``simulate``: a job meets its deadline only on more than twice its request;
    the default meets it (``deadline_ratio`` 1), the same job that must keep its size
    cannot (0), and neither is dropped."""
    (tmp_path / "c.yaml").write_text(CLUSTER)
    trace = tmp_path / "w.csv"
    ratios = {}
    for elastic in ("true", "false"):
        trace.write_text("job_id,submit_time_s,num_gpus,model,batch_size,iterations,"
                         f"deadline_s,elastic\ndue,0,2,bert-336m,256,10000,5000,{elastic}\n")
        out = tmp_path / f"{elastic}.json"
        r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster",
                                str(tmp_path / "c.yaml"), "--policy", "apportion",
                                "--information", "oracle", "--deterministic", "--json",
                                str(out)])
        assert r.exit_code == 0, r.output
        s = json.loads(out.read_text())
        assert s["finished"] == 1 and s["dropped"] == 0
        ratios[elastic] = s["deadline_ratio"]
    assert ratios == {"true": 1.0, "false": 0.0}


def test_the_deadline_rule_drops_only_when_told() -> None:
    from apportion.formulations.candidates import build_candidates
    from apportion.formulations.deadline import DeadlineOptions, apply_deadlines
    from apportion.formulations.schema import cells_of, job_node

    cluster = Cluster("c", [NodeGroup("a", 1, "A100-40GB", 8)])
    late = JobSpec("late", "bert-336m", 256, 10**6, 2, deadline_s=10.0)
    for drop in (True, False):
        g = build_candidates(cluster, [late], 0.0)
        n = len(cells_of(g, "late"))
        apply_deadlines(g, [late], 0.0, DeadlineOptions(drop=drop))
        jd = g.nodes[job_node("late")]
        if drop:
            assert not cells_of(g, "late") and jd["reason"] == Reason.DEADLINE_UNMEETABLE.value
        else:
            assert len(cells_of(g, "late")) == n and jd.get("deadline_missed")
            assert jd["reason"] is None
    assert Action.DROP.value == "drop"
