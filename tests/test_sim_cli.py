"""`apportion simulate` / `compare`: the summary contract and exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.experiments import traces as tr
from typer.testing import CliRunner

from apportion.cli import app

pytestmark = pytest.mark.skipif(not tr.data_root().exists(), reason="shared data not present")
runner = CliRunner()


def test_simulate_writes_the_contract_keys(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "gavel-small", "--cluster", "4:4:4",
                            "--policy", "gavel-max-min-fairness", "--profile", "gavel",
                            "--seed", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    for k in ("jobs", "finished", "avg_jct_s", "p99_jct_s", "makespan_s", "utilization",
              "avg_jct_all_s", "p99_jct_all_s"):
        assert k in s
    assert s["jobs"] == s["finished"] == 20
    assert s["avg_jct_all_s"] == s["avg_jct_s"]  # every job finished: the two agree


@pytest.mark.parametrize("args", [
    ["--trace", "nope", "--cluster", "8:8:8", "--policy", "fifo"],
    ["--trace", "gavel-small", "--cluster", "8:x:8", "--policy", "fifo"],
    ["--trace", "gavel-small", "--cluster", "8:8:8", "--policy", "nope"],
    ["--trace", "gavel-small", "--cluster", "8:8:8", "--policy", "fifo", "--profile", "nope"],
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", *args, "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert not out.exists()


def test_compare_is_resumable(tmp_path: Path) -> None:
    args = ["compare", "--trace", "gavel-small", "--cluster", "4:4:4", "--policies",
            "fifo,gandiva", "--seeds", "1", "--profile", "gavel", "--out", str(tmp_path),
            "--run", "r", "--workers", "2"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    root = tmp_path / "r"
    for f in ("summary.md", "summary.csv", "jct_cdf.png", "fifo-s0/jobs.csv", "gandiva-s0/summary.json"):
        assert (root / f).exists(), f
    stamp = (root / "fifo-s0" / "jobs.csv").stat().st_mtime_ns
    r = runner.invoke(app, args)
    assert r.exit_code == 0
    assert (root / "fifo-s0" / "jobs.csv").stat().st_mtime_ns == stamp  # not redone
