"""Pollux's setting replayed as given: a workload file (``--trace workload-N.csv``) on
``pollux-64`` under ``--profile pollux``, its jobs' progress the truth Pollux's own simulator
takes (measured step times x statistical efficiency from the logged gradient statistics),
and the global batch a decision where a job allows it.

What holds it: the format detected by its columns and refused by line and column where a
row cannot be replayed; the truth's step times equal to Pollux's simulator's at 285 points
and its rate moving epoch by epoch as the logs say; a lone job finishing exactly when its
epochs add up; Tiresias as Pollux's artifact runs it giving Pollux's own per-job times on
the first 40 jobs of workload 6; the chosen batch inside the job's range and the fastest of
its options (hypothesis); a job that fixes its batch getting the estimator's answer as it is.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from apportion.estimation.goodput import read_application
from apportion.estimation.goodput.throughput import PlacementTable
from apportion.estimation.rate_estimator import RateEstimator
from apportion.experiments.pollux_truth import PolluxTruth
from apportion.experiments.traces import SimJob, detect_format, load_any
from apportion.formulations.batch_options import batch_options, best_in_cell
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.config import resolve_cluster
from apportion.env import data_root
from apportion.jobs import JobSpec
from apportion.plans import Cell

POLLUX = data_root() / "pollux"
pytestmark = pytest.mark.skipif(not (POLLUX / "workloads").exists(),
                                reason="Pollux's data not present")
HERE = Path(__file__).parent / "goodput_data"
runner = CliRunner()


@pytest.fixture(scope="module")
def head40(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Workload 6's first 40 jobs (what tests/goodput_data's Tiresias reference replayed)."""
    lines = (POLLUX / "workloads" / "workload-6.csv").read_text().splitlines()[:41]
    path = tmp_path_factory.mktemp("pollux") / "workload-6-head40.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def truth() -> PolluxTruth:
    return PolluxTruth()


def test_a_workload_file_is_detected_by_its_columns_and_loaded(head40: Path) -> None:
    assert detect_format(POLLUX / "workloads-2.0" / "workload-3.csv") == "pollux"
    t = load_any(head40)
    assert t.format == "pollux" and len(t) == 40
    j = next(j for j in t.jobs if j.job_type == "cifar10")
    app_ = read_application("cifar10")
    assert (j.gpus, j.batch, j.batch_range) == (6, 2048, (app_.init_batch, app_.max_batch))
    # work: samples of M0 to the end of its 100th epoch, where the slowest log gets there
    assert j.iterations == pytest.approx(
        min(float(g.progress[99]) for g in app_.gradients) * app_.init_batch)
    assert all(j.batch_range is None for j in t.jobs if j.job_type == "ncf")  # Pollux's rule


@pytest.mark.parametrize("column,value,words", [
    ("application", "resnet", "application 'resnet' is not one Pollux measured"),
    ("batch_size", "99999", "outside cifar10's validated batches"),
])
def test_a_row_it_cannot_replay_is_refused_by_line_and_column(tmp_path: Path, column: str,
                                                              value: str, words: str) -> None:
    row = {"name": "a", "time": "0", "application": "cifar10", "num_replicas": "2",
           "batch_size": "512"}
    row[column] = value
    f = tmp_path / "workload-bad.csv"
    f.write_text("name,time,application,num_replicas,batch_size\n" + ",".join(row.values())
                 + "\n")
    r = runner.invoke(app, ["simulate", "--trace", str(f), "--cluster", "pollux-64",
                            "--profile", "pollux", "--policy", "fcfs"])
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    assert str(f.name) in flat and "line 2" in flat and column in flat and words in flat


def test_the_step_times_are_pollux_simulators_own(truth: PolluxTruth) -> None:
    """At the 285 points tests/goodput_data/README.md describes, exactly."""
    rows = list(csv.DictReader((HERE / "pollux_points.csv").open()))
    for r in rows:
        table: PlacementTable = truth.app(r["app"]).table
        st_, sy = table.step(tuple(int(c) for c in r["placement"]), int(r["local_bsz"]))
        assert st_ == pytest.approx(float(r["step_time"]), rel=1e-9)
        assert sy == pytest.approx(float(r["sync_time"]), rel=1e-9)


