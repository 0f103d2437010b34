"""Job ids are names, never paths; checkpoints never load code (issue 17, critical items).

A job id comes from whoever submits the job. It must not choose where the
executor writes (``../../x``, ``/abs``), two ids must never share a folder
(``x`` and ``./x``), and a file planted where a checkpoint is read must not
run anything when a worker loads it.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.config import jobs_from_data
from apportion.decision import Allocation
from apportion.errors import InputError
from apportion.jobs import JobSpec, control_characters, job_dirname, printable_id
from apportion.plans import ExecutionPlan

HOSTILE = ["../../X", "/abs/path", "./x", "x", "x/", "..", ".", "a/../../b", "~root",
           "with space", "\u202eevil", "é" * 300, "a" * 256, "-rf", ".hidden"]


@given(st.text(min_size=1, max_size=256))
@settings(max_examples=300, deadline=None)
def test_dirname_is_one_safe_component(job_id: str) -> None:
    name = job_dirname(job_id)
    assert "/" not in name and "\\" not in name and "\0" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert len(name.encode()) <= 255  # one file-name component on every POSIX file system
    assert Path(name).name == name and len(Path(name).parts) == 1


@given(st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
@settings(max_examples=300, deadline=None)
def test_distinct_ids_distinct_folders(a: str, b: str) -> None:
    if a != b:
        assert job_dirname(a) != job_dirname(b)
    else:
        assert job_dirname(a) == job_dirname(b)


@pytest.mark.parametrize("job_id", HOSTILE)
def test_launch_spec_stays_inside_the_workdir(tmp_path: Path, job_id: str) -> None:
    pytest.importorskip("torch")
    from apportion.runtime.executors.launch import launch_spec

    work = tmp_path / "runs"
    job = JobSpec(job_id, "gpt-tiny", 8, 10, 1)
    alloc = Allocation(job_id, "A40", 1, 1, ExecutionPlan(dp=1), {"n0": 1}, 1.0)
    spec = launch_spec(job, alloc, "start", work)
    jobdir = Path(spec.workdir).resolve()
    assert jobdir.parent == work.resolve()
    assert Path(spec.command[-1]).resolve().parent == jobdir
    assert Path(spec.config["workdir"]).resolve() == jobdir


def test_x_and_dot_x_do_not_share_state(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from apportion.runtime.executors.launch import launch_spec

    dirs = set()
    for jid in ("x", "./x", "x/", "x/."):
        job = JobSpec(jid, "gpt-tiny", 8, 10, 1)
        alloc = Allocation(jid, "A40", 1, 1, ExecutionPlan(dp=1), {"n0": 1}, 1.0)
        dirs.add(launch_spec(job, alloc, "start", tmp_path).workdir)
    assert len(dirs) == 4


def test_kubernetes_checkpoint_dir_is_derived_from_the_id() -> None:
    pytest.importorskip("yaml")
    from apportion.cluster import Cluster, NodeGroup
    from apportion.runtime.executors.kubernetes.config import K8sConfig
    from apportion.runtime.executors.kubernetes.manifests import Target, job_objects

    CHECKPOINT_DIR = K8sConfig().checkpoint_mount
    job = JobSpec("../../etc", "gpt-tiny", 8, 10, 1)
    alloc = Allocation(job.id, "A40", 1, 1, ExecutionPlan(dp=1), {"n0-0": 1}, 1.0)
    objs = job_objects(job, alloc, Target(Cluster("c", [NodeGroup("n0", 1, "A40", 1)]),
                                          K8sConfig(), "trainjob"))
    text = repr(objs)
    assert f"{CHECKPOINT_DIR}/{job_dirname(job.id)}" in text
    assert f"{CHECKPOINT_DIR}/../../etc" not in text


@pytest.mark.parametrize("job_id", ["a\x1b[2Jb", "tab\there", "bell\x07", "nl\nx", "\u202eabc",
                                    "del\x7f", "c1\x9b"])
def test_control_characters_are_refused_at_input(job_id: str) -> None:
    data = {"jobs": [{"id": job_id, "model": "bert-0.76b", "global_batch_size": 8,
                      "iterations": 10, "requested_gpus": 1}]}
    with pytest.raises(InputError) as exc:
        jobs_from_data(data, "jobs.yaml")
    assert "jobs[0].id" in str(exc.value) and "control characters" in str(exc.value)
    assert control_characters(job_id)


def test_printable_id_escapes() -> None:
    assert printable_id("ok-1") == "ok-1"
    assert "\x1b" not in printable_id("a\x1b[31m")
    assert printable_id("a\x1b[31m") == "a\\x1b[31m"


# -- checkpoints ----------------------------------------------------------------------------
class _Payload:
    """What an attacker plants: unpickling calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_planted_checkpoint_runs_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from apportion.runtime.workers import checkpoint as ckpt

    marker = tmp_path / "pwned"
    path = tmp_path / ckpt.CHECKPOINT_NAME
    torch.save({"iteration": 1, "samples_seen": 8, "model": {}, "optimizer": {},
                "evil": _Payload(marker)}, path)
    with pytest.raises(ckpt.CheckpointError) as exc:
        ckpt.load(path)
    assert str(path) in str(exc.value)
    assert not marker.exists()
    # a plain pickle (not even torch's zip format) is refused the same way
    path.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_damaged_checkpoint_is_reported(tmp_path: Path, content: bytes) -> None:
    pytest.importorskip("torch")
    from apportion.runtime.workers import checkpoint as ckpt

    path = tmp_path / ckpt.CHECKPOINT_NAME
    path.write_bytes(content)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(path)


