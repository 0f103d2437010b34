"""`apportion bench round`: the whole command timed as installed (bytecode cached)."""

from __future__ import annotations

from pathlib import Path

import pytest
from apportion.experiments.bench import rounds


def test_installed_env_allows_bytecode_even_where_the_shell_forbids_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = rounds.installed_env(tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert list(tmp_path.glob("cluster-*.yaml")) and list(tmp_path.glob("jobs-*.yaml"))


def test_a_small_round_is_timed_and_answered() -> None:
    # a budget far above what 30 jobs need: the chain stops once optimal, and a loaded CI
    # machine starting the solvers' child process slowly does not make this a fallback
    (row,) = rounds.main([(30, 64, 2, 10.0, 1, "local")], seed=3, repeat=1)
    assert row["exit"] == 0, row
    assert row["status"] in ("optimal", "feasible") and not row["fallback"], row
    assert row["objective"] > 0 and row["wall_s"] > 0 and row["cpu_s"] > 0
    assert row["peak_rss_mib"] > 10  # the command's own peak (an interpreter at least)
    assert "peak MiB" in rounds.markdown([row])
    assert row["gap"] is not None and row["gap"] <= 1e-3 + 1e-12  # the default tolerance
