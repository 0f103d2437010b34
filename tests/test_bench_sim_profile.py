"""`bench sim` says where a replay's solver time went: each round's chain as it ran (it
replays the real Philly trace: ``shared_data``)."""

from __future__ import annotations

from pathlib import Path

from apportion.experiments.bench.sim import chain_profile, main


def test_bench_sim_reports_each_rounds_chain_and_the_time_of_each_backend(shared_data: Path
                                                                         ) -> None:
    res = main("apportion", days=0.1, time_budget=1.0, max_rounds=4)
    chains = res["rounds_by_chain"]
    assert sum(chains.values()) == res["rounds"]
    ran = {name for chain in chains for name in chain.split("+") if chain != "(none)"}
    assert ran, chains  # a round with jobs ran at least one backend
    assert set(res["solver_s_by_backend"]) == ran
    assert all(s >= 0.0 for s in res["solver_s_by_backend"].values())
    assert 0 <= res["highs_stalled_rounds"] <= res["rounds"]
    assert res["highs_stalled_s"] <= res["solver_s_by_backend"].get("highs", 0.0) + 1e-9


def test_a_policy_without_a_chain_reports_no_profile(shared_data: Path) -> None:
    res = main("fcfs", days=0.1, max_rounds=3)
    assert set(res["rounds_by_chain"]) <= {"(none)"}
    assert res["solver_s_by_backend"] == {} and res["highs_stalled_rounds"] == 0
    import pandas as pd

    assert chain_profile(pd.DataFrame()) == {}


def test_side_by_side_replays_against_another_install(shared_data: Path, tmp_path: Path) -> None:
    """``bench sim --against PYTHON``: the same replay by both installs at once (here the
    other is this one), each one's result kept, this over the other as ratios, and an
    unchanged deterministic replay the same schedule."""
    import json
    import sys

    from typer.testing import CliRunner

    from apportion.cli import app

    out = tmp_path / "side.json"
    r = CliRunner().invoke(app, ["bench", "sim", "--policy", "fcfs", "--days", "0.1",
                                 "--max-rounds", "3", "--deterministic", "--against",
                                 sys.executable, "--json", str(out)])
    assert r.exit_code == 0, r.output
    side = json.loads(out.read_text())
    assert side["this"]["rounds"] == side["against"]["rounds"] == 3
    assert side["same_schedule"] and side["avg_jct_change"] == 0.0
    assert side["ratios"]["sim_cpu_s"] is not None and side["ratios"]["peak_rss_mib"] > 0


def test_side_by_side_refuses_an_interpreter_without_apportion(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from apportion.cli import app

    out = tmp_path / "side.json"
    r = CliRunner().invoke(app, ["bench", "sim", "--days", "0.1", "--against", "/bin/sh",
                                 "--json", str(out)])
    assert r.exit_code == 2 and "--against" in r.output and not out.exists(), r.output
