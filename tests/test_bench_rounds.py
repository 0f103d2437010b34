"""`apportion bench round`: the whole command timed as installed (bytecode cached)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from apportion.experiments.bench import rounds
from typer.testing import CliRunner

from apportion.cli import app


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
    # within the default tolerance, or the rounded LP's answer taken as final (the cell
    # model), which the attempts say
    assert row["gap"] is not None
    # (HiGHS then did not run: `skipped` since a backend the chain did not run says so)
    assert row["gap"] <= 1e-3 + 1e-12 or (row["backend"] == "lp-round" and any(
        a[1] in ("error", "skipped") and a[0] == "highs" for a in row["attempts"])), row


def test_a_json_lines_queue_through_the_store_partitioned_and_deterministic(
        tmp_path: Path) -> None:
    """``bench round --queue-format jsonl --store --deterministic`` on a partitioned case:
    the queue submitted (timed), the round solved from the store by POP's parts, each with
    its share of the work; the row carries its door, format and memory."""
    out = tmp_path / "rows.json"
    r = CliRunner().invoke(app, ["bench", "round", "--case", "40:64:10:2", "--deterministic",
                                 "--queue-format", "jsonl", "--store", "--json", str(out)])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(out.read_text())
    assert row["exit"] == 0 and row["door"] == "store" and row["queue"] == "jsonl", row
    assert row["backend"] == "pop-2" and row["submit_wall_s"] > 0, row
    assert row["tree_pss_mib"] is None or row["tree_pss_mib"] > 10
    assert "| store | jsonl |" in r.output
    bad = CliRunner().invoke(app, ["bench", "round", "--queue-format", "toml"])
    assert bad.exit_code == 2 and "--queue-format" in bad.output


def test_large_cases_write_json_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rounds, "YAML_CASE_JOBS", 30)  # 20,000 in earnest: 16 s of YAML
    _, small = rounds.write_instance(30, 64, 2, 0, tmp_path)
    _, large = rounds.write_instance(31, 64, 2, 0, tmp_path)
    assert small.suffix == ".yaml" and large.suffix == ".jsonl"
    assert json.loads(large.read_text().split("\n", 1)[0]) == {
        "format": "apportion-jobs", "jobs": 31, "now_s": 36000.0}


def test_side_by_side_against_another_install_through_the_command(tmp_path: Path) -> None:
    """``bench round --against PYTHON --deterministic``: every case run by both
    interpreters alternately (this, other, other, this), the ratios reported, and a work
    budget makes both answer alike (here the other install is this one)."""
    out = tmp_path / "rows.json"
    r = CliRunner().invoke(app, ["bench", "round", "--case", "30:64:10", "--repeat", "2",
                                 "--deterministic", "--against", sys.executable,
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert [row["code"] for row in rows] == ["this", "against", "against", "this"]
    assert all(row["exit"] == 0 and row["deterministic"] for row in rows), rows
    (side,) = rounds.ratios(rows)
    assert side["answers_agree"] and side["runs"] == 2
    assert side["ratio_wall"] > 0 and side["ratio_cpu"] > 0
    assert "answers agree" in r.output and "| this |" in r.output


@pytest.mark.parametrize("against", ["/nonexistent/python", "/bin/true", "/bin/sh"])
def test_an_interpreter_without_apportion_is_refused_before_any_round(
        tmp_path: Path, against: str) -> None:
    out = tmp_path / "rows.json"
    r = CliRunner().invoke(app, ["bench", "round", "--case", "30:64:10", "--against", against,
                                 "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert "--against" in r.output and not out.exists()