def test_wrong_shape_checkpoint_is_reported(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from apportion.runtime.workers import checkpoint as ckpt

    path = tmp_path / ckpt.CHECKPOINT_NAME
    torch.save({"iteration": "lots", "samples_seen": 1, "model": {}, "optimizer": {}}, path)
    with pytest.raises(ckpt.CheckpointError, match="iteration"):
        ckpt.load(path)
    torch.save([1, 2, 3], path)
    with pytest.raises(ckpt.CheckpointError, match="not an apportion checkpoint"):
        ckpt.load(path)


def test_real_checkpoint_round_trips_weights_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from apportion.runtime.workers import checkpoint as ckpt

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    path = tmp_path / ckpt.CHECKPOINT_NAME
    ckpt.save(path, ckpt.TrainState(3, 24, net.state_dict(), opt.state_dict(), ckpt.rng_state(),
                                    {"plan": "dp1"}))
    st_ = ckpt.load(path)
    assert st_ is not None and st_.iteration == 3 and st_.samples_seen == 24
    assert torch.equal(st_.model["weight"], net.weight.detach())
    opt2 = torch.optim.AdamW(net.parameters(), lr=1e-3)
    opt2.load_state_dict(st_.optimizer)
    ckpt.set_rng_state(st_.rng)
    assert st_.meta == {"plan": "dp1"}


def test_worker_fails_with_the_reason_on_a_planted_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from apportion.runtime.workers import checkpoint as ckpt
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.workers.trainer import main

    marker = tmp_path / "pwned"
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    ckpt.job_checkpoint(jobdir).parent.mkdir()
    torch.save({"evil": _Payload(marker)}, ckpt.job_checkpoint(jobdir))
    cfg = TrainConfig(job="j", model="gpt-tiny", global_batch_size=4, iterations=2,
                      plan={"dp": 1}, workdir=str(jobdir), backend="gloo")
    cfg.dump(jobdir / "config.json")
    import signal

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    assert main([str(jobdir / "config.json")]) == 1
    assert not marker.exists()
    # run in-process, the trainer leaves the caller's stop signals alone (an ignored
    # SIGTERM would be inherited by every child the caller starts: unstoppable workers)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    from apportion.runtime.workers.train_config import read_json_file

    prog = read_json_file(jobdir / "progress.json")
    assert prog is not None and prog.get("health", prog.get("state")) == "failed"
    assert "CheckpointError" in str(prog)
