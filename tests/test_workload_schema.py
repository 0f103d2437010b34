"""The jobs YAML ``workload`` block (a contract): parsed, stored, and bad fields named."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.config import jobs_from_data
from apportion.errors import InputError
from apportion.jobs import Workload
from apportion.store import open_store


def _job(workload: object) -> dict:
    return {"jobs": [{"id": "u1", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 10,
                      "requested_gpus": 2, "workload": workload}]}


def test_workload_parsed_and_survives_the_store(tmp_path: Path) -> None:
    jobs, _ = jobs_from_data(_job({"kind": "torchrun", "command": ["python", "train.py"],
                                   "workdir": "/src", "env": {"FOO": "bar"}, "image": "img:1"}),
                             "j.yaml")
    w = jobs[0].workload
    assert w == Workload("torchrun", ("python", "train.py"), "/src", {"FOO": "bar"}, "img:1")
    with open_store(tmp_path / "s.db", create=True) as store:
        store.submit(jobs)
        assert store.jobs()[0].to_jobspec().workload == w
    plain, _ = jobs_from_data({"jobs": [{"id": "b", "model": "gpt-tiny", "global_batch_size": 8,
                                         "iterations": 1, "requested_gpus": 1}]}, "j.yaml")
    assert plain[0].workload is None


@pytest.mark.parametrize("workload, field, message", [
    ({"kind": "torchrun"}, "jobs[0].workload", "needs a command"),
    ({"kind": "slurm", "command": ["x"]}, "jobs[0].workload.kind", "'builtin'"),
    ({"kind": "jax", "command": ["x"], "env": {"RANK": "1"}}, "jobs[0].workload.env", "RANK"),
    ({"kind": "jax", "command": ["x"], "env": {"APPORTION_PLAN": "{}"}}, "jobs[0].workload.env",
     "APPORTION_PLAN"),
    ({"kind": "jax", "command": ["x"], "env": {"1BAD": "v"}}, "jobs[0].workload.env.1BAD.[key]", "pattern"),
    ({"kind": "torchrun", "command": []}, "jobs[0].workload.command", "at least 1"),
    ({"kind": "torchrun", "command": ["a\x1b[2J"]}, "jobs[0].workload.command", "control"),
    ({"kind": "torchrun", "command": "python train.py"}, "jobs[0].workload.command", "list"),
    ({"command": ["x"], "extra": 1}, "jobs[0].workload.extra", "unknown field"),
])
def test_bad_workload_fields_are_named(workload: dict, field: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        jobs_from_data(_job(workload), "j.yaml")
    assert exc.value.field == field and message in exc.value.message, str(exc.value)
