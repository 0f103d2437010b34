"""Elastic cells (issue 60 item 1): a job is offered counts up to the largest its rate still
gains at, within its limits; one that must keep its size keeps it. The generator's
properties, the candidates a real estimator gives, and a replay through ``simulate``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.formulations.candidates import CandidateOptions, build_candidates
from apportion.formulations.counts import count_limit, grow, ladder, most_gpus
from apportion.formulations.schema import cells_of
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.config import load_jobs, load_queue, resolve_cluster
from apportion.jobs import JobSpec
from apportion.plan_memory import memory_violation
from apportion.plans import ExecutionPlan

runner = CliRunner()
SCALES = (0.5, 1.0, 2.0)


@st.composite
def jobs(draw: st.DrawFn) -> JobSpec:
    n = draw(st.integers(1, 64))
    top = draw(st.none() | st.integers(n, 4 * n + 8))
    return JobSpec("j", "bert-336m", draw(st.integers(1, 4096)), 100, n, max_gpus=top,
                   elastic=draw(st.booleans()))


@given(jobs(), st.integers(0, 600))
def test_counts_stay_within_the_job_and_the_cluster(job: JobSpec, capacity: int) -> None:
    base, ups = ladder(job, SCALES, capacity)
    counts = base + ups
    assert all(1 <= g <= capacity for g in counts)
    if job.max_gpus is not None:  # the user's limit holds for every count
        assert all(g <= job.max_gpus for g in counts)
    assert all(g <= count_limit(job, capacity) for g in ups)  # scale-ups within the limit
    if job.global_batch_size >= job.requested_gpus:  # one sample per GPU at least
        assert all(g <= job.global_batch_size for g in ups)
    if job.requested_gpus <= capacity:
        assert job.requested_gpus in base  # the request always stands
    assert ups == sorted(set(ups)) and all(g > max(base, default=0) for g in ups)
    assert most_gpus(job, SCALES, capacity) == max(counts, default=0)
    if not job.elastic:  # a job that must keep its size: its request alone
        assert counts == ([job.requested_gpus] if job.requested_gpus <= capacity else [])


@given(st.lists(st.floats(0.0, 1e4), max_size=10), st.floats(0.0, 1e3),
       st.floats(0.0, 1.0))
def test_scale_up_stops_where_the_rate_stops_gaining(rates: list[float], best: float,
                                                     gain: float) -> None:
    ups = [2 ** (i + 3) for i in range(len(rates))]
    asked: list[int] = []

    def rate(g: int) -> float:
        asked.append(g)
        return rates[ups.index(g)]

    kept = grow(ups, best, rate, gain)
    assert kept == ups[:len(kept)]  # a prefix: the first count that does not gain ends it
    prev = best
    for g in kept:
        assert rates[ups.index(g)] > prev * (1 + gain)
        prev = rates[ups.index(g)]
    if len(kept) < len(ups):
        assert not rates[len(kept)] > prev * (1 + gain)
        assert asked == ups[:len(kept) + 1]  # nothing past the stop is estimated


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 8]), st.none() | st.integers(8, 24), st.booleans())
def test_candidates_respect_the_limits(n: int, top: int | None, elastic: bool) -> None:
    """A real estimator's cells: within the job's limits and the cluster, the request among
    them, an inelastic job's only at its request, and the elastic ones gaining per step."""
    cluster = Cluster("c", [NodeGroup("a", 4, "A100-40GB", 8), NodeGroup("b", 2, "A10", 4)])
    top = None if top is None else max(top, n)
    job = JobSpec("j", "bert-336m", 256, 10_000, n, max_gpus=top, elastic=elastic)
    g = build_candidates(cluster, [job], 0.0, AnalyticEstimator(), CandidateOptions())
    cells = [g.nodes[c] for c in cells_of(g, "j")]
    caps = cluster.capacity_by_type()
    assert cells
    for t, cap in caps.items():
        sizes = sorted({c["gpus"] for c in cells if c["gpu_type"] == t})
        assert all(s <= most_gpus(job, SCALES, cap) for s in sizes)
        if not elastic:
            assert set(sizes) <= {n}
        best = {s: max(c["est_throughput"] for c in cells
                       if c["gpu_type"] == t and c["gpus"] == s) for s in sizes}
        ups = [s for s in sizes if s > 2 * n]
        below = max((best[s] for s in sizes if s <= 2 * n), default=0.0)
        for s in ups:  # each scale-up at least 10 % faster than every smaller count
            assert best[s] > below * 1.1
            below = best[s]


