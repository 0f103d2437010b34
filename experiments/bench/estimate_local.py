"""`apportion bench estimate --against local`: estimator accuracy against real runs here.

Every configuration is trained by apportion's own runtime worker
(:mod:`apportion.runtime.workers.trainer`, launched like the local executor launches it:
torch gloo process groups, one thread per process), so the plans measured are
exactly the ones the scheduler hands out -- DP, checkpointing, accumulation,
ZeRO (FSDP), tensor parallelism and pipeline parallelism -- and the time of a
step is the worker's own (``losses.jsonl`` records each step's wall time and its
optimizer part).

Morphling's model takes the forward pass from a profiler (its ``T_fwd``): the
worker's own forward time of the fitting configurations (DP-family ones: a
pipeline stage's or a TP shard's forward is not the model's). Its k-parameters
are fitted on the smallest global batch's configurations (every plan family and worker count) and it predicts every
configuration of the larger batches: held out by batch size. The spine's
analytic estimator is scored on the same split, its one efficiency calibrated
on the fit set.

On a shared VM whole launches run slow at times (medians of one configuration
moved by 25 % between launches here), so each configuration is launched
``launches`` times, interleaved with the others, and its fastest step of its
fastest launch kept. Worker counts stop at the core count: processes beyond
the cores time-share them, which no model of parallel training represents.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from apportion.estimation.base import Sample
from apportion.estimation.models.morphling import Arch, Env, MorphlingEstimator, MorphlingSample
from apportion.experiments.bench.accuracy import rel_err, score_morphling, summarize

from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

# (plan fields besides dp, family, smallest worker count)
LOCAL_PLANS: list[tuple[dict[str, Any], str, int]] = [
    ({}, "DP", 1), ({"checkpointing": True}, "GC", 1), ({"accumulation": 2}, "GA", 1),
    ({"zero_stage": 2}, "ZeRO-DP", 2), ({"tp": 2}, "TP", 2),
    ({"pp": 2, "micro_batches": 2}, "PP", 2),
]
STAND_IN = "cpu"  # the device name the samples carry (Morphling keys its forward curve by it)


def local_grid(batches: tuple[int, ...], max_world: int
               ) -> list[tuple[int, ExecutionPlan, str]]:
    """``(global batch, plan, family)`` for every plan family at every worker count from its
    smallest to ``max_world`` (powers of two) and every batch that the plan divides."""
    out = []
    for b in batches:
        for w in (1, 2, 4):
            if w > max_world:
                continue
            for extra, fam, least in LOCAL_PLANS:
                if w < least:
                    continue
                tp, pp = int(extra.get("tp", 1)), int(extra.get("pp", 1))
                if w % (tp * pp):
                    continue
                plan = ExecutionPlan(dp=w // (tp * pp), **extra)
                per_rank = b // (plan.dp * plan.accumulation)
                if b % (plan.dp * plan.accumulation) or per_rank % max(1, plan.micro_batches):
                    continue
                out.append((b, plan, fam))
    return out


def run_runtime(model: str, batch: int, plan: ExecutionPlan, iters: int,
                timeout_s: float = 300.0) -> tuple[float, float, float | None]:
    """(step, optimizer, forward seconds or None) of the fastest step after two warm-up steps
    of one launch of the runtime worker group for ``plan`` (rank 0's)."""
    from apportion.runtime.executors.launch import launch_spec
    from apportion.runtime.executors.local.executor import free_port, spawn, wait
    from apportion.runtime.workers.trainer import LOSSES_FILE

    from apportion.decision import Allocation

    job = JobSpec("bench", model, batch, iters + 2, plan.gpus)
    alloc = Allocation("bench", "T4", plan.gpus, plan.pp, plan, {"local-0": plan.gpus}, 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        spec = launch_spec(job, alloc, "start", tmp, master_port=free_port())
        ok = wait(spawn(spec), timeout_s)
        jobdir = Path(spec.workdir)
        if not ok:
            logs = "\n".join((jobdir / f"rank{r}.log").read_text()[-800:]
                             for r in range(plan.gpus) if (jobdir / f"rank{r}.log").exists())
            raise RuntimeError(f"local run {model} {plan.label()} failed:\n{logs}")
        recs = [json.loads(x) for x in (jobdir / LOSSES_FILE).read_text().splitlines()]
    steps = [r for r in recs if r["iteration"] > 2] or recs
    best = min(steps, key=lambda r: r["time_s"])
    fwd = best.get("fwd_s")
    return float(best["time_s"]), float(best["opt_s"]), float(fwd) if fwd else None


def _samples_from(name: str, measured: list[dict[str, Any]]
                  ) -> tuple[list[MorphlingSample], list[str]]:
    arch = Arch.from_spec(get_model(name))
    samples, fams = [], []
    for r in measured:
        plan = ExecutionPlan(**r["plan"])
        job = JobSpec(id=f"local-{name}-{r['batch']}", model=name,
                      global_batch_size=int(r["batch"]), iterations=1, requested_gpus=plan.gpus)
        samples.append(MorphlingSample(job=job, plan=plan, placement={}, gpu_type=STAND_IN,
                                       iter_time_s=float(r["iter_s"]), cpus=1,
                                       fwd_s=r.get("fwd_s"), oo_s=r.get("opt_s"), arch=arch,
                                       nodes=(plan.gpus,)))
        fams.append(r["family"])
    return samples, fams


def fit_and_score_local(name: str, measured: list[dict[str, Any]], env: Env) -> dict[str, Any]:
    """Fit Morphling's model on the smallest batch's configurations, score the others; the
    analytic estimator on the same split."""
    samples, families = _samples_from(name, measured)
    smallest = min(s.job.global_batch_size for s in samples)
    fit_idx = [i for i, s in enumerate(samples) if s.job.global_batch_size == smallest]
    est = MorphlingEstimator(env=env, min_samples=min(7, len(fit_idx)), act_bytes=4.0,
                             grad_bytes=4.0, heldout_folds=0)
    est.fit([samples[i] for i in fit_idx])
    held = [(families[i], s) for i, s in enumerate(samples) if i not in fit_idx]
    fams, detail = score_morphling(est, held)
    for d, (_fam, s) in zip(detail, held):
        d["batch"] = s.job.global_batch_size
    out: dict[str, Any] = {f: summarize(e) for f, e in fams.items()}
    out["rows"] = detail
    out["fit_rows"] = [f"{samples[i].plan.label()}@b{samples[i].job.global_batch_size}"
                       for i in fit_idx]
    out["fit_rmsle"] = est.fit_rmsle_[name]
    out["k"] = est.k_[name]
    out["analytic"] = _score_analytic(samples, fit_idx, families, env)
    out["measured"] = measured
    return out


def _score_analytic(samples: list[MorphlingSample], fit_idx: list[int], families: list[str],
                    env: Env) -> dict[str, Any]:
    """The spine's analytic estimator: its one parameter (the sustained efficiency of a CPU
    process standing in as a catalog GPU type) calibrated on the fit set with communication
    and optimizer time taken out; the link is the measured all-reduce bandwidth."""
    from apportion.estimation.models.analytic import AnalyticEstimator

    from apportion.cluster import Cluster, NodeGroup

    gpu = "T4"
    cluster = Cluster("local-bench", [NodeGroup("local", 1, gpu, max(s.plan.gpus for s in samples),
                                                intra_node_link="pcie",
                                                intra_node_bandwidth_GBps=env.intra_GBps,
                                                inter_node_bandwidth_GBps=env.inter_GBps)])
    node = next(iter(cluster.nodes))
    est = AnalyticEstimator(calibrate="compute").fit(
        [Sample(samples[i].job, samples[i].plan, {node: samples[i].plan.gpus}, gpu,
                samples[i].iter_time_s) for i in fit_idx], cluster)
    fams: dict[str, list[float]] = {}
    rows = []
    for i, s in enumerate(samples):
        if i in fit_idx:
            continue
        e = est.predict(s.job, s.plan, {node: s.plan.gpus}, cluster)
        err = rel_err(e.iter_time_s, s.iter_time_s)
        fams.setdefault(families[i], []).append(err)
        rows.append({"family": families[i], "plan": s.plan.label(),
                     "batch": s.job.global_batch_size, "measured_s": s.iter_time_s,
                     "predicted_s": e.iter_time_s, "error": err})
    out: dict[str, Any] = {f: summarize(v) for f, v in fams.items()}
    out["overall"] = summarize([x for v in fams.values() for x in v])
    out["rows"] = rows
    out["efficiency"] = est.efficiency_
    return out


def per_estimator(out: dict[str, Any]) -> dict[str, Any]:
    """Held-out error per estimator over every model (``overall`` is the fitted model's)."""
    ana = [r["error"] for m in out["models"].values() for r in m["analytic"]["rows"]]
    return {"morphling (fitted)": out["overall"], "analytic (calibrated)": summarize(ana)}


def rescore_local(result: dict[str, Any]) -> dict[str, Any]:
    """Refit and rescore a saved result from its measurements (no new
    runs): model changes are judged on measurements taken once on a quiet machine."""
    bw = float(result["allreduce_GBps"])
    env = Env(intra_GBps=bw, inter_GBps=bw, pcie_GBps=bw)
    out = dict(result)
    out["models"] = {}
    errs: list[float] = []
    for name, m in result["models"].items():
        out["models"][name] = fit_and_score_local(name, m["measured"], env)
        errs += [r["error"] for r in out["models"][name]["rows"]]
    out["overall"] = summarize(errs)
    out["estimators"] = per_estimator(out)
    return out


def bench_local(models: tuple[str, ...] = ("gpt-tiny", "bert-tiny"),
                batches: tuple[int, ...] = (16, 32), iters: int = 8,
                max_world: int | None = None, launches: int = 3) -> dict[str, Any]:
    """Measure every configuration of :func:`local_grid` and score the estimators."""
    import torch
    from apportion.estimation.profilers.collectives import measure
    from apportion.estimation.profilers.profile_torch import profile_layers
    from apportion.estimation.profilers.torch_models import shape_of

    t0 = time.perf_counter()
    cores = os.cpu_count() or 1
    # with CUDA the worker trains on the GPUs (one rank per GPU: NCCL refuses two on one);
    # without it, worker counts stop at the core count
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    max_world = max_world or max(1, min(4, gpus or cores))
    tables = measure(ranks=(2,), max_bytes=4 * 2**20, min_bytes=2**16, repeats=3,
                     collectives=("all_reduce",))
    curve = tables.curves["all_reduce|loopback|2"]
    bw = curve.xs[-1] / curve.ys[-1] / 1e9  # effective all-reduce GB/s (algorithm bandwidth)
    env = Env(intra_GBps=bw, inter_GBps=bw, pcie_GBps=bw)
    grid = local_grid(batches, max_world)
    out: dict[str, Any] = {
        "against": "local", "allreduce_GBps": bw, "batches": list(batches),
        "machine": (f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
                    f"nccl; apportion's runtime worker, up to {max_world} processes" if gpus
                    else f"{cores}-core CPU, torch {torch.__version__}, gloo; apportion's "
                    f"runtime worker, 1 thread per process, up to {max_world} processes"),
        "held_out": f"fit on batch {min(batches)}, predict the others",
        "launches": launches, "models": {}}
    errs: list[float] = []
    cost: dict[str, Any] = {}
    for name in models:
        best: dict[int, tuple[float, float, float | None]] = {}
        measure_s = 0.0
        for _ in range(max(1, launches)):
            for i, (b, plan, _fam) in enumerate(grid):
                m0 = time.perf_counter()
                r = run_runtime(name, b, plan, iters)
                measure_s += time.perf_counter() - m0
                if i not in best or r[0] < best[i][0]:
                    best[i] = r
        measured = [{"family": fam, "plan": plan.as_dict(), "label": plan.label(), "batch": b,
                     "iter_s": best[i][0], "opt_s": best[i][1], "fwd_s": best[i][2]}
                    for i, (b, plan, fam) in enumerate(grid)]
        out["models"][name] = fit_and_score_local(name, measured, env)
        errs += [r["error"] for r in out["models"][name]["rows"]]
        # profiling cost of one cell (Crius figure 12b): DP-only and TP-only stage profiles
        p0 = time.perf_counter()
        width = min(4, shape_of(get_model(name)).heads)  # a TP degree must divide the heads
        profile_layers(name, min(batches), "dp", width, repeats=3)
        profile_layers(name, min(batches), "tp", width, repeats=3)
        cost[name] = {"profile_s_per_cell": time.perf_counter() - p0, "cell_width": width,
                      "exhaustive_measure_s": measure_s, "launches_per_configuration": launches,
                      "configurations_measured": len(grid)}
    out["overall"] = summarize(errs)
    out["estimators"] = per_estimator(out)
    out["profiling_cost"] = cost
    out["wall_s"] = time.perf_counter() - t0
    return out
