"""The ground truth of a replay follows the trace's content, never its path (issue 17).

``simulate --trace my-morphling-workload.csv`` outside a folder named ``morphling/``
picked Crius's truth from the path, made no progress for 500 rounds and exited 0 with 0
of 320 jobs finished. The format is now detected from the file; ``--truth`` overrides
it; a truth that knows none of the jobs is refused before the replay (exit 2); and a
replay in which jobs stop progressing exits non-zero naming them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()


def test_morphling_workload_anywhere_replays_with_morphling_truth(shared_data: Path,
                                                                   tmp_path: Path) -> None:
    f = tmp_path / "my-morphling-workload.csv"
    shutil.copy(shared_data / catalog.BUNDLED["morphling-base"], f)
    assert tr.load_any(f).format == "morphling"
    r = runner.invoke(app, ["simulate", "--trace", str(f), "--cluster", "morphling-64",
                            "--policy", "fcfs", "--max-jobs", "30"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["truth"] == "morphling" and summary["finished"] == 30


def test_formats_are_detected_from_content(shared_data: Path, tmp_path: Path) -> None:
    want = {"gavel-small": "gavel", "crius-philly": "crius", "morphling-mt": "morphling",
            "philly": "raw", "gavel-msr": "gavel-csv", "elasticflow-philly": "elasticflow"}
    for name, fmt in want.items():
        src = shared_data / catalog.BUNDLED[name]
        plain = tmp_path / f"renamed-{name}.data"  # no telling suffix, no telling folder
        shutil.copy(src, plain)
        assert tr.load_any(plain).format == fmt, name


def test_a_truth_that_knows_no_job_is_refused(shared_data: Path, tmp_path: Path) -> None:
    f = tmp_path / "w.csv"
    shutil.copy(shared_data / catalog.BUNDLED["morphling-base"], f)
    r = runner.invoke(app, ["simulate", "--trace", str(f), "--cluster", "morphling-64",
                            "--policy", "fcfs", "--truth", "gavel", "--max-jobs", "5"])
    assert r.exit_code == 2 and "--truth" in r.stderr and "knows none" in r.stderr, r.output


def test_stalled_replay_fails_naming_the_jobs(shared_data: Path, tmp_path: Path) -> None:
    trace = tmp_path / "two.trace"  # one job Gavel measured, one it never did
    trace.write_text(
        "Transformer (batch size 128)\tx\tx\t-step\t1\t346\t1\t1\t-1.000000\t0\n"
        "No Such Model (batch size 1)\tx\tx\t-step\t1\t100\t1\t1\t-1.000000\t10\n")
    out = tmp_path / "summary.json"
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "4:0:0",
                            "--policy", "fifo", "--profile", "gavel", "--json", str(out)])
    assert r.exit_code == 1, r.output
    assert "1 of 2 jobs stopped progressing" in r.stderr and "00001" in r.stderr, r.stderr
    assert json.loads(out.read_text())["finished"] == 1  # the outputs still show the state
