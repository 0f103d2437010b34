"""apportion-deadline drops what its admission rejects (ElasticFlow's admission control), and
a replay counts it: before, the rejected jobs waited forever and `simulate` exited 1."""

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


def test_a_deadline_no_allocation_meets_is_a_drop() -> None:
    cluster = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    new = JobSpec("new", "bert-336m", 32, 10**7, 1, deadline_s=10.0)
    running = JobSpec("run", "bert-336m", 32, 10**7, 2, deadline_s=10.0, admitted=True,
                      running=RunningState("A100-40GB", 2, 1, {"a-0": 2}))
    easy = JobSpec("easy", "bert-336m", 32, 10, 1, deadline_s=1e6)
    d = run_round(cluster, [new, running, easy], 0.0,
                  RoundConfig(formulation="deadline", time_budget_s=2.0)).decision
    pending = {p.job: p for p in d.pending}
    for jid in ("new", "run"):  # admitted or not: no allocation meets it
        assert pending[jid].reason == Reason.DEADLINE_UNMEETABLE
        assert pending[jid].action == Action.DROP and pending[jid].can_ever_fit is False
    assert d.allocation("easy") is not None and "easy" not in pending


def test_a_deadline_replay_drops_and_counts_what_admission_rejects(tmp_path: Path,
                                                                   shared_data: Path) -> None:
    cluster = tmp_path / "a100.yaml"  # 8 A100s: ElasticFlow's trace is tight on it
    cluster.write_text("name: a100\nnode_groups:\n  - {prefix: a, count: 1, "
                       "gpu_type: A100-40GB, gpus_per_node: 8}\n")
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "elasticflow-philly", "--cluster",
                            str(cluster), "--policy", "apportion-deadline", "--max-jobs", "12",
                            "--information", "oracle", "--deterministic", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["dropped"] > 0 and s["finished"] + s["dropped"] == s["jobs"] == 12
