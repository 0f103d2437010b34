"""`compare` never hangs: a failed run fails its row, every error reaches the parent (as text,
whatever its class), a dead worker fails its runs, and the progress total is known from the
start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from apportion.experiments import harness
from apportion.experiments.harness import CompareFailed, compare, trace_jobs

# a hang fails the test instead of the suite (before the fix compare waited forever)
pytestmark = pytest.mark.timeout(300)


class Weird(Exception):
    """An exception that cannot be pickled back: its constructor takes two arguments, its
    pickled form carries one (the message). Sent raw to a parent, it killed the pool's
    result thread and the parent waited forever."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"weird {a}/{b}")


class Exploding:
    """An estimator whose every estimate raises :class:`Weird` (inside a worker process)."""

    def best_in_cell(self, *args: Any, **kw: Any) -> Any:
        raise Weird(1, 2)

    def predict(self, *args: Any, **kw: Any) -> Any:
        raise Weird(1, 2)


class Dying:
    """An estimator whose first estimate ends its process, as the OOM killer would."""

    def best_in_cell(self, *args: Any, **kw: Any) -> Any:
        os._exit(3)

    def predict(self, *args: Any, **kw: Any) -> Any:
        os._exit(3)


def test_an_unpicklable_error_fails_its_row_and_the_command(tmp_path: Path) -> None:
    with pytest.raises(TypeError):  # the premise: it does not survive a round trip
        import pickle

        pickle.loads(pickle.dumps(Weird(1, 2)))
    with pytest.raises(CompareFailed) as got:
        compare("synthetic:4", "crius-testbed", ["fcfs", "apportion"], 1, tmp_path, run="r",
                policy_options={"apportion": {"estimator": Exploding(), "time_budget_s": 0.5}},
                workers=2, show_progress=False, plots=False)
    assert list(got.value.failures) == [("apportion", 0)]
    assert got.value.failures[("apportion", 0)].startswith("Weird: weird 1/2")
    assert "apportion seed 0: Weird: weird 1/2" in str(got.value)
    table = pd.read_csv(tmp_path / "r" / "summary.csv")
    rows = {r["policy"]: r for _, r in table.iterrows()}
    assert rows["fcfs"]["finished"] == 4 and pd.isna(rows["fcfs"]["error"])  # the other ran
    assert rows["apportion"]["seeds"] == 0 and "Weird" in rows["apportion"]["error"]
    assert "failed (seed 0): Weird: weird 1/2" in (tmp_path / "r" / "summary.md").read_text()
    assert (tmp_path / "r" / "fcfs-s0" / "summary.json").exists()
    assert not (tmp_path / "r" / "apportion-s0" / "summary.json").exists()  # redone next time


def test_a_worker_that_dies_fails_its_runs(tmp_path: Path) -> None:
    with pytest.raises(CompareFailed) as got:
        compare("synthetic:3", "crius-testbed", ["apportion"], 1, tmp_path, run="r",
                policy_options={"apportion": {"estimator": Dying(), "time_budget_s": 0.5}},
                workers=1, show_progress=False, plots=False)
    assert "BrokenProcessPool" in got.value.failures[("apportion", 0)]


def test_the_progress_total_is_every_runs_jobs_from_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    class Recorder:
        def __init__(self, description: str, total: int | None = None, unit: str = "",
                     heartbeat: bool = False, enabled: bool = True) -> None:
            seen.append(("init", total))

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, done: float, total: float | None = None) -> None:
            seen.append(("update", done, total))

    import apportion.console

    monkeypatch.setattr(apportion.console, "Progress", Recorder)
    assert trace_jobs("synthetic:5", "crius-testbed") == 5
    compare("synthetic:5", "crius-testbed", ["fcfs", "srtf"], 2, tmp_path, run="r", workers=2,
            plots=False)
    assert seen[0] == ("init", 20)  # 2 policies x 2 seeds x 5 jobs, before any run started
    assert all(u[2] == 20 for u in seen[1:])
    assert seen[-1][1] == 20


def test_a_trace_the_cluster_cannot_replay_is_refused_before_any_worker(
        tmp_path: Path, shared_data: Path) -> None:
    from apportion.errors import InputError

    with pytest.raises(InputError, match="--truth"):
        harness.compare("elasticflow-philly", "4:4:4", ["fcfs"], 1, tmp_path, run="r",
                        show_progress=False, plots=False)
