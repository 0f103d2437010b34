"""A trace format added from outside the package (examples/trace_plugin, a few lines),
installed with pip as examples/research_plugin is: ``apportion traces`` lists it,
``simulate`` detects a file of it by its columns and replays it, and it passes
``apportion.testing.check_trace_format``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from plugin_site import install_example, run_in



@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_example("trace_plugin", tmp_path_factory.mktemp("site"))


def _run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_in(site, *args, cwd=cwd)


def test_the_plugin_format_is_listed_replayed_and_checked(site: Path, tmp_path: Path) -> None:
    r = _run(site, "-m", "apportion.cli", "traces", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "team-log" in json.loads(r.stdout)["formats"]
    log = tmp_path / "jobs.log"  # no telling suffix: detected by its columns
    log.write_text("id,arrival_min,gpus,model,batch,steps\n"
                   "a,0,2,bert-0.76b,64,400\nb,3,1,wresnet-0.5b,256,200\nc,9,4,moe-0.69b,256,100\n")
    r = _run(site, "-m", "apportion.cli", "simulate", "--trace", str(log), "--cluster",
             "crius-testbed", "--policy", "apportion", "--deterministic", "--json",
             str(tmp_path / "s.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["trace_format"] == "team-log" and s["finished"] == 3 and s["truth"] == "analytic"
    r = _run(site, "-c", "from apportion.testing import check_trace_format\n"
             "check_trace_format('team-log')\n", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
