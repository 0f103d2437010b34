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