def test_crius_greedy_counts_stay_the_scales() -> None:
    """The baseline keeps its N/2, N, 2N (what it was measured with)."""
    cluster = Cluster("c", [NodeGroup("a", 4, "A100-40GB", 8)])
    job = JobSpec("j", "bert-336m", 256, 10_000, 2)
    g = build_candidates(cluster, [job], 0.0, AnalyticEstimator(),
                         CandidateOptions(counts="scales"))
    assert {g.nodes[c]["gpus"] for c in cells_of(g, "j")} <= {1, 2, 4}
    g = build_candidates(cluster, [job], 0.0, AnalyticEstimator(), CandidateOptions())
    assert max(g.nodes[c]["gpus"] for c in cells_of(g, "j")) > 4


def _gpus_held(jobs_csv: Path) -> dict[str, float]:
    """Each job's GPUs on average over its life (GPU-seconds over its JCT)."""
    with jobs_csv.open() as f:
        return {r["job_id"]: float(r["gpu_seconds"]) / float(r["jct_s"])
                for r in csv.DictReader(f)}


def test_an_idle_cluster_grows_an_elastic_job_past_twice_its_request(tmp_path: Path) -> None:
    """Through ``simulate``: on 32 idle A100s a 2-GPU job whose rate gains runs on more than
    4 GPUs; the same job saying ``elastic: false`` keeps its 2."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: idle\nnode_groups:\n  - {prefix: a, count: 4, gpu_type: "
                       "A100-40GB, gpus_per_node: 8}\n")
    trace = tmp_path / "w.csv"
    trace.write_text("job_id,submit_time_s,num_gpus,model,batch_size,iterations,elastic\n"
                     "grow,0,2,bert-336m,256,20000,true\n"
                     "fixed,0,2,bert-336m,256,20000,false\n")
    out, per_job = tmp_path / "s.json", tmp_path / "jobs.csv"
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", str(cluster),
                            "--policy", "apportion", "--information", "oracle",
                            "--deterministic", "--json", str(out), "--jobs-csv", str(per_job)])
    assert r.exit_code == 0, r.output
    held = _gpus_held(per_job)
    assert held["grow"] > 2 * 2
    assert held["fixed"] == 2.0
    assert json.loads(out.read_text())["finished"] == 2


def test_max_gpus_below_the_request_is_refused(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {id: a, model: bert-336m, global_batch_size: 64, "
                    "iterations: 10, requested_gpus: 4, max_gpus: 2}\n")
    r = runner.invoke(app, ["solve-round", "--cluster", "default", "--jobs", str(jobs)])
    assert r.exit_code == 2
    assert "jobs[0].max_gpus" in r.output and "below" in r.output


def test_a_trace_elastic_column_is_checked(tmp_path: Path) -> None:
    trace = tmp_path / "w.csv"
    trace.write_text("job_id,submit_time_s,num_gpus,model,batch_size,iterations,elastic\n"
                     "a,0,2,bert-336m,256,20000,maybe\n")
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "default",
                            "--policy", "apportion"])
    assert r.exit_code == 2
    assert "line 2, column elastic" in r.output


def test_a_json_lines_queue_carries_elasticity(tmp_path: Path) -> None:
    """The streamed format has the jobs YAML's fields, these two included."""
    queue = tmp_path / "jobs.jsonl"
    queue.write_text(
        '{"id": "a", "model": "bert-336m", "global_batch_size": 64, "iterations": 10, '
        '"requested_gpus": 2, "max_gpus": 8, "elastic": false}\n'
        '{"id": "b", "model": "bert-336m", "global_batch_size": 64, "iterations": 10, '
        '"requested_gpus": 2}\n')
    a, b = load_queue(queue).jobs
    assert (a.max_gpus, a.elastic) == (8, False)
    assert (b.max_gpus, b.elastic) == (None, True)


