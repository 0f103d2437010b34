"""Measured stage profiles drive Crius's cell estimator, through the doors a user takes:
`profile` writes them (with the device, library versions and the time), `estimate` and
`solve-round` use them and say so, and a stale or foreign-device profile is refused by name.

A machine without GPUs profiles for T4, the type its worker slots are scheduled as
(`local_cluster`); the cluster below is made of T4s so that its cells are this machine's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from apportion.estimation.models.crius import CellEstimator
from apportion.estimation.stage_profiles import (
    CPU_STAND_IN,
    PROFILE_FORMAT,
    MeasuredStage,
    StageProfiles,
    StageRecord,
    device_gpu_type,
    installed_version,
    versions_of,
)
from typer.testing import CliRunner

from apportion.cli import app
from apportion.models import get_model

runner = CliRunner()

CLUSTER = """name: t4-box
node_groups:
  - {prefix: t4, count: 2, gpu_type: T4, gpus_per_node: 4, cpus_per_node: 16, host_memory_gib: 64,
     intra_node_link: pcie, intra_node_bandwidth_GBps: 10, inter_node_bandwidth_GBps: 1}
"""
JOBS = """now_s: 0
jobs:
  - {id: tiny, model: gpt-tiny, global_batch_size: 16, iterations: 1000, requested_gpus: 2, submit_time_s: 0}
  - {id: other, model: bert-tiny, global_batch_size: 16, iterations: 1000, requested_gpus: 2, submit_time_s: 0}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("APPORTION_CACHE", str(root))
    monkeypatch.delenv("APPORTION_PROFILE_MAX_AGE_DAYS", raising=False)
    return root


def _cluster(tmp_path: Path) -> Path:
    p = tmp_path / "t4.yaml"
    p.write_text(CLUSTER)
    return p


