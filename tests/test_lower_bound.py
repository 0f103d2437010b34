"""The lower bound on the average JCT holds against every policy's replay (a bound that a
real schedule beat would be wrong), the LP is at least the isolated bound, and every replay
reports the bound and its distance to it, through ``simulate`` and ``compare``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app
from apportion.experiments import harness as H
from apportion.experiments.lower_bound import jct_lower_bound
from apportion.experiments.simulator import SimConfig, simulate
from apportion.policies import make_policy

runner = CliRunner()


@pytest.mark.parametrize("trace,cluster", [("synthetic:30", "crius-testbed"),
                                           ("gavel-max-min-fairness", "4:4:4")])
def test_no_policy_beats_the_bound(trace: str, cluster: str) -> None:
    cl = H.cluster_from_arg(cluster)
    t, truth = H.resolve(trace, cl, seed=0)
    t = replace(t, jobs=t.jobs[:30])
    b = jct_lower_bound(t.jobs, truth, cl)
    assert b.status == "optimal" and b.lp_avg_s is not None
    assert b.avg_jct_s >= b.isolated_avg_s > 0
    for name in ("fcfs", "srtf", "gavel-max-min-fairness", "apportion"):
        pol = make_policy(name)
        if hasattr(pol, "cfg"):
            pol.cfg.deterministic = True
        r = simulate(cl, t, pol, truth, SimConfig(jct_bound=False, deterministic=True))
        assert r.summary["avg_jct_all_s"] >= b.avg_jct_s * (1 - 1e-9), (name, b)


def test_replays_report_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "synthetic:12", "--cluster", "crius-testbed",
                            "--policy", "srtf", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["avg_jct_lower_bound_s"] > 0 and s["avg_jct_to_bound"] >= 1.0
    assert s["jct_bound"]["status"] in ("optimal", "isolated-only")
    r = runner.invoke(app, ["compare", "--trace", "synthetic:12", "--cluster", "crius-testbed",
                            "--policies", "fcfs,srtf", "--seeds", "1", "--out",
                            str(tmp_path / "cmp"), "--workers", "1"])
    assert r.exit_code == 0, r.output
    md = next((tmp_path / "cmp").glob("*/summary.md")).read_text()
    assert "avg JCT / lower bound" in md and "avg JCT lower bound (h)" in md
    csv = next((tmp_path / "cmp").glob("*/summary.csv")).read_text()
    assert "avg_jct_to_bound" in csv.splitlines()[0]
