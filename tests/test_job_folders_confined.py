"""Job folders are confined: a link or a foreign folder planted where the local executor
will write is refused, never followed, and the launch fails visibly.

Each case once wrote as root outside ``--workdir``: a ``.OWNER.tmp`` link to a file had
the file overwritten; a linked job folder or ``checkpoint/`` received the job's files. The
door is the executor's ``apply`` with a real worker command (no torch needed); the check
is that the planted target is untouched and the job's event names what was refused.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from apportion.runtime.executors.confined import (
    UnsafeFolder,
    confine,
    open_in,
    replace_in,
    touch_in,
)
from apportion.runtime.executors.local.executor import LocalExecutor, local_cluster

from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, Workload, job_dirname
from apportion.plans import ExecutionPlan

# exits at once, having written nothing of its own
QUICK = (sys.executable, "-c", "pass")


def _job() -> JobSpec:
    return JobSpec("j1", "gpt-tiny", 8, 5, 1, workload=Workload("torchrun", QUICK))


def _decision(job: JobSpec) -> Decision:
    cluster = local_cluster(1)
    node = next(iter(cluster.nodes))
    alloc = Allocation(job.id, cluster.gpu_types[0], 1, 1, ExecutionPlan(), {node: 1}, 1.0,
                       action=Action.START)
    return Decision([alloc], [], SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False))


def _launch(tmp_path: Path) -> str:
    """Apply a one-job decision; the job's launch event's kind and detail."""
    ex = LocalExecutor(tmp_path / "work", spawn_method="subprocess")
    job = _job()
    try:
        events = ex.apply(_decision(job), [job])
    finally:
        ex.shutdown()
    ev = [e for e in events if e.job == job.id]
    return " ".join(f"{e.action} {e.detail}" for e in ev)


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    return v


def _jobdir(tmp_path: Path) -> Path:
    d = tmp_path / "work" / job_dirname("j1")
    d.parent.mkdir(parents=True, exist_ok=True)
    return d


@pytest.mark.parametrize("planted", [".OWNER.tmp", "OWNER", "rank0.log", "rank0.err", "STOP",
                                     "config.json", ".lock"])
def test_a_link_planted_in_a_job_folder_is_refused(tmp_path: Path, victim: Path,
                                                   planted: str) -> None:
    d = _jobdir(tmp_path)
    d.mkdir()
    (d / planted).symlink_to(victim)
    out = _launch(tmp_path)
    assert victim.read_text() == "precious\n"
    assert "failed" in out and "symbolic link" in out and planted in out, out


def test_a_linked_job_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _jobdir(tmp_path).symlink_to(outside, target_is_directory=True)
    out = _launch(tmp_path)
    assert list(outside.iterdir()) == []
    assert "failed" in out and "symbolic link" in out, out


def test_a_linked_checkpoint_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    d = _jobdir(tmp_path)
    d.mkdir()
    (d / "checkpoint").symlink_to(outside, target_is_directory=True)
    out = _launch(tmp_path)
    assert list(outside.iterdir()) == []
    assert "failed" in out and "checkpoint" in out, out


def test_a_hard_link_to_another_file_is_not_appended_to(tmp_path: Path, victim: Path) -> None:
    d = _jobdir(tmp_path)
    d.mkdir()
    os.link(victim, d / "rank0.log")
    out = _launch(tmp_path)
    assert victim.read_text() == "precious\n"
    assert "failed" in out and "hard link" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder away")
def test_a_job_folder_someone_else_made_is_refused(tmp_path: Path) -> None:
    d = _jobdir(tmp_path)
    d.mkdir()
    os.chown(d, 65534, 65534)  # nobody's: they could plant links in it at any time
    out = _launch(tmp_path)
    assert "failed" in out and "owned by uid 65534" in out, out
    assert list(d.iterdir()) == []


def test_a_clean_folder_launches_and_is_writable_by_its_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)  # a loose umask must not leave the folder open to others
    try:
        out = _launch(tmp_path)
    finally:
        os.umask(old)
    d = _jobdir(tmp_path)
    assert "failed" not in out, out
    for f in (d, d / "checkpoint"):
        assert not f.stat().st_mode & 0o022, oct(f.stat().st_mode)
    assert (d / "config.json").is_file() and not (d / "config.json").is_symlink()


def test_the_helpers_refuse_by_name(tmp_path: Path, victim: Path) -> None:
    d = confine(tmp_path / "jd", ("checkpoint",))
    (d / "x").symlink_to(victim)
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        open_in(d, "x")
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        touch_in(d, "x")
    replace_in(d, "x", b"new")  # a rename replaces the link itself, never its target
    assert victim.read_text() == "precious\n" and (d / "x").read_bytes() == b"new"
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        (d / "y").symlink_to(victim)
        confine(d)
