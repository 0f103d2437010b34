"""An executor added from outside the package (examples/executor_plugin, a few lines),
installed with pip as examples/research_plugin and examples/trace_plugin are: ``apportion
executors`` lists it, ``apportion run --executor spool`` applies a round through it, and it
passes ``apportion.testing.check_executor``. An executor written to the three calls alone
(a plug-in older than the Executor base class) still runs, with the base's answers for the
rest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from plugin_site import install_example, run_in

from apportion.decision import Decision, SolveReport
from apportion.runtime.executors import Executor, as_executor
from apportion.testing import check_executor



@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_example("executor_plugin", tmp_path_factory.mktemp("site"))


def _run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_in(site, *args, cwd=cwd)


def test_the_plugin_executor_is_listed_runs_and_is_checked(site: Path, tmp_path: Path) -> None:
    r = _run(site, "-m", "apportion.cli", "executors", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)["executors"]
    assert listed["spool"]["plugin"] is True and listed["spool"]["what"]
    assert listed["local"]["plugin"] is False
    (tmp_path / "j.yaml").write_text("jobs:\n  - {id: a, model: bert-336m, global_batch_size: "
                                     "32, iterations: 10, requested_gpus: 2}\n")
    r = _run(site, "-m", "apportion.cli", "submit", "j.yaml", "--state", "s.db", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run(site, "-m", "apportion.cli", "run", "--executor", "spool", "--cluster",
             "crius-testbed", "--state", "s.db", "--workdir", "runs", "--interval", "1",
             "--timeout", "2", "--time-budget", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    spooled = sorted((tmp_path / "runs" / "spool").iterdir())
    launches = [json.loads(p.read_text()) for p in spooled if p.name.endswith("-launch.json")]
    assert [s["job"] for s in launches] == ["a"], spooled
    assert launches[0]["workers"] >= 1 and launches[0]["command"], launches[0]
    assert spooled[-1].name.endswith("a-stop.json")  # the run stopped it as it ended
    r = _run(site, "-c", "from apportion.testing import check_executor\n"
             "check_executor('spool')\n", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


class ThreeCalls:
    """An executor as a plug-in wrote one before the base class: a name and three calls."""

    name = "three-calls"

    def __init__(self) -> None:
        self.closed = False

    def apply(self, decision, state):
        return []

    def poll(self):
        return []

    def shutdown(self, checkpoint=True):
        return []

    def close(self) -> None:
        self.closed = True


def test_an_executor_of_three_calls_runs_with_the_bases_answers() -> None:
    inner = ThreeCalls()
    ex = as_executor(inner)
    assert isinstance(ex, Executor) and ex.name == "three-calls"
    assert ex.stop_timeout_s is None and ex.adopted_jobs() == set()
    assert ex.reconcile([], {}) == [] and ex.stop_adopted() is False
    report = SolveReport("t", "optimal", 0.0, 0.0, 0.0, 0.0, False)
    assert ex.apply(Decision([], [], report), []) == [] and ex.poll() == []
    ex.close()
    assert inner.closed  # what it defines of the rest it keeps
    check_executor(inner)  # the protocol of three calls, as before the base class
    with pytest.raises(TypeError, match="not an executor"):
        as_executor(object())


def test_a_broken_executor_fails_its_check_by_name() -> None:
    class NoName(ThreeCalls):
        name = ""

    with pytest.raises(AssertionError, match="not an executor"):
        check_executor(NoName())
    with pytest.raises(AssertionError, match="not a registered executor"):
        check_executor("no-such-executor")
