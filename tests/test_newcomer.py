"""The newcomer's path (issue 17, item 6), apart from the README run itself
(tests/test_readme_commands.py): --version, shell completion, one spelling of each
bundled cluster in every command, --json on the catalogs, progress on stderr, why a
job waits, the environment variables, printable ids, one APPORTION_DATA rule."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from apportion import __version__
from apportion.cli import app
from apportion.config import CLUSTER_ALIASES, bundled_clusters, resolve_cluster
from apportion.env import VARIABLES

runner = CliRunner()
APPORTION = str(Path(sys.executable).with_name("apportion"))
README = Path(__file__).resolve().parents[1] / "README.md"


def test_version() -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"apportion {__version__}"


def test_shell_completion_is_on() -> None:
    # the completion script for bash, named explicitly: `--show-completion` guesses the shell
    # from the parent processes and fails where none is a shell (nohup, CI runners)
    r = subprocess.run([APPORTION], env={**os.environ, "_APPORTION_COMPLETE": "source_bash"},
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "_apportion_completion" in r.stdout, r.stderr
    env = {**os.environ, "COMP_WORDS": "apportion solve-r", "COMP_CWORD": "1",
           "_APPORTION_COMPLETE": "complete_bash"}
    r = subprocess.run([APPORTION], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.stdout.split() == ["solve-round"], r.stdout
    assert "--install-completion" in runner.invoke(app, ["--help"]).stdout


def test_one_spelling_of_each_bundled_cluster_everywhere(tmp_path: Path) -> None:
    assert bundled_clusters() == ["crius-1280", "crius-testbed", "morphling-64", "pollux-64"]
    for alias, name in CLUSTER_ALIASES.items():
        assert resolve_cluster(alias).name == resolve_cluster(name).name == name
    for name in ("crius-1280", "crius-sim"):  # canonical and alias in every command
        r = runner.invoke(app, ["solve-round", "--cluster", name, "--backend", "greedy",
                                "--no-isolate", "--json", "-"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["estimate", "--job", "bert-1.3b:256", "--cell", "A40:8",
                                "--cluster", name, "--estimator", "analytic"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["simulate", "--trace", "synthetic:3", "--cluster", name,
                                "--policy", "fcfs"])
        assert r.exit_code == 0 and json.loads(r.stdout)["cluster"] == "crius-1280", r.output
    for cmd in ("solve-round", "estimate", "simulate", "compare", "run"):
        text = " ".join(runner.invoke(app, [cmd, "--help"], terminal_width=400)
                        .stdout.replace("│", " ").split())
        assert "crius-1280 (alias crius-sim, crius)" in text, (cmd, text)


def test_catalogs_as_json() -> None:
    models = json.loads(runner.invoke(app, ["models", "--json"]).stdout)["models"]
    assert {"name", "family", "params", "flops_per_sample", "layers"} <= set(models[0])
    assert any(m["name"] == "gpt-tiny" for m in models)
    gpus = json.loads(runner.invoke(app, ["gpus", "--json"]).stdout)["gpus"]
    assert {"name", "memory_gib", "half_tflops", "hbm_GBps"} <= set(gpus[0])


def test_progress_goes_to_stderr_as_plain_lines(tmp_path: Path) -> None:
    env = {**os.environ, "APPORTION_PROGRESS_S": "0"}
    r = subprocess.run([APPORTION, "simulate", "--trace", "synthetic:20", "--cluster",
                        "crius-testbed", "--policy", "fcfs"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)  # stdout is only the data
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("simulate fcfs:")]
    assert len(lines) >= 3 and re.search(r"20/20 jobs finished, done", lines[-1]), r.stderr


def test_status_says_why_a_job_waits(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [
        {"id": "fits", "model": "bert-0.76b", "global_batch_size": 64, "iterations": 100,
         "requested_gpus": 2},
        {"id": "too-big", "model": "llama-30b", "global_batch_size": 64, "iterations": 100,
         "requested_gpus": 1}]}))
    db = tmp_path / "s.db"
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    r = runner.invoke(app, ["solve-round", "--state", str(db), "--backend", "greedy",
                            "--no-isolate"])
    assert r.exit_code == 0, r.output
    data = json.loads(runner.invoke(app, ["status", "--state", str(db), "--json"]).stdout)
    big = next(j for j in data["jobs"] if j["id"] == "too-big")
    assert big["pending_reason"] == "no-fit-memory" and "memory" in big["pending_detail"], big
    # where it was held and whether it ever can run here, as the round said
    assert big["pending_stage"] and big["can_ever_fit"] is False, big
    table = " ".join(runner.invoke(app, ["status", "--state", str(db)]).stdout.split())
    assert f"pending: {big['pending_reason']}" in table
    assert big["pending_detail"].split()[0] in table


def test_environment_variables_are_documented() -> None:
    section = (README.parent / "docs" / "environment.md").read_text()
    help_text = " ".join(runner.invoke(app, ["--help"], terminal_width=400)
                         .stdout.replace("│", " ").split())
    for var in VARIABLES:
        assert f"`{var}`" in section, var
        assert var in help_text, var


def test_bench_estimate_follows_apportion_data(tmp_path: Path) -> None:
    env = {**os.environ, "APPORTION_DATA": str(tmp_path / "elsewhere")}
    r = subprocess.run([APPORTION, "bench", "estimate", "--against", "crius"], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and str(tmp_path / "elsewhere") in r.stderr, r.stderr
    assert "APPORTION_DATA" in r.stderr and "Traceback" not in r.stderr


def test_reproduce_writes_only_under_out(tmp_path: Path) -> None:
    import apportion.experiments.reproduce as rep

    package = Path(rep.__file__).parent / "results"
    before = {p: p.stat().st_mtime for p in package.glob("*")}
    rows = [{"policy": "fcfs", "avg_jct_h": 1.5}]
    rep._OUT[0] = tmp_path / "out"
    try:
        path = rep._table(rows, "probe", "# probe")
    finally:
        rep._OUT[0] = rep.DEFAULT_OUT
    assert path == tmp_path / "out" / "probe.md" and "| fcfs | 1.5 |" in path.read_text()
    assert {p: p.stat().st_mtime for p in package.glob("*")} == before
    r = subprocess.run([sys.executable, "-m", "apportion.experiments.reproduce", "gavel",
                        "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "--out" in r.stdout


def test_printed_ids_are_escaped(tmp_path: Path) -> None:
    """A store row written by an older apportion (before ids were checked) must not reach
    the terminal raw: tables, messages and logs escape it."""
    import sqlite3

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [{"id": "plain", "model": "bert-0.76b",
                                              "global_batch_size": 64, "iterations": 100,
                                              "requested_gpus": 2}]}))
    db = tmp_path / "s.db"
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA foreign_keys = OFF")
    evil = "bad\x1b[2J\x07id"
    for table, col in (("jobs", "id"), ("job_events", "job")):
        conn.execute(f"UPDATE {table} SET {col} = ?", (evil,))
    conn.commit()
    conn.close()
    outs = [runner.invoke(app, ["status", "--state", str(db)]),
            runner.invoke(app, ["solve-round", "--state", str(db), "--backend", "greedy",
                                "--no-isolate"]),
            runner.invoke(app, ["cancel", evil, "--state", str(db)]),
            runner.invoke(app, ["cancel", "other\x1b]0;x\x07", "--state", str(db)])]
    for r in outs:
        assert "\x1b" not in r.output and "\x07" not in r.output, repr(r.output)
    assert "bad\\x1b[2J\\x07id" in outs[0].stdout