def _estimate(tmp_path: Path, cell: str = "T4:2:1", job: str = "gpt-tiny:16") -> tuple[dict, str]:
    out = tmp_path / "e.json"
    out.unlink(missing_ok=True)
    r = runner.invoke(app, ["estimate", "--job", job, "--cell", cell, "--cluster",
                            str(_cluster(tmp_path)), "--estimator", "crius", "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.stderr


def _plant(root: Path, **change: object) -> StageRecord:
    """A record as `profile --cell T4:2:1 --batch 16` writes it for gpt-tiny's DP shard,
    with ``change`` applied."""
    fields: dict[str, object] = {
        "model": "gpt-tiny", "gpu_type": "T4", "start": 0,
        "end": len(get_model("gpt-tiny").layers), "mode": "dp", "devices": 2,
        "micro_batch": 4.0, "measured": MeasuredStage(0.25, 2e7, 1e7), "backend": "torch",
        "device": "cpu", "versions": versions_of(["torch"]), "measured_at": time.time(),
        "format": PROFILE_FORMAT}
    fields.update(change)
    rec = StageRecord(**fields)  # type: ignore[arg-type]
    StageProfiles(root).put(rec)
    return rec


def test_profile_then_estimate_and_solve_round_use_the_measured_profile(
        tmp_path: Path, cache: Path) -> None:
    before, _ = _estimate(tmp_path)
    assert before["estimates"]["crius"]["source"]["kind"] == "analytic"
    assert "no measured stage profile" in before["estimates"]["crius"]["source"]["detail"]

    out = tmp_path / "p.json"
    r = runner.invoke(app, ["profile", "gpt-tiny", "--backend", "torch", "--cell", "T4:2:1",
                            "--batch", "16", "--repeats", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    prof = json.loads(out.read_text())
    assert prof["device"] == "cpu" and prof["gpu_type"] == CPU_STAND_IN
    assert prof["versions"]["torch"] == installed_version("torch")
    recs = prof["stage_records"]
    assert {(x["mode"], x["devices"], x["micro_batch"]) for x in recs} == \
        {("dp", 2, 4.0), ("tp", 2, 4.0)}
    assert all(Path(x["path"]).exists() and x["measured_at"] > 0 for x in recs)

    after, err = _estimate(tmp_path)
    crius = after["estimates"]["crius"]
    assert crius["source"]["kind"] == "profiled" and crius["source"]["device"] == "cpu"
    assert crius["source"]["age_s"] >= 0 and "cpu: profiled" not in err
    assert crius["iter_time_s"] != before["estimates"]["crius"]["iter_time_s"]
    assert after["tuned"]["source"]["kind"] == "profiled"
    assert "crius: profiled" in err
    # another cell of the profiled model is on the measured scale too (derived shards)
    other, _ = _estimate(tmp_path, cell="T4:4:2")
    assert other["estimates"]["crius"]["source"]["kind"] == "profiled"
    assert "derived from the analytic profiles" in other["estimates"]["crius"]["source"]["detail"]

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    dec_path = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--cluster", str(_cluster(tmp_path)), "--jobs",
                            str(jobs), "--estimator", "crius", "--json", str(dec_path),
                            "--time-budget", "10", "--deterministic"])
    assert r.exit_code == 0, r.output
    dec = json.loads(dec_path.read_text())
    placed = {a["job"]: a for a in dec["allocations"]}
    assert set(placed) == {"tiny", "other"}
    assert all(a["source"]["kind"] in ("measured", "fitted", "profiled", "analytic")
               and a["source"]["detail"] for a in placed.values())
    assert placed["tiny"]["source"]["kind"] == "profiled"
    assert placed["other"]["source"]["kind"] == "analytic"


@pytest.mark.parametrize("change, why", [
    ({"device": "NVIDIA A100-SXM4-80GB"},
     "foreign device: measured on NVIDIA A100-SXM4-80GB (A100-80GB), not T4"),
    ({"device": "some accelerator"}, "foreign device"),
    ({"versions": {"apportion": "0.0.1", "torch": installed_version("torch")}},
     "stale: measured with apportion 0.0.1"),
    ({"versions": {"apportion": installed_version("apportion"), "torch": "1.0.0"}},
     "stale: measured with torch 1.0.0"),
    ({"format": PROFILE_FORMAT - 1}, "stale: record format"),
    ({"measured_at": time.time() - 400 * 86400}, "stale: measured 400"),
    ({"measured_at": time.time() + 10 * 86400}, "in the future"),
])
def test_a_planted_stale_or_foreign_profile_is_refused_by_name(
        tmp_path: Path, cache: Path, change: dict, why: str) -> None:
    good, _ = _estimate(tmp_path)
    rec = _plant(cache, **change)
    got, err = _estimate(tmp_path)
    crius = got["estimates"]["crius"]
    assert crius["source"]["kind"] == "analytic"  # never used
    assert crius["iter_time_s"] == good["estimates"]["crius"]["iter_time_s"]
    path = StageProfiles(cache).refusals()[0].split("(")[1].split(")")[0]
    refused = [x for x in got["refused"] if why in x]
    assert refused and path in refused[0] and rec.model in refused[0]
    flat = " ".join(err.split())  # the console wraps long lines
    assert "refused: " in flat and why in flat
    assert path.replace(" ", "") in flat.replace(" ", "")
    assert crius["source"]["refused"] == got["refused"]


def test_the_same_record_unchanged_is_used(tmp_path: Path, cache: Path) -> None:
    _plant(cache)
    _plant(cache, mode="tp")
    got, _ = _estimate(tmp_path)
    assert got["estimates"]["crius"]["source"]["kind"] == "profiled"
    assert got["refused"] == []


def test_a_malformed_record_is_refused_by_its_path(tmp_path: Path, cache: Path) -> None:
    rec = _plant(cache)
    p = StageProfiles(cache).put(rec)
    data = json.loads(p.read_text())
    data["value"]["compute_s"] = "fast"
    p.write_text(json.dumps(data))
    got, _ = _estimate(tmp_path)
    assert got["estimates"]["crius"]["source"]["kind"] == "analytic"
    assert any(str(p) in x and "compute_s" in x for x in got["refused"])


def test_profile_refuses_a_cell_of_another_gpu_type(tmp_path: Path, cache: Path) -> None:
    r = runner.invoke(app, ["profile", "gpt-tiny", "--cell", "A40:2:1", "--batch", "16"])
    assert r.exit_code == 2
    assert "--cell" in r.stderr and "cpu" in r.stderr and "A40" in r.stderr
    assert not (cache / "stage-profile").exists()


def test_dp_shards_match_on_samples_per_device_and_scale_linearly(tmp_path: Path) -> None:
    store = StageProfiles(tmp_path)
    _plant(tmp_path, devices=2, micro_batch=4.0)  # 2 samples per device
    L = len(get_model("gpt-tiny").layers)
    same = store.lookup("gpt-tiny", "T4", (0, L), "dp", 4, 8.0)  # 2 per device on 4
    assert same is not None and same.scale == 1.0 and same.stage.compute_s == 0.25
    half = store.lookup("gpt-tiny", "T4", (0, L), "dp", 2, 2.0)
    assert half is not None and half.scale == pytest.approx(0.5)
    assert half.stage.compute_s == pytest.approx(0.125) and half.stage.static_bytes == 2e7
    assert store.lookup("gpt-tiny", "T4", (0, L), "tp", 2, 4.0) is None
    assert store.lookup("gpt-tiny", "A40", (0, L), "dp", 2, 4.0) is None


def test_device_names_map_to_the_catalog_and_the_local_stand_in() -> None:
    from apportion.runtime.executors.local.gpus import catalog_type

    assert device_gpu_type("cpu") == CPU_STAND_IN
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200"):
        assert device_gpu_type(name) == catalog_type(name)
    assert device_gpu_type("NVIDIA GeForce RTX 9090") is None


def test_the_stand_in_is_the_local_clusters_type_without_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from apportion.runtime.executors.local.executor import local_cluster

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert {g.gpu_type for g in local_cluster().groups} == {CPU_STAND_IN}


def test_a_refit_or_a_new_profile_is_not_hidden_by_the_memo(tmp_path: Path) -> None:
    """The estimator memoises cells; a profile written since is read (the store's stamp)."""
    from apportion.config import resolve_cluster
    from apportion.jobs import JobSpec
    from apportion.plans import Cell

    cl = resolve_cluster(_cluster(tmp_path))
    est = CellEstimator(stage_profiles=StageProfiles(tmp_path))
    job = JobSpec(id="j", model="gpt-tiny", global_batch_size=16, iterations=1,
                  requested_gpus=2)
    first = est.best_in_cell(job, Cell("j", "T4", 2, 1), cl)
    assert first is not None and first.source is not None and first.source.kind == "analytic"
    _plant(tmp_path)
    second = est.best_in_cell(job, Cell("j", "T4", 2, 1), cl)
    assert second is not None and second.source is not None
    assert second.source.kind == "profiled"


def test_jax_profiles_plug_in_through_the_same_protocol(tmp_path: Path, cache: Path) -> None:
    """`profile --backend jax` compiles each stage shard for its mesh (a child process with
    host devices) and stores it as torch's are: the estimate reads it the same way."""
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["profile", "gpt-tiny", "--backend", "jax", "--cell", "T4:2:1",
                            "--batch", "16", "--repeats", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    prof = json.loads(out.read_text())
    assert {x["backend"] for x in prof["stage_records"]} == {"jax"}
    assert prof["versions"]["jax"] == installed_version("jax")
    got, _ = _estimate(tmp_path)
    assert got["estimates"]["crius"]["source"]["kind"] == "profiled"
    assert got["estimates"]["crius"]["source"]["backend"] == "jax"


def test_status_and_the_api_say_where_a_running_jobs_estimate_came_from(
        tmp_path: Path, cache: Path) -> None:
    from apportion.serve.views import job_view, jobs_view
    from apportion.store import open_store

    _plant(cache)
    _plant(cache, mode="tp")
    jobs, db = tmp_path / "jobs.yaml", tmp_path / "state.db"
    jobs.write_text(JOBS)
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    r = runner.invoke(app, ["solve-round", "--state", str(db), "--cluster",
                            str(_cluster(tmp_path)), "--estimator", "crius", "--time-budget",
                            "10"])
    assert r.exit_code == 0, r.output
    st = json.loads(runner.invoke(app, ["status", "--state", str(db), "--json"]).stdout)
    running = {j["id"]: j for j in st["jobs"] if j["state"] == "running"}
    assert set(running) == {"tiny", "other"}
    assert running["tiny"]["estimate_source"]["kind"] == "profiled"
    assert running["other"]["estimate_source"]["kind"] == "analytic"
    assert all(j["estimator"] == "crius" for j in running.values())
    with open_store(db) as s:
        api = {j["id"]: j for j in jobs_view(s)["jobs"]}
        assert api["tiny"]["estimate_source"] == running["tiny"]["estimate_source"]
        assert job_view(s, "tiny")["estimate_source"]["kind"] == "profiled"


def _policies() -> list[str]:
    from apportion.policies import POLICIES

    return sorted(POLICIES)


@pytest.mark.parametrize("policy", _policies())
def test_every_policys_placed_cells_name_their_source(
        tmp_path: Path, cache: Path, policy: str) -> None:
    """Discovered over the registry: whichever policy decides, each placed cell of the
    decision says where its figures came from."""
    _plant(cache)
    _plant(cache, mode="tp")
    jobs, out = tmp_path / "jobs.yaml", tmp_path / "d.json"
    jobs.write_text(JOBS)
    r = runner.invoke(app, ["solve-round", "--cluster", str(_cluster(tmp_path)), "--jobs",
                            str(jobs), "--estimator", "crius", "--policy", policy,
                            "--time-budget", "5", "--json", str(out)])
    assert r.exit_code == 0, r.output
    dec = json.loads(out.read_text())
    assert dec["allocations"], policy
    for a in dec["allocations"]:
        assert a["source"] and a["source"]["kind"] in ("measured", "fitted", "profiled",
                                                       "analytic"), (policy, a)
    tiny = [a for a in dec["allocations"] if a["job"] == "tiny"]
    assert all(a["source"]["kind"] == "profiled" for a in tiny), policy


def test_profile_without_a_cell_and_estimate_profile_on_the_spot(
        tmp_path: Path, cache: Path) -> None:
    """`profile MODEL --devices N --batch B` stores the whole model as one stage of N devices
    at micro-batch B (the cell T4:N:1 of a job of batch 4B); `estimate --profile` measures a
    cell's shards here first, and refuses a cell of another GPU type."""
    r = runner.invoke(app, ["profile", "gpt-tiny", "--backend", "torch", "--batch", "4",
                            "--devices", "2", "--repeats", "1", "--json", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "p").read_text())
    assert prof["dp"] and prof["tp"]  # the per-layer report, as before
    assert {(x["mode"], x["devices"], x["micro_batch"]) for x in prof["stage_records"]} == \
        {("dp", 2, 4.0), ("tp", 2, 4.0)}
    got, _ = _estimate(tmp_path)
    assert got["estimates"]["crius"]["source"]["kind"] == "profiled"
    assert "scaled" not in got["estimates"]["crius"]["source"]["detail"]

    out = tmp_path / "e.json"
    r = runner.invoke(app, ["estimate", "--job", "gpt-tiny:32", "--cell", "T4:4:2", "--cluster",
                            str(_cluster(tmp_path)), "--estimator", "crius", "--profile",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    src = json.loads(out.read_text())["estimates"]["crius"]["source"]
    assert src["kind"] == "profiled" and "derived" not in src["detail"]
    r = runner.invoke(app, ["estimate", "--job", "gpt-tiny:32", "--cell", "A40:4:2",
                            "--profile", "--json", str(out)])
    assert r.exit_code == 2 and "A40" in r.stderr