def test_jobs_yaml_carries_elasticity(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {id: a, model: bert-336m, global_batch_size: 64, "
                    "iterations: 10, requested_gpus: 2, max_gpus: 8, elastic: false}\n"
                    "  - {id: b, model: bert-336m, global_batch_size: 64, iterations: 10, "
                    "requested_gpus: 2}\n")
    (a, b), _ = load_jobs(jobs)
    assert (a.max_gpus, a.elastic) == (8, False)
    assert (b.max_gpus, b.elastic) == (None, True)


def test_a_trimmed_round_is_the_same_without_estimating_the_scale_up() -> None:
    """A round whose jobs ask for more GPUs than the cluster has offers no scale-up (the
    trim): built without estimating it, its cells and their values are the same."""
    from apportion.formulations.candidates import (
        asks_beyond_capacity,
        requests_beyond,
        trim_scale_up,
    )

    from apportion.jobs import RunningState

    cluster = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8), NodeGroup("b", 2, "A10", 4)])
    jobs = [JobSpec(f"j{i}", "bert-336m", 256, 1000 * (i + 1), 1 + i % 4) for i in range(12)]
    jobs.append(JobSpec("run", "bert-336m", 256, 10**5, 2, iterations_done=5,
                        running=RunningState("A100-40GB", 8, 1, {"a-0": 8})))
    assert requests_beyond(cluster, jobs)
    graphs = []
    for scale_up in (True, False):
        g = build_candidates(cluster, jobs, 0.0, AnalyticEstimator(), scale_up=scale_up)
        assert asks_beyond_capacity(g)
        trim_scale_up(g)
        graphs.append({c: (d["gpus"], round(d["value"], 12)) for c, d in g.nodes(data=True)
                       if d.get("kind") == "cell"})
    assert graphs[0] == graphs[1]
    assert graphs[1][next(c for c in graphs[1] if c.startswith("cell:run:"))]  # kept running


MEMORY_CLUSTER = """\
name: small-memory
node_groups:
  - {prefix: small, count: 2, gpu_type: A100-40GB, gpus_per_node: 4, gpu_memory_gib: 4}
  - {prefix: mid, count: 2, gpu_type: A40, gpus_per_node: 4, gpu_memory_gib: 8,
     intra_node_link: pcie}
"""


def test_a_scale_up_keeps_each_gpus_memory(tmp_path: Path) -> None:
    """On GPUs of 4 and 8 GiB an idle cluster grows both jobs past twice their request, and
    every placed plan fits each GPU by the validator's own ledger (plan_memory), as every
    other cell's does; with ``plans`` the same (the formulation's own memory check)."""
    (tmp_path / "c.yaml").write_text(MEMORY_CLUSTER)
    (tmp_path / "j.yaml").write_text(
        "jobs:\n"
        "  - {id: b336, model: bert-336m, global_batch_size: 64, iterations: 100000,"
        " requested_gpus: 1}\n"
        "  - {id: b13, model: bert-1.3b, global_batch_size: 64, iterations: 100000,"
        " requested_gpus: 1}\n")
    cluster = resolve_cluster(tmp_path / "c.yaml")
    specs = {j.id: j for j in load_jobs(tmp_path / "j.yaml")[0]}
    for policy in ("apportion", "apportion-plans"):
        out = tmp_path / f"{policy}.json"
        r = runner.invoke(app, ["solve-round", "--cluster", str(tmp_path / "c.yaml"),
                                "--jobs", str(tmp_path / "j.yaml"), "--policy", policy,
                                "--time-budget", "3", "--no-isolate", "--json", str(out)])
        assert r.exit_code == 0, r.output
        allocs = json.loads(out.read_text())["allocations"]
        assert {a["job"] for a in allocs} == set(specs), (policy, allocs)
        assert max(a["gpus"] for a in allocs) > 2, (policy, allocs)  # grown past 2N
        for a in allocs:
            plan = ExecutionPlan(**a["plan"])
            assert memory_violation(specs[a["job"]], plan, a["placement"], cluster) is None, \
                (policy, a)
