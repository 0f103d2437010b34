"""Pollux's setting as data: its cluster by name, and its own simulator's figures on every
workload at every load (``apportion.experiments.pollux_reference``)."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from apportion.experiments.pollux_reference import (
    LOAD_FOLDERS,
    POLICIES,
    WORKLOADS,
    reference,
    table,
)
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import bundled_clusters, resolve_cluster

#: the artifact README's figures for workload 6 at load 1.0 (average JCT, s)
PUBLISHED_W6 = {"pollux": 2446.13125, "optimus": 5301.875, "tiresias": 3469.69375}


def test_pollux_64_is_a_bundled_cluster_of_16_nodes_of_4_t4() -> None:
    assert "pollux-64" in bundled_clusters()
    c = resolve_cluster("pollux-64")
    assert c.name == "pollux-64"
    assert c.capacity_by_type() == {"T4": 64}
    assert len(c.nodes) == 16 and {n.gpus for n in c.nodes.values()} == {4}
    assert {(n.cpus, n.host_memory_gib, n.intra_link) for n in c.nodes.values()} == {(48, 192, "pcie")}
    r = CliRunner().invoke(app, ["solve-round", "--cluster", "pollux-64", "--backend", "greedy",
                                 "--no-isolate", "--json", "-"])
    assert r.exit_code == 0, r.output


def test_the_published_references_cover_every_policy_load_and_workload() -> None:
    rows = table("published")
    keys = Counter((r["policy"], r["load"], r["workload"]) for r in rows)
    assert set(keys) == {(p, lo, w) for p in POLICIES for lo in LOAD_FOLDERS for w in WORKLOADS}
    assert set(keys.values()) == {1}
    for r in rows:
        assert r["finished"] == r["jobs"] == 160 * r["load"], r  # every job finished
        assert 0 < r["avg_jct_s"] <= r["p99_jct_s"] <= r["makespan_s"], r
    for policy, avg in PUBLISHED_W6.items():
        assert reference(1.0, 6, policy)["avg_jct_s"] == pytest.approx(avg, abs=1e-3)


def test_the_references_count_the_jobs_of_each_workload_file(shared_data: Path) -> None:
    for load, folder in LOAD_FOLDERS.items():
        for w in WORKLOADS:
            with (shared_data / "pollux" / folder / f"workload-{w}.csv").open() as f:
                jobs = sum(1 for _ in csv.DictReader(f))
            assert reference(load, w)["jobs"] == jobs, (load, w)


def test_reruns_of_the_unmodified_simulator_agree_with_the_published_runs() -> None:
    """Tiresias and Optimus are deterministic: a rerun gives the published figure exactly;
    Pollux's policy draws unseeded random numbers (its README allows a few per cent)."""
    reruns = table("rerun")
    assert reruns, "no rerun recorded"
    for r in reruns:
        assert r["rc"] == 0, r
        pub = reference(r["load"], r["workload"], r["policy"])  # type: ignore[arg-type]
        if r["policy"] == "pollux":
            assert r["avg_jct_s"] == pytest.approx(pub["avg_jct_s"], rel=0.10), r
        else:
            assert r["avg_jct_s"] == pytest.approx(pub["avg_jct_s"], abs=1e-3), r
            assert r["makespan_s"] == pytest.approx(pub["makespan_s"], abs=1e-3), r


def test_an_unknown_reference_is_refused() -> None:
    with pytest.raises(KeyError, match="workload 9"):
        reference(1.0, 9)
    with pytest.raises(ValueError, match="source"):
        table("mine")


def test_the_round_rules_are_a_replay_profile_and_the_cluster_is_bundled() -> None:
    """Pollux's 60-s rounds and 30-s restarts fit the simulator's profile type as they are
    (the ``pollux`` profile is ``SimConfig(**ROUND_RULES, profile="pollux")``)."""
    from apportion.experiments.pollux_reference import CLUSTER, ROUND_RULES
    from apportion.experiments.simulator import SimConfig

    cfg = SimConfig(**ROUND_RULES, profile="pollux")
    assert (cfg.interval_s, cfg.restart_cost_s, cfg.start_cost_s) == (60.0, 30.0, 30.0)
    assert resolve_cluster(CLUSTER).capacity_by_type() == {"T4": 64}
