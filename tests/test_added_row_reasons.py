"""A round whose heuristic answer breaks a researcher's added row (the research plug-in's
at-most-two-starts, registered in-process here; tests/test_plugins.py installs it with pip)
reports that answer as no answer, and each job it left waiting says why: it read "the
capacity went to higher-value jobs" and the greedy's attempt was listed as feasible."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from apportion.config import default_cluster, default_jobs
from apportion.decision import Reason
from apportion.policies import RoundConfig, run_round
from apportion.policies import recipes as recipe_registry

PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "research_plugin" / "two_starts.py"


def test_an_answer_that_breaks_an_added_row_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("two_starts_in_process", PLUGIN)
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    recipe = plugin.recipe()
    monkeypatch.setitem(recipe_registry.RECIPES, recipe.name, recipe)
    jobs, now = default_jobs()
    d = run_round(default_cluster(), jobs, now,
                  RoundConfig(formulation=recipe.name, backend="greedy", time_budget_s=5,
                              isolate=False)).decision
    assert d.report.fallback and "at-most-two-starts" in d.report.fallback_reason
    (greedy,) = [a for a in d.report.attempts if a["backend"] == "greedy"]
    assert greedy["status"] == "error" and "breaks the model" in greedy["message"], greedy
    waiting = [p for p in d.pending if p.reason is Reason.NO_CAPACITY]
    assert waiting and all("breaks the model" in p.detail and "higher-value" not in p.detail
                           for p in waiting)
