"""A job's failure is the job's: through ``apportion run --executor local``, a job whose
command does not exist, one that exits 0 short of its target, and a DeepSpeed job whose
checkpoint folder holds a planted pickle each fail their launches, count towards
``--max-retries`` and end ``failed`` with their reason, while their neighbours train to
the end; a job that sets its own ``PATH`` still gets apportion's ``python``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from apportion.jobs import job_dirname

REPORT = ("from apportion.runtime import workload as w\n"
          "n = w.iterations()\n"
          "for i in range(1, n + 1):\n"
          "    w.report_progress(i, checkpoint=i == n)\n")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_bad_jobs_fail_alone(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    (tmp_path / "report.py").write_text(REPORT)
    cache = str(os.environ.get("TORCH_EXTENSIONS_DIR")
                or Path(tempfile.gettempdir()) / "apportion-torch-extensions")
    job = {"model": "gpt-tiny", "global_batch_size": 4, "requested_gpus": 1}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "missing", **job, "iterations": 5,
         "workload": {"kind": "torchrun", "command": ["/nonexistent/binary"]}},
        {"id": "short", **job, "iterations": 5,
         "workload": {"kind": "torchrun", "command": ["python", "-c", "pass"]}},
        {"id": "own-path", **job, "iterations": 5,
         "workload": {"kind": "torchrun", "command": ["python", str(tmp_path / "report.py")],
                      "env": {"PATH": "/nonexistent-dir"}}},
        {"id": "planted", **job, "iterations": 5,
         "workload": {"kind": "deepspeed", "env": {"TORCH_EXTENSIONS_DIR": cache}}},
        {"id": "good", **job, "iterations": 4}]}))
    marker = tmp_path / "pwned"
    ck = tmp_path / "apportion-runs" / job_dirname("planted") / "checkpoint"
    (ck / "global_step1").mkdir(parents=True)
    (ck / "latest").write_text("global_step1")
    (ck / "apportion.json").write_text(json.dumps({"zero": 0, "dp": 1, "iteration": 1}))
    torch.save({"module": {}, "evil": _Payload(marker)},
               ck / "global_step1" / "mp_rank_00_model_states.pt")
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", "local", "--cluster", "local", "--state", "s.db",
             "--interval", "2", "--until-idle", "--timeout", "800", "--max-retries", "1",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    st = {j["id"]: j for j in out["jobs"]}
    assert st["good"]["state"] == "finished" and st["good"]["iterations_done"] == 4, st["good"]
    assert st["own-path"]["state"] == "finished", st["own-path"]
    for j, why in (("missing", "launch failed: FileNotFoundError"),
                   ("short", "exited 0 at iteration 0 of 5"),
                   ("planted", "CheckpointError")):
        assert st[j]["state"] == "failed", st[j]
        assert why in st[j]["reason"] and "2 times in a row" in st[j]["reason"], st[j]
    assert "mp_rank_00_model_states.pt" in st["planted"]["reason"]
    assert not marker.exists()


def test_bad_jobs_fail_alone_on_ray(tmp_path: Path) -> None:
    """The same through `apportion run --executor ray` (an embedded Ray instance of its own):
    a job whose command does not exist fails its launches with the reason (a rank that
    cannot start), one that exits 0 short of its target is a failure (it was relaunched for
    ever: the Ray executor called it checkpointed), both end failed after --max-retries, a
    job that sets its own PATH still gets apportion's `python` (it could not start), and the
    good job trains to the end beside them."""
    pytest.importorskip("ray")
    from conftest import stop_processes_mentioning

    (tmp_path / "report.py").write_text(REPORT)
    job = {"model": "gpt-tiny", "global_batch_size": 4, "requested_gpus": 1, "iterations": 5}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": "missing", **job,
         "workload": {"kind": "torchrun", "command": ["/nonexistent/binary"]}},
        {"id": "short", **job,
         "workload": {"kind": "torchrun", "command": ["python", "-c", "pass"]}},
        {"id": "own-path", **job,
         "workload": {"kind": "torchrun", "command": ["python", str(tmp_path / "report.py")],
                      "env": {"PATH": "/nonexistent-dir"}}},
        {"id": "good", **job,
         "workload": {"kind": "torchrun", "command": ["python", str(tmp_path / "report.py")]}}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-fc-", dir="/tmp"))  # short: socket paths
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp),
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        r = subprocess.run([sys.executable, "-m", "apportion.cli", "run", "--executor", "ray",
                            "--cluster", "local", "--state", "s.db", "--interval", "2",
                            "--until-idle", "--timeout", "400", "--max-retries", "1"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=700,
                           check=False)
    finally:
        stop_processes_mentioning(ray_tmp)  # whatever Ray the run left, and only that
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    st = {j["id"]: j for j in out["jobs"]}
    for j in ("good", "own-path"):
        assert st[j]["state"] == "finished" and st[j]["iterations_done"] == 5, \
            (st[j], r.stderr[-3000:])
    for j, why in (("missing", "cannot start ['/nonexistent/binary']: FileNotFoundError"),
                   ("short", "exited 0 at iteration 0 of 5")):
        assert st[j]["state"] == "failed", (st[j], r.stderr[-3000:])
        assert why in st[j]["reason"] and "2 times in a row" in st[j]["reason"], st[j]