def test_the_rate_moves_epoch_by_epoch_as_the_logged_statistics_say(truth: PolluxTruth
                                                                    ) -> None:
    """cifar10 at its validated batch 2048 on 8 GPUs: the rate at each epoch's start over the
    first epoch's is the ratio of efficiencies read straight from validation-2048.csv."""
    logs = {int(p.stem.split("-")[1]): list(csv.DictReader(p.open()))
            for p in (POLLUX / "traces" / "cifar10").glob("validation-*.csv")}
    m0 = min(logs)
    job = SimJob("c", 0.0, 8, 1e9, "cifar10", model="cifar10", batch=2048)

    def eff(e: int) -> float:
        sqr, var = float(logs[2048][e]["grad_sqr"]), float(logs[2048][e]["grad_var"])
        return (var + sqr) / (var + sqr * 2048 / m0)

    base = truth.rate(job, "T4", 8, progress=0.0)
    assert base > 0
    for e in (1, 10, 50, 99):
        start = min(float(rows[e - 1]["progress"]) for rows in logs.values()) * m0
        got = truth.rate(job, "T4", 8, progress=start)
        assert got / base == pytest.approx(eff(e) / eff(0), rel=1e-9)
        assert truth.rate(job, "T4", 8, progress=start * (1 - 1e-6)) / base == pytest.approx(
            eff(e - 1) / eff(0), rel=1e-9)  # just before: the epoch before's
    assert truth.rate(job, "A100", 8) == 0.0  # Pollux measured T4s only


def test_a_lone_job_finishes_when_its_epochs_add_up(tmp_path: Path, truth: PolluxTruth
                                                    ) -> None:
    """One bert job (2 epochs, 4 GPUs on a node): it arrives at 10 s, is placed at the next
    round (60 s), pays the 30-s start, then runs each epoch at that epoch's rate."""
    f = tmp_path / "workload-one.csv"
    f.write_text("name,time,application,num_replicas,batch_size\nb,10,bert,4,384\n")
    out = tmp_path / "jobs.csv"
    r = runner.invoke(app, ["simulate", "--trace", str(f), "--cluster", "pollux-64",
                            "--profile", "pollux", "--policy", "fcfs", "--jobs-csv", str(out)])
    assert r.exit_code == 0, r.output
    job = load_any(f).jobs[0]
    ends = [0.0, truth.next_change(job, 0.0), job.iterations]
    run = sum((b - a) / truth.rate(job, "T4", 4, {"n": 4}, progress=a)
              for a, b in zip(ends, ends[1:]))
    assert ends[1] < job.iterations  # two epochs: the rate changed once
    row = next(csv.DictReader(out.open()))
    assert float(row["jct_s"]) == pytest.approx(60.0 + 30.0 + run - 10.0, rel=1e-9)


