"""The research API keeps its promises, through the doors a researcher uses: a plug-in
installed with pip (examples/research_plugin: a constraint added to the cell formulation,
and a policy of its own) appears in ``apportion policies``, runs under ``solve-round
--formulation`` and ``simulate --policy``, passes ``apportion.testing``'s checks, and its
added row holds whichever answer the round uses — the solver chain's, or the greedy's
when the greedy breaks it (it used to be kept as the floor: 12 starts where 2 were
allowed, reported ``fallback: False``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_site import install_example, run_in



@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_example("research_plugin", tmp_path_factory.mktemp("site"))


def _cli(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_in(site, "-m", "apportion.cli", *args, cwd=cwd)


def _starts(decision: dict) -> int:
    return sum(1 for a in decision["allocations"] if a["action"] == "start")


def test_the_plugin_appears_in_every_list(site: Path, tmp_path: Path) -> None:
    r = _cli(site, "policies", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = json.loads(r.stdout)
    assert "largest-first" in names and "apportion-two-starts" in names


@pytest.mark.parametrize("backend", ["auto", "highs", "greedy"])
def test_an_added_row_holds_whichever_answer_is_used(site: Path, tmp_path: Path,
                                                     backend: str) -> None:
    out = tmp_path / "d.json"
    r = _cli(site, "solve-round", "--formulation", "cells-two-starts", "--backend", backend,
             "--time-budget", "5", "--no-isolate", "--json", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert _starts(d) <= 2, d["allocations"]
    if backend == "greedy":  # the greedy starts every job that fits: it breaks the row
        assert d["solver"]["fallback"] is True
        assert "at-most-two-starts" in d["solver"]["fallback_reason"]
        # ... so its answer is no answer (it was listed as feasible), and a job left waiting
        # says the round kept the running jobs, not that the capacity went elsewhere
        (greedy,) = [a for a in d["solver"]["attempts"] if a["backend"] == "greedy"]
        assert greedy["status"] == "error" and "breaks the model" in greedy["message"], greedy
        waiting = [p for p in d["pending"] if p["reason"] == "no-capacity"]
        assert waiting and all("breaks the model" in p["detail"]
                               and "higher-value" not in p["detail"] for p in waiting), waiting
    else:
        assert d["solver"]["fallback"] is False and _starts(d) == 2


def test_the_plugins_policy_replays_and_passes_the_checks(site: Path, tmp_path: Path) -> None:
    r = _cli(site, "simulate", "--trace", "synthetic:12", "--cluster", "8:8:8", "--policy",
             "largest-first", "--json", str(tmp_path / "s.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["policy"] == "largest-first"
    code = ("from apportion.testing import check_formulation, check_policy\n"
            "check_policy('largest-first')\n"
            "check_policy('apportion-two-starts')\n"
            "check_formulation('cells-two-starts')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


ESTIMATOR_PLUGIN = '''
from apportion.estimation.models.analytic import AnalyticEstimator


class Doubled(AnalyticEstimator):
    """The analytic model, twice as pessimistic (a researcher's estimator)."""

    def predict(self, job, plan, placement, cluster):
        from dataclasses import replace
        e = super().predict(job, plan, placement, cluster)
        return replace(e, iter_time_s=2 * e.iter_time_s)


def dry(workdir, launch_log=None):
    from apportion.runtime.executors.dry_run.executor import DryRunExecutor
    ex = DryRunExecutor(workdir)
    ex.name = "my-dry"
    return ex
'''


def test_estimator_and_executor_plugins_appear_at_their_doors(tmp_path: Path) -> None:
    """Entry points ``apportion.estimators`` and ``apportion.executors``: a package's
    estimator is a ``--estimator`` choice of solve-round, its executor an ``--executor``
    choice of run."""
    site = tmp_path / "site"
    (site / "more_plug-0.1.dist-info").mkdir(parents=True)
    (site / "more_plug-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: more-plug\nVersion: 0.1\n")
    (site / "more_plug-0.1.dist-info" / "entry_points.txt").write_text(
        "[apportion.estimators]\ndoubled = more_plug:Doubled\n"
        "[apportion.executors]\nmy-dry = more_plug:dry\n")
    (site / "more_plug.py").write_text(ESTIMATOR_PLUGIN)
    r = _cli(site, "solve-round", "--estimator", "doubled", "--json", str(tmp_path / "d.json"),
             "--time-budget", "3", "--no-isolate", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["allocations"]
    (tmp_path / "j.yaml").write_text("jobs:\n  - {id: a, model: bert-336m, global_batch_size: 32,"
                                     " iterations: 10, requested_gpus: 1}\n")
    assert _cli(site, "submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli(site, "run", "--executor", "my-dry", "--cluster", "crius-testbed", "--state",
             "s.db", "--interval", "1", "--timeout", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"action": "start"' in r.stdout
