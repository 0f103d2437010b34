"""The local executor on a machine with NVIDIA GPUs: the GPUs read from nvidia-smi (here a
stand-in script on PATH that prints what the real one prints for that query, since this
machine has no GPU), the cluster they make, one device per rank."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from apportion.runtime.executors.launch import LaunchSpec
from apportion.runtime.executors.local.executor import LocalExecutor, local_cluster
from apportion.runtime.executors.local.gpus import catalog_type, local_gpus, pick_devices
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture
def two_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    # the real tool's answer to --query-gpu=index,name --format=csv,noheader
    smi.write_text("#!/bin/sh\nprintf '0, NVIDIA H200\\n1, NVIDIA H200\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_product_names_map_to_the_catalog() -> None:
    assert catalog_type("NVIDIA H100 80GB HBM3") == "H100-80GB"
    assert catalog_type("NVIDIA H200") == "H200"
    assert catalog_type("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert catalog_type("Tesla T4") == "T4"
    assert catalog_type("NVIDIA GeForce RTX 9090") is None


def test_gpus_make_the_cluster_and_visible_devices_narrow_them(
        two_h200: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_gpus() == [("0", "NVIDIA H200"), ("1", "NVIDIA H200")]
    c = local_cluster()
    assert c.total_gpus == 2 and {g.gpu_type for g in c.groups} == {"H200"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert local_gpus() == [("1", "NVIDIA H200")]
    assert local_cluster().total_gpus == 1


def test_no_driver_means_cpu_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert local_gpus() == []
    c = local_cluster()
    assert c.total_gpus == 4 and {g.gpu_type for g in c.groups} == {"T4"}


@given(st.lists(st.sampled_from("01234567"), unique=True, max_size=8),
       st.sets(st.sampled_from("01234567")), st.integers(0, 8))
def test_picked_devices_are_free_distinct_and_enough(gpus: list[str], busy: set[str],
                                                    workers: int) -> None:
    got = pick_devices(gpus, busy, workers)
    free = [g for g in gpus if g not in busy]
    if len(free) < workers:
        assert got is None
    else:
        assert got is not None and len(got) == workers == len(set(got))
        assert set(got) <= set(free)


def _spec(job: str, workers: int) -> LaunchSpec:
    return LaunchSpec(job, "start", workers, "H200", {"local-0": workers}, ["true"], {}, {}, ".",
                      per_worker_env=[{"RANK": str(r), "LOCAL_RANK": str(r)}
                                      for r in range(workers)])


def test_each_rank_gets_its_own_gpu(two_h200: None, tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path / "runs")
    assert ex.gpus == ["0", "1"]
    spec = _spec("a", 2)
    assert ex._devices(spec) == ["0", "1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in spec.per_worker_env] == ["0", "1"]
    crowded = _spec("b", 3)  # more ranks than GPUs: left to cuda:LOCAL_RANK, said in the log
    assert ex._devices(crowded) == []
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in crowded.per_worker_env)


def test_a_live_groups_gpus_are_not_given_again(two_h200: None, tmp_path: Path) -> None:
    import subprocess

    from apportion.runtime.executors.local.executor import _Run
    from apportion.runtime.executors.procs import Proc

    from apportion.decision import Allocation
    from apportion.jobs import JobSpec
    from apportion.plans import ExecutionPlan

    ex = LocalExecutor(tmp_path / "runs")
    holder = subprocess.Popen(["sleep", "30"])
    try:
        job = JobSpec("a", "gpt-tiny", 8, 10, 1)
        alloc = Allocation("a", "H200", 1, 1, ExecutionPlan(), {"local-0": 1}, 1.0)
        ex.runs["a"] = _Run(job, alloc, [Proc(holder)], tmp_path, 0.0, 0.0, devices=["0"])
        assert ex._devices(_spec("b", 1)) == ["1"]
        assert ex._devices(_spec("c", 2)) == []  # one free: not enough for two ranks
        holder.kill()
        holder.wait()
        assert ex._devices(_spec("d", 2)) == ["0", "1"]  # a dead group holds nothing
    finally:
        holder.kill()