def test_tiresias_as_pollux_runs_it_gives_pollux_simulators_job_times(head40: Path,
                                                                       tmp_path: Path) -> None:
    """Workload 6's first 40 jobs under tiresias-pollux against Pollux's simulator's own
    Tiresias on the same rows (tests/goodput_data/pollux_tiresias_w6_head40.csv): the
    average within 2 %, half the jobs within 1 % (placement order and rounding move a few)."""
    out = tmp_path / "jobs.csv"
    r = runner.invoke(app, ["simulate", "--trace", str(head40), "--cluster", "pollux-64",
                            "--profile", "pollux", "--policy", "tiresias-pollux",
                            "--jobs-csv", str(out), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    theirs = {row["name"]: float(row["jct_s"]) for row in
              csv.DictReader((HERE / "pollux_tiresias_w6_head40.csv").open())}
    mine = {row["job_id"]: float(row["jct_s"]) for row in csv.DictReader(out.open())}
    assert set(mine) == set(theirs)
    assert np.mean(list(mine.values())) == pytest.approx(np.mean(list(theirs.values())),
                                                         rel=0.02)
    rel = np.array([abs(mine[k] / theirs[k] - 1) for k in theirs])
    assert np.median(rel) < 0.01, sorted(rel)[-5:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert (s["profile"], s["interval_s"], s["restart_cost_s"]) == ("pollux", 60.0, 30.0)


APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(app_=st.sampled_from(APPS), gpus=st.integers(1, 32), lo_frac=st.floats(0, 0.5),
       hi_frac=st.floats(0.5, 1), epoch=st.integers(0, 1))
def test_the_chosen_batch_is_within_the_range_and_the_fastest_option(
        truth: PolluxTruth, app_: str, gpus: int, lo_frac: float, hi_frac: float,
        epoch: int) -> None:
    a = truth.app(app_)
    lo = int(a.init_batch * (a.max_batch / a.init_batch) ** lo_frac)
    hi = max(lo, int(a.init_batch * (a.max_batch / a.init_batch) ** hi_frac))
    own = lo
    progress = 0.0 if epoch == 0 else float(a.noise.epoch_ends[0])
    sim = SimJob("j", 0.0, gpus, a.work, app_, model=app_, batch=own, batch_range=(lo, hi))
    spec = JobSpec("j", app_, own, int(a.work), gpus, batch_range=(lo, hi))

    def at(job: JobSpec, t: str, g: int, b: int) -> float:
        return truth.rate(sim, t, g, progress=progress, batch=b)

    est = RateEstimator(lambda job, t, g: truth.rate(sim, t, g, progress=progress),
                        batch_rate_fn=at)
    cluster = resolve_cluster("pollux-64")
    e = best_in_cell(est, spec, Cell("j", "T4", gpus, 1), cluster)
    rates = {b: at(spec, "T4", gpus, b) for b in batch_options(spec, gpus)}
    if max(rates.values(), default=0.0) <= 0:
        assert e is None
        return
    assert e is not None and e.batch is not None
    assert lo <= e.batch <= hi
    assert e.global_batch_size == own  # progress stays counted in the job's own units
    assert 1.0 / e.iter_time_s == pytest.approx(max(rates.values()), rel=1e-12)
    assert 1.0 / e.iter_time_s >= rates.get(own, 0.0) * (1 - 1e-12)
    assert all(b % gpus == 0 or b == own for b in rates)  # an equal share a GPU


def test_a_job_that_fixes_its_batch_gets_the_estimators_answer(truth: PolluxTruth) -> None:
    sim = SimJob("n", 0.0, 1, 1e6, "ncf", model="ncf", batch=32768)
    spec = JobSpec("n", "ncf", 32768, 10**6, 1)
    est = RateEstimator(lambda job, t, g: truth.rate(sim, t, g))
    cluster = resolve_cluster("pollux-64")
    cell = Cell("n", "T4", 1, 1)
    assert best_in_cell(est, spec, cell, cluster) == est.best_in_cell(spec, cell, cluster)
    assert best_in_cell(est, spec, cell, cluster).batch is None


def test_apportion_chooses_batches_and_beats_tiresias_on_the_first_jobs(head40: Path,
                                                                         tmp_path: Path) -> None:
    """apportion on the first 12 jobs, as a user runs it: every job finishes, the decisions
    carry the batches chosen (within each job's range), and its average JCT is below
    Tiresias's (as Pollux runs it) on the same jobs."""
    from apportion.experiments.harness import prepare_one

    head20 = tmp_path / "workload-6-head12.csv"
    head20.write_text("\n".join(head40.read_text().splitlines()[:13]) + "\n")
    avg = {}
    for policy in ("apportion", "tiresias-pollux"):
        r = runner.invoke(app, ["simulate", "--trace", str(head20), "--cluster", "pollux-64",
                                "--profile", "pollux", "--policy", policy, "--deterministic",
                                "--information", "oracle", "--json", str(tmp_path / "s.json")])
        assert r.exit_code == 0, r.output
        s = json.loads((tmp_path / "s.json").read_text())
        assert s["finished"] == s["jobs"] == 12
        avg[policy] = s["avg_jct_s"]
    assert avg["apportion"] < avg["tiresias-pollux"], avg
    # the decisions themselves: one round of the replay, read at the apply hook
    rp = prepare_one(str(head20), "pollux-64", "apportion", "pollux",
                     sim_options={"information": "oracle", "deterministic": True,
                                  "jct_bound": False, "max_sim_s": 600.0})
    from apportion.experiments.simulator import Simulator

    sim = Simulator(rp.cluster, rp.trace, rp.policy, rp.truth, rp.config)
    seen: list[tuple[str, int | None]] = []
    apply = sim.scheduler.apply

    def spy(decision: object) -> None:
        apply(decision)  # type: ignore[arg-type]
        seen.extend((a.job, a.global_batch_size) for a in decision.allocations)  # type: ignore

    sim.scheduler.apply = spy
    sim.run()
    ranges = {j.job_id: j.batch_range for j in rp.trace.jobs}
    chosen = [(j, b) for j, b in seen if b is not None]
    assert chosen and all(ranges[j] is not None and ranges[j][0] <= b <= ranges[j][1]
                          for j, b in chosen)
    assert all(ranges[j] is not None for j, b in chosen)
    assert all(b is None for j, b in seen if ranges[j] is None)  # ncf keeps its batch
