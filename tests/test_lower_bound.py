"""The lower bound on the average JCT holds against every policy's replay (a bound that a
real schedule beat would be wrong), on every trace family, compared with each average as
that average counts its jobs; the LP is at least the isolated bound; the options it gives a
job dominate every count a policy could give; and every replay reports the bound and its
distance to it, through ``simulate`` and ``compare``.

The family test discovers the registered policies (plug-ins included) and replays each on
a short stretch of every trace family, in the family's own round rules: Gavel's trace,
ElasticFlow's (whose admission drops jobs), Crius's, Morphling's, a raw Philly day, the
fine-tuning trace (where YMIR's transfer from finished siblings cuts a job's work) and the
generated one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from apportion.estimation.finetune.transferability import synthetic_task
from apportion.experiments import harness as H
from apportion.experiments import traces as tr
from apportion.experiments.lower_bound import (
    first_progress,
    jct_lower_bound,
    srpt_completions,
)
from apportion.experiments.optimistic_rates import OptimisticRates, upper_envelope
from apportion.experiments.simulator import PROFILES, simulate
from apportion.experiments.trace_catalog import BUNDLED
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.errors import InputError
from apportion.policies import make_policy
from apportion.policies.registry import policy_names

runner = CliRunner()
needs_data = pytest.mark.skipif(not tr.data_root().exists(), reason="shared data not present")

ELASTICFLOW_16 = ("name: a100-16\nnode_groups:\n  - {prefix: a, count: 2, gpu_type: A100-40GB, "
                  "gpus_per_node: 8}\n")
#: family -> (trace, cluster, profile, jobs, round s or None for the profile's): a stretch
#: each, on a cluster it keeps busy; Philly's jobs run for days, so its rounds are 4 hours
FAMILIES: dict[str, tuple[str, str, str, int, float | None]] = {
    "gavel": ("gavel-max-min-fairness", "4:4:4", "gavel", 16, None),
    "elasticflow": ("elasticflow-philly", ELASTICFLOW_16, "default", 10, None),
    "crius": ("crius-pai", "crius-testbed", "default", 10, None),
    "morphling": ("morphling-base", "morphling-64", "default", 16, None),
    "raw": ("philly", "crius-testbed", "default", 8, 14400.0),
    "finetune": ("fm-1-roberta-base", "32:0:0", "ymir", 60, None),
    "synthetic": ("synthetic:10", "crius-testbed", "default", 10, None),
}
CASES = [(f, p) for f in FAMILIES for p in policy_names()]


@pytest.fixture(scope="module")
def stretches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, ...]]:
    """family -> (cluster, trace, truth, config), resolved once."""
    root = tmp_path_factory.mktemp("bound")
    out = {}
    for fam, (trace, cluster, profile, jobs, round_s) in FAMILIES.items():
        if "\n" in cluster:
            (root / f"{fam}.yaml").write_text(cluster)
            cluster = str(root / f"{fam}.yaml")
        if fam == "raw":  # Philly's 82,000 jobs: its first rows, a day's window
            src = tr.data_root() / BUNDLED[trace]
            trace = str(root / "philly-head.csv")
            Path(trace).write_text("\n".join(src.read_text().splitlines()[:300]) + "\n")
        cl = H.cluster_from_arg(cluster)
        t, truth = H.resolve(trace, cl, seed=0, window_days=1.0 if fam == "raw" else None)
        t = replace(t, jobs=t.jobs[:jobs])
        cfg = replace(PROFILES[profile], deterministic=True, information="oracle")
        if round_s is not None:
            cfg = replace(cfg, interval_s=round_s)
        out[fam] = (cl, t, truth, cfg)
    return out


@pytest.fixture(scope="module")
def task_data(tmp_path_factory: pytest.TempPathFactory,
              stretches: dict[str, tuple[Any, ...]]) -> Path:
    """Samples of every fine-tuning task of the stretches (Task2Vec's input, not shipped):
    small Gaussian tasks drawn from one distribution, so the ``-task2vec`` policies predict
    gains and transfer and merge too (their cuts are then tested against the bound)."""
    folder = tmp_path_factory.mktemp("task-data")
    base = np.random.default_rng(0).normal(size=(4, 8)) * 2
    names = sorted({(j.finetune.backbone, j.finetune.task) for _, t, _, _ in stretches.values()
                    for j in t.jobs if getattr(j, "finetune", None) is not None})
    for i, (backbone, task) in enumerate(names):
        d = synthetic_task(task, 8, 4, 400, 10 + i, base=base, shift=0.05)
        np.savez(folder / f"{backbone}@{task}.npz", x=d.x, y=d.y)
    return folder


@needs_data
@pytest.mark.parametrize("family,policy", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_no_policy_beats_the_bound(family: str, policy: str,
                                   stretches: dict[str, tuple[Any, ...]], task_data: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cl, t, truth, cfg = stretches[family]
    monkeypatch.setenv("APPORTION_TASK_DATA", str(task_data))
    try:
        pol = make_policy(policy)
        r = simulate(cl, t, pol, truth, cfg)
    except InputError as exc:  # no policy refuses these stretches (task samples given)
        pytest.fail(f"{policy} refused the {family} stretch: {exc}")
    s = r.summary
    # every job counted as the all-jobs average counts it (until its finish, or the end)
    assert s["avg_jct_all_s"] >= s["avg_jct_all_lower_bound_s"] * (1 - 1e-9), s["jct_bound"]
    assert s["avg_jct_to_bound"] >= 1.0 - 1e-4
    if s["finished"] == s["jobs"]:
        assert s["avg_jct_s"] >= s["avg_jct_lower_bound_s"] * (1 - 1e-9), s["jct_bound"]
        assert s["avg_jct_all_lower_bound_s"] == s["avg_jct_lower_bound_s"]
        assert s["avg_jct_finished_to_bound"] >= 1.0 - 1e-4
    else:  # the finished jobs are not all of them: no ratio for their average
        assert s["avg_jct_finished_to_bound"] is None
        assert s["jct_bound_all"]["horizon_s"] is not None
    # and each job alone: no job finished before its own isolated bound
    iso = {j.job_id: j for j in t.jobs}
    jobs = r.jobs[r.jobs["finished"]]
    b = OptimisticRates(truth, cl.capacity_by_type()).options([iso[x] for x in jobs["job_id"]])
    ready = first_progress(jobs["submit_s"].to_numpy(float), cfg.start_cost_s, cfg.interval_s)
    for jct, o, w, s0, a in zip(jobs["jct_s"], b, jobs["iterations"], ready, jobs["submit_s"]):
        assert jct >= s0 - a + w / o.best_rate - 1e-6 * max(1.0, jct)


@needs_data
def test_transfer_is_credited_on_the_finetuning_trace(
        stretches: dict[str, tuple[Any, ...]]) -> None:
    """YMIR on FM-1 beat the bound that gave every job its full work (issue 60): the bound
    now credits each job the largest cut a sibling's weights could give it."""
    cl, t, truth, cfg = stretches["finetune"]
    b = jct_lower_bound(t.jobs, truth, cl, cfg.start_cost_s, cfg.interval_s)
    assert b.credited.get("transfer", 0) > 0
    ymir = simulate(cl, t, make_policy("ymir"), truth, replace(cfg, jct_bound=False)).summary
    assert ymir["transferred_jobs"] > 0 and ymir["avg_jct_all_s"] >= b.avg_jct_s

    class FullWork:  # the same truth without its run modes: every job its full work
        name = "finetune-full-work"

        def rate(self, job: Any, gpu_type: str, gpus: int) -> float:
            return float(truth.rate(job, gpu_type, gpus))

    full = jct_lower_bound(t.jobs, FullWork(), cl, cfg.start_cost_s, cfg.interval_s)
    assert full.avg_jct_s > ymir["avg_jct_all_s"] > b.avg_jct_s


@needs_data
@pytest.mark.parametrize("policy", ["apportion", "apportion-task2vec"])
def test_apportions_own_transfers_and_merges_stay_above_the_bound(
        policy: str, stretches: dict[str, tuple[Any, ...]], task_data: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """apportion's round offers transfer options and merged cells on fine-tuning traces
    (formulations/siblings.py): on FM-1's stretch it takes them, and its average stays at
    or above the bound, which credits every job the largest cut any sibling could give."""
    monkeypatch.setenv("APPORTION_TASK_DATA", str(task_data))
    cl, t, truth, cfg = stretches["finetune"]
    s = simulate(cl, t, make_policy(policy), truth, cfg).summary
    assert s["transferred_jobs"] + s["merged_jobs"] > 0, s
    assert s["finished"] == s["jobs"]
    assert s["avg_jct_s"] >= s["avg_jct_lower_bound_s"] * (1 - 1e-9), s["jct_bound"]
    assert s["jct_bound"]["credited"].get("transfer", 0) > 0, s["jct_bound"]


def test_a_dropped_job_counts_as_the_average_counts_it(tmp_path: Path) -> None:
    """ElasticFlow drops a job whose deadline no share meets; the all-jobs average counts it
    until the replay's end, so the bound does too (issue 60: the bound counted its whole
    isolated time, and ElasticFlow's all-jobs average fell below it)."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time_s,num_gpus,duration_s,tenant,model,batch_size,"
                     "iterations,deadline_s\n"
                     "a,0,1,3600,t,resnet50,64,20000,40000\n"
                     "b,300,1,3600,t,resnet50,64,20000,40000\n"
                     "big,900,8,360000,t,bert,64,50000000,1000\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: a100\nnode_groups:\n  - {prefix: a, count: 1, "
                       "gpu_type: A100-40GB, gpus_per_node: 8}\n")
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", str(cluster),
                            "--policy", "elasticflow", "--deterministic", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["dropped"] == 1 and s["finished"] == 2
    # the bound on every job to its finish is far above: the dropped job never finished
    assert s["avg_jct_lower_bound_s"] > s["avg_jct_all_s"]
    assert s["avg_jct_all_s"] >= s["avg_jct_all_lower_bound_s"] > 0
    assert s["jct_bound_all"]["horizon_s"] > 0 and s["avg_jct_to_bound"] >= 1.0
    assert s["avg_jct_finished_to_bound"] is None


@needs_data
def test_a_replay_stopped_early_is_bounded_to_its_end() -> None:
    """A replay cut short (``max_sim_s``) leaves jobs unfinished, counted until its end."""
    cl = H.cluster_from_arg("4:4:4")
    t, truth = H.resolve("gavel-max-min-fairness", cl, seed=0)
    t = replace(t, jobs=t.jobs[:20])
    s = simulate(cl, t, make_policy("fcfs"), truth,
                 replace(PROFILES["gavel"], max_sim_s=3600.0)).summary
    assert s["finished"] < s["jobs"]
    assert s["avg_jct_lower_bound_s"] > s["avg_jct_all_s"] >= s["avg_jct_all_lower_bound_s"]


@pytest.mark.parametrize("trace,cluster", [("synthetic:30", "crius-testbed"),
                                           ("gavel-max-min-fairness", "4:4:4")])
def test_the_lp_is_at_least_the_isolated_bound(trace: str, cluster: str) -> None:
    if trace.startswith("gavel") and not tr.data_root().exists():
        pytest.skip("shared data not present")
    cl = H.cluster_from_arg(cluster)
    t, truth = H.resolve(trace, cl, seed=0)
    t = replace(t, jobs=t.jobs[:30])
    b = jct_lower_bound(t.jobs, truth, cl, round_s=300.0)
    assert b.status == "optimal" and b.lp_avg_s is not None
    assert b.avg_jct_s >= b.lp_avg_s >= b.isolated_avg_s * (1 - 1e-9) > 0
    assert b.srpt_avg_s is not None and b.avg_jct_s >= b.srpt_avg_s
    # the aggregate LP, alone where the time-indexed one is too big, is a bound too
    small = jct_lower_bound(t.jobs, truth, cl, round_s=300.0, max_columns=10)
    assert small.status == "aggregate"
    assert b.isolated_avg_s * (1 - 1e-9) <= small.avg_jct_s <= b.avg_jct_s * (1 + 1e-6)


def test_the_first_progress_waits_for_the_round_tick() -> None:

    got = first_progress(np.array([0.0, 1.0, 300.0, 300.0 + 1e-9, 301.0]), 30.0, 300.0)
    assert got.tolist() == pytest.approx([30.0, 330.0, 330.0, 330.0 + 1e-9, 630.0])
    assert first_progress(np.array([7.0]), 0.0, 0.0).tolist() == [7.0]


#: options: GPUs charged (0, or half a GPU and more: a merged pair's half) and rates
points = st.lists(st.tuples(st.one_of(st.just(0.0), st.floats(0.5, 64.0)),
                            st.one_of(st.just(0.0), st.floats(1e-3, 100.0))),
                  min_size=1, max_size=40)


@given(points, st.integers(2, 8))
def test_the_envelope_dominates_every_option(pts: list[tuple[float, float]], most: int) -> None:
    """Every (GPUs, rate) is a mix of the envelope's vertices with no more GPUs and no less
    progress (or, beyond the last vertex, no faster than it); the fastest rate and the most
    progress per GPU are kept exactly, in at most ``most`` vertices."""
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    v = upper_envelope(x, y, most)
    real = [(a, b) for a, b in pts if a > 0 and b > 0]
    if not real:
        assert v == []
        return
    assert 1 <= len(v) <= most
    xs = np.array([0.0] + [a for a, _ in v])
    ys = np.array([0.0] + [b for _, b in v])
    assert (np.diff(xs) > 0).all()
    for a, b in real:
        assert np.interp(min(a, xs[-1]), xs, ys) >= b * (1 - 1e-9) - 1e-9, (pts, v)
    assert ys[-1] == pytest.approx(max(b for _, b in real))
    assert ys[1] / xs[1] == pytest.approx(max(b / a for a, b in real))


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 50)), min_size=1, max_size=12))
def test_srpt_is_no_worse_than_first_come_first_served(jobs: list[tuple[float, float]]) -> None:

    rel = np.array([a for a, _ in jobs])
    size = np.array([p for _, p in jobs])
    done = srpt_completions(rel, size)
    assert (done >= rel + size - 1e-9).all()
    t, fcfs = 0.0, 0.0
    for i in np.argsort(rel, kind="stable"):
        t = max(t, rel[i]) + size[i]
        fcfs += t
    assert done.sum() <= fcfs + 1e-6 * max(1.0, fcfs)


def test_replays_report_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "synthetic:12", "--cluster", "crius-testbed",
                            "--policy", "srtf", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["avg_jct_lower_bound_s"] > 0 and s["avg_jct_to_bound"] >= 1.0
    assert s["jct_bound"]["status"] in ("optimal", "aggregate", "isolated-only")
    assert s["avg_jct_all_lower_bound_s"] == s["avg_jct_lower_bound_s"]
    r = runner.invoke(app, ["compare", "--trace", "synthetic:12", "--cluster", "crius-testbed",
                            "--policies", "fcfs,srtf", "--seeds", "1", "--out",
                            str(tmp_path / "cmp"), "--workers", "1"])
    assert r.exit_code == 0, r.output
    md = next((tmp_path / "cmp").glob("*/summary.md")).read_text()
    assert "avg JCT / lower bound" in md and "avg JCT lower bound (h)" in md
    assert "avg JCT / lower bound" in r.output  # what compare prints
    csv = next((tmp_path / "cmp").glob("*/summary.csv")).read_text()
    assert "avg_jct_to_bound" in csv.splitlines()[0]
    assert "avg_jct_all_lower_bound_s" in csv.splitlines()[0]


@needs_data
def test_the_bound_leaves_the_truths_interpolation_record_alone() -> None:
    """A replay reports how many configurations its rates rested on interpolation for; the
    bound, which asks the truth at every GPU count (Gavel's measured 1, 2, 4 and 8 only),
    adds none to that record."""
    cl = H.cluster_from_arg("16:0:0")
    t, truth = H.resolve("gavel-max-min-fairness", cl, seed=0)
    truth.interpolated.add(("mine",))
    before = set(truth.interpolated)
    jct_lower_bound(t.jobs[:6], truth, cl, round_s=360.0)
    assert truth.interpolated == before
