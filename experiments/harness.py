"""The comparison harness: one trace, one cluster, many policies and seeds.

``run_one`` resolves a trace name/path and a cluster argument, picks the
matching ground truth, runs the simulator and returns the result.
``compare`` runs every (policy, seed) in parallel processes with a rich
progress bar per run and writes ``results/<run>/``:

* ``<policy>-s<seed>/jobs.csv``, ``timeline.csv``, ``rounds.csv``,
  ``summary.json`` (a finished run is recognised by its summary and not redone:
  runs are resumable);
* ``summary.csv`` and ``summary.md`` (mean over seeds per policy);
* ``jct_cdf.png``, ``throughput.png``, ``queue.png``, ``utilization.png``.

Clusters: a YAML file (the spine's format), ``V:P:K`` GPU counts of V100,
P100 and K80 (Gavel's notation; 4 GPUs per server), or a name:
``crius-1280`` (Crius table 1), ``crius-testbed`` (64 A40/A10),
``morphling-64`` (8 x 8 A800).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pandas as pd
from apportion.experiments import groundtruth as gt
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.simulator import PROFILES, SimResult, Simulator

from apportion.cluster import Cluster, NodeGroup
from apportion.config import resolve_cluster
from apportion.errors import InputError
from apportion.inputs import check_count, parse_count

log = logging.getLogger(__name__)


def crius_cluster() -> Cluster:
    """Crius table 1: 1,280 GPUs (A100 80x4 NVLink, A40 160x2, A10 160x2, V100 20x16 NVLink)."""
    return resolve_cluster("crius-sim")


def morphling_cluster() -> Cluster:
    """Morphling 7: 8 servers x 8 A800 (80 GB), 96 vCPUs, 1,600 GB, NVLink 400 GB/s."""
    return resolve_cluster("morphling-64")


def gavel_cluster(v: int, p: int, k: int, per_server: int = 4) -> Cluster:
    groups = []
    for prefix, t, n in (("v100", "V100-32GB", v), ("p100", "P100", p), ("k80", "K80", k)):
        if n <= 0:
            continue
        full, rest = divmod(n, per_server)
        if full:
            groups.append(NodeGroup(prefix, full, t, per_server, 32, 256.0, "pcie", 32.0, 25.0))
        if rest:
            groups.append(NodeGroup(f"{prefix}r", 1, t, rest, 32, 256.0, "pcie", 32.0, 25.0))
    return Cluster(f"gavel-{v}:{p}:{k}", groups)


#: GPUs of one type a ``V100:P100:K80`` cluster may have (Crius's biggest has 1,280 in all):
#: the nodes are built before anything else, so the count is bounded first
MAX_COUNTS_GPUS = 100_000
#: seeds ``compare --seeds`` may ask for (each is a whole replay per policy)
MAX_SEEDS = 1_000
#: what a run name may be: one path component inside ``--out``
_RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def cluster_from_arg(arg: str) -> Cluster:
    from apportion.config import canonical_cluster_name, cluster_names_help, load_cluster

    if canonical_cluster_name(arg) is not None and not Path(arg).exists():
        return resolve_cluster(arg)
    m = re.fullmatch(r"(\d+):(\d+):(\d+)", arg)
    if m:
        v, p, k = (parse_count(x, "--cluster", minimum=0, maximum=MAX_COUNTS_GPUS, what=t)
                   for x, t in zip(m.groups(), ("V100", "P100", "K80")))
        if v + p + k <= 0:
            raise InputError(arg, "--cluster", "needs at least one GPU")
        return gavel_cluster(v, p, k)
    if arg.endswith((".yaml", ".yml")) or Path(arg).exists():
        return load_cluster(arg)
    raise InputError(arg, "--cluster", "not a YAML file, V100:P100:K80 counts, or a bundled "
                     "name: " + cluster_names_help())


#: ``--truth`` values: ``auto`` follows the trace format detected from the file's content.
TRUTHS = ("auto", "gavel", "crius", "morphling", "elasticflow", "analytic", "finetune")
_TRUTH_OF_FORMAT = {"gavel": "gavel", "gavel-csv": "gavel", "crius": "crius",
                    "morphling": "morphling", "elasticflow": "elasticflow",
                    "synthetic": "analytic", "raw": "crius", "finetune": "finetune"}


def _make_truth(kind: str, cluster: Cluster) -> Any:
    return {"gavel": gt.GavelTruth, "crius": gt.CriusTruth, "morphling": gt.MorphlingTruth,
            "elasticflow": gt.ElasticFlowTruth}[kind]() if kind != "analytic" \
        else gt.AnalyticTruth(cluster)


def _check_truth_covers(t: tr.Trace, truth: Any, cluster: Cluster, kind: str) -> None:
    """A ground truth that gives none of the trace's jobs a rate on this cluster would replay
    nothing and report it as a result: refuse it before the replay, naming the choice."""
    sample = t.jobs[:50]
    if not sample:
        return
    for j in sample:
        for g in cluster.gpu_types:
            try:
                if float(truth.rate(j, g, j.gpus)) > 0:
                    return
            except (KeyError, ValueError, ZeroDivisionError):
                continue
    raise InputError(t.source or t.name, "--truth",
                     f"the {kind} ground truth knows none of the first {len(sample)} jobs of "
                     f"this {t.format or 'unknown'}-format trace on cluster {cluster.name} "
                     f"({', '.join(cluster.gpu_types)}): every job would stall; give --truth "
                     f"(one of {', '.join(TRUTHS[1:])}) or a cluster of the trace's GPU types")


def resolve(trace_arg: str, cluster: Cluster, seed: int = 0,
            window_days: float | None = None, truth: str = "auto") -> tuple[tr.Trace, Any]:
    """The trace (adapted where the papers adapt it) and the ground truth that fits it.

    The truth follows the format detected from the trace's content
    (:data:`apportion.experiments.traces.FORMATS`), never its path, unless ``truth``
    names one. A raw cluster trace (no models) gets Crius's adaptation onto Crius's
    measured models.
    """
    if truth not in TRUTHS:
        raise InputError(truth, "--truth", f"unknown ground truth; choose {', '.join(TRUTHS)}")
    t = catalog.load_trace(trace_arg, seed=seed)
    kind = _TRUTH_OF_FORMAT.get(t.format, "crius") if truth == "auto" else truth
    if kind == "finetune":  # YMIR's fine-tuning workloads: work to target is the truth's
        from apportion.experiments.finetune_truth import FinetuneTruth

        ft = FinetuneTruth()
        return ft.with_iterations(t), ft
    if t.format == "raw":
        if kind != "crius":
            raise InputError(trace_arg, "--truth", f"a raw cluster trace carries no models; "
                             f"only crius (Crius's adaptation) applies, not {kind}")
        gtruth: Any = gt.CriusTruth()
        if window_days:
            s, e = tr.busiest_window(t, window_days * 24)
            t = t.window(s, e)
        t = tr.adapt_crius(t, gtruth, seed=seed)
        return t, gtruth
    gtruth = _make_truth(kind, cluster)
    if kind == "elasticflow":
        t = tr.Trace(t.name, [replace(j, gpu_type="A100-40GB") for j in t.jobs], t.source,
                     t.notes, t.format)
    _check_truth_covers(t, gtruth, cluster, kind)
    return t, gtruth


def prepare_one(trace: str, cluster: str, policy: str, profile: str = "default",
                seed: int = 0, policy_options: dict[str, Any] | None = None,
                sim_options: dict[str, Any] | None = None, window_days: float | None = None,
                max_jobs: int | None = None,
                ground_truth: str = "auto") -> Callable[[Any], SimResult]:
    """Everything a replay reads, read and checked (profile, cluster, trace, truth, policy):
    a bad input raises here, before any progress is shown; the result runs the replay
    (given a progress callback)."""
    from apportion.policies import make_policy

    if profile not in PROFILES:
        raise InputError(profile, "--profile", f"unknown profile; choose {', '.join(PROFILES)}")
    check_count(seed, "--seed", minimum=0, maximum=2**63 - 1)  # numpy's seeds are unsigned
    cl = cluster_from_arg(cluster)
    t, truth = resolve(trace, cl, seed, window_days, ground_truth)
    if max_jobs:
        t = t.head(max_jobs)
    cfg = replace(PROFILES[profile], seed=seed, **(sim_options or {}))
    pol = make_policy(policy, **(policy_options or {}))
    return lambda progress=None: Simulator(cl, t, pol, truth, cfg, progress=progress).run()


def run_one(trace: str, cluster: str, policy: str, profile: str = "default", seed: int = 0,
            policy_options: dict[str, Any] | None = None, sim_options: dict[str, Any] | None = None,
            window_days: float | None = None, max_jobs: int | None = None,
            progress: Any = None,
            ground_truth: str = "auto") -> SimResult:
    return prepare_one(trace, cluster, policy, profile, seed, policy_options, sim_options,
                       window_days, max_jobs, ground_truth)(progress)


def write_run(res: SimResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res.jobs.to_csv(out / "jobs.csv", index=False)
    res.timeline.to_csv(out / "timeline.csv", index=False)
    res.rounds.to_csv(out / "rounds.csv", index=False)
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(res.summary, indent=2, default=str) + "\n")
    os.replace(tmp, out / "summary.json")  # written last: its presence marks a finished run


def _worker(args: tuple[Any, ...]) -> tuple[str, int, dict[str, Any]]:
    (trace, cluster, policy, profile, seed, popts, sopts, window, max_jobs, out, queue) = args
    run_dir = Path(out) / f"{policy}-s{seed}"
    if (run_dir / "summary.json").exists():
        return policy, seed, json.loads((run_dir / "summary.json").read_text())

    def tick(sim_t: float, done: int, total: int) -> None:
        if queue is not None:
            queue.put((policy, seed, done, total))

    res = run_one(trace, cluster, policy, profile, seed, popts, sopts, window, max_jobs, tick)
    write_run(res, run_dir)
    if queue is not None:
        queue.put((policy, seed, res.summary["jobs"], res.summary["jobs"]))
    return policy, seed, res.summary


SUMMARY_COLS = ["policy", "jobs", "finished", "avg_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s",
                "avg_queue_s", "makespan_s", "utilization", "avg_throughput_samples_s",
                "peak_throughput_samples_s", "avg_restarts", "deadline_ratio", "ftf_rho_mean",
                "solver_s_mean", "fallbacks", "avg_jct_all_s", "p99_jct_all_s", "sla_kept",
                "sla_jobs"]


def compare(trace: str, cluster: str, policies: list[str], seeds: int = 1, out: str | Path = "results",
            run: str | None = None, profile: str = "default", workers: int | None = None,
            policy_options: dict[str, dict[str, Any]] | None = None,
            sim_options: dict[str, Any] | None = None, window_days: float | None = None,
            max_jobs: int | None = None, show_progress: bool = True, plots: bool = True,
            engine: str = "local", ray_address: str | None = None) -> Path:
    """Run every policy x seed (parallel processes, or Ray tasks with ``engine="ray"``),
    then write tables and plots.

    Progress (jobs finished over all runs; runs finished on Ray) goes to stderr: a bar on
    a terminal, plain periodic lines otherwise (:class:`apportion.console.Progress`)."""
    from apportion.console import Progress

    check_run_name(run)
    mode = (sim_options or {}).get("information", "estimated")
    name = run or re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{Path(trace).stem}-{cluster}-{mode}")
    root = Path(out) / name
    root.mkdir(parents=True, exist_ok=True)
    if engine == "ray":
        args = [(trace, cluster, p, profile, s, (policy_options or {}).get(p, {}),
                 sim_options or {}, window_days, max_jobs, str(root), None)
                for p in policies for s in range(seeds)]
        results = _run_on_ray(args, ray_address, show_progress)
        write_tables(root, results)
        if plots:
            write_plots(root, policies, seeds)
        return root
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    queue = manager.Queue()
    jobs = [(trace, cluster, p, profile, s, (policy_options or {}).get(p, {}), sim_options or {},
             window_days, max_jobs, str(root), queue) for p in policies for s in range(seeds)]
    results: list[tuple[str, int, dict[str, Any]]] = []
    nproc = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    state: dict[tuple[str, int], tuple[int, int]] = {}
    desc = f"compare {len(policies)} policies x {seeds} seeds"
    with Progress(desc, unit="jobs finished", heartbeat=True, enabled=show_progress) as prog:
        with ctx.Pool(nproc) as pool:
            pending = pool.map_async(_worker, jobs)
            while not pending.ready():
                pending.wait(0.2)
                while not queue.empty():
                    p, s, d, tot = queue.get()
                    state[(p, s)] = (d, tot)
                    prog.update(sum(v[0] for v in state.values()),
                                sum(v[1] for v in state.values()))
            results = pending.get()
        for p, s, summ in results:
            state[(p, s)] = (summ["jobs"], summ["jobs"])
        prog.update(sum(v[0] for v in state.values()), sum(v[1] for v in state.values()))
    manager.shutdown()
    write_tables(root, results)
    if plots:
        write_plots(root, policies, seeds)
    return root


def _run_on_ray(args: list[tuple[Any, ...]], address: str | None, show_progress: bool
                ) -> list[tuple[str, int, dict[str, Any]]]:
    """Every (policy, seed) run as a Ray task (one CPU each) on the cluster at ``address``,
    or on a local Ray instance of its own; a run whose summary exists is not redone (the
    results folder must be visible to the workers: a shared filesystem)."""
    from apportion.solvers.partition import RayEngine

    from apportion.console import Progress

    eng = RayEngine(address)
    try:
        remote = eng.ray.remote(num_cpus=1, max_retries=0)(_worker)
        refs = {remote.remote(a): (a[2], a[4]) for a in args}
        pending = list(refs)
        with Progress(f"compare on ray: {len(refs)} runs", unit="runs finished",
                      heartbeat=True, enabled=show_progress) as prog:
            while pending:
                _, pending = eng.ray.wait(pending, num_returns=1)
                prog.update(len(refs) - len(pending), len(refs))
        return [eng.ray.get(r) for r in refs]
    finally:
        eng.close()


CI_COLS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "utilization",
           "avg_jct_all_s", "p99_jct_all_s", "sla_kept")


def ci95(values: Any) -> float:
    """Half-width of the 95 % confidence interval of the mean (Student's t); 0 for one value."""
    import numpy as np
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not pd.isna(x)], dtype=float)
    if len(v) < 2:
        return 0.0
    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def write_tables(root: Path, results: list[tuple[str, int, dict[str, Any]]]) -> pd.DataFrame:
    """Mean over seeds per policy, with the 95 % CI half-width of the key metrics
    (``<metric>_ci95``) and the number of seeds; the information mode in the header."""
    rows = [{**{k: s.get(k) for k in SUMMARY_COLS if k != "policy"}, "policy": p, "seed": seed}
            for p, seed, s in results]
    df = pd.DataFrame(rows)
    num = [c for c in SUMMARY_COLS if c != "policy"]
    grouped = df.groupby("policy", sort=False)
    mean = grouped[num].mean(numeric_only=True).reset_index()
    mean = mean[[c for c in SUMMARY_COLS if c in mean.columns]]
    mean.insert(1, "seeds", grouped["seed"].count().to_numpy())
    for c in CI_COLS:
        if c in df.columns:
            mean[f"{c}_ci95"] = grouped[c].apply(ci95).to_numpy()
    mean.to_csv(root / "summary.csv", index=False)
    modes = sorted({str(s.get("information", "?")) for _, _, s in results})
    ests = sorted({str(s.get("estimator", "?")) for _, _, s in results})
    head = (f"information: {', '.join(modes)}; estimator: {', '.join(ests)}; "
            f"mean over seeds, ± the 95 % confidence interval (Student's t)\n\n")
    (root / "summary.md").write_text(head + to_markdown(_with_ci(mean)))
    return mean


def _with_ci(mean: pd.DataFrame) -> pd.DataFrame:
    """The markdown view: ``mean ± ci`` in one cell for the metrics with a CI."""
    out = mean.copy()
    for c in CI_COLS:
        if c in out.columns and f"{c}_ci95" in out.columns:
            out[c] = [f"{m:.4g} ± {h:.2g}" if pd.notna(m) else "" for m, h in
                      zip(out[c], out[f"{c}_ci95"])]
            out = out.drop(columns=[f"{c}_ci95"])
    return out


def to_markdown(df: pd.DataFrame) -> str:
    """The frame as markdown (:func:`apportion.tables.frame_markdown`, the one renderer)."""
    from apportion.tables import frame_markdown

    return frame_markdown(df)


def _band(ax: Any, curves: list[tuple[Any, Any]], label: str) -> None:
    """Mean over seeds with a shaded 95 % confidence band (curves on a common grid)."""
    import numpy as np
    from scipy import stats

    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return
    grid = np.linspace(0.0, max(float(x[-1]) for x, _ in curves), 400)
    ys = np.array([np.interp(grid, x, y) for x, y in curves])
    m = ys.mean(axis=0)
    line = ax.plot(grid, m, label=f"{label} ({len(curves)} seeds)", lw=0.9)[0]
    if len(curves) > 1:
        h = stats.t.ppf(0.975, len(curves) - 1) * ys.std(axis=0, ddof=1) / np.sqrt(len(curves))
        ax.fill_between(grid, m - h, m + h, color=line.get_color(), alpha=0.2, lw=0)


def write_plots(root: Path, policies: list[str], seeds: int) -> None:
    """JCT CDF, throughput, queue and utilisation: every seed, mean with a 95 % CI band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from apportion.experiments.metrics import jct_cdf

    figs = {k: plt.subplots(figsize=(7, 4)) for k in ("jct_cdf", "throughput", "queue", "utilization")}
    for p in policies:
        cdfs, thr, queue, util = [], [], [], []
        for s in range(seeds):
            d = root / f"{p}-s{s}"
            if not (d / "jobs.csv").exists():
                continue
            jobs = pd.read_csv(d / "jobs.csv")
            x, y = jct_cdf(jobs)
            # the CDF as JCT quantiles: average the JCT at each probability over seeds
            cdfs.append((y, x / 3600))
            tl = pd.read_csv(d / "timeline.csv")
            if len(tl):
                h = ((tl["t"] - tl["t"].iloc[0]) / 3600).to_numpy()
                thr.append((h, tl["throughput_samples_s"].to_numpy()))
                queue.append((h, tl["queued"].to_numpy()))
                cols = [c for c in tl.columns if c.startswith("util_")]
                util.append((h, tl[cols].mean(axis=1).to_numpy()))
        if cdfs:
            grid = np.linspace(0.0, 1.0, 200)
            qs = np.array([np.interp(grid, pr, jct) for pr, jct in cdfs])
            figs["jct_cdf"][1].plot(qs.mean(axis=0), grid, label=f"{p} ({len(cdfs)} seeds)")
        _band(figs["throughput"][1], thr, p)
        _band(figs["queue"][1], queue, p)
        _band(figs["utilization"][1], util, p)
    labels = {"jct_cdf": ("JCT (h), mean over seeds", "CDF"), "throughput": ("time (h)", "samples/s"),
              "queue": ("time (h)", "queued jobs"), "utilization": ("time (h)", "mean GPU utilisation")}
    for k, (fig, ax) in figs.items():
        ax.set_xlabel(labels[k][0])
        ax.set_ylabel(labels[k][1])
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(root / f"{k}.png", dpi=110)
        plt.close(fig)
    _util_by_type(root, policies, seeds, plt)


def _util_by_type(root: Path, policies: list[str], seeds: int, plt: Any) -> None:
    rows = {}
    for p in policies:
        per_seed = [json.loads(f.read_text()).get("utilization_by_type", {})
                    for f in (root / f"{p}-s{s}" / "summary.json" for s in range(seeds))
                    if f.exists()]
        if per_seed:
            rows[p] = pd.DataFrame(per_seed).mean().to_dict()
    if not rows:
        return
    df = pd.DataFrame(rows).T.fillna(0.0)
    ax = df.plot.bar(figsize=(7, 4))
    ax.set_ylabel("utilisation by GPU type (mean over seeds)")
    ax.figure.tight_layout()
    ax.figure.savefig(root / "utilization_by_type.png", dpi=110)
    plt.close(ax.figure)


# ---------------------------------------------------------------------------
# What the CLI calls (command bodies stay thin)
# ---------------------------------------------------------------------------
def _check_policy(name: str) -> None:
    from apportion.policies import POLICIES, load_plugins

    load_plugins()
    if name not in POLICIES:
        raise InputError(name, "--policy", f"unknown policy; known: {', '.join(sorted(POLICIES))}")


def _check_information(information: str, estimator: str) -> None:
    from apportion.estimation.registry import ESTIMATORS

    from apportion.view import INFORMATION_MODES

    if information not in INFORMATION_MODES:
        raise InputError("--information", "information", f"{information!r} is not one of "
                         f"{', '.join(INFORMATION_MODES)}")
    if estimator not in ESTIMATORS:
        raise InputError("--estimator", "estimator", f"{estimator!r} is not one of "
                         f"{', '.join(ESTIMATORS)} (a replay's scaling model)")


def check_run_name(run: str | None) -> None:
    """``compare --run``: one path component inside ``--out`` (letters, digits, ``_ . -``;
    not ``.`` or ``..``), so a run name never writes outside the results folder."""
    if run is not None and (not _RUN_NAME.fullmatch(run) or run in (".", "..")):
        raise InputError(repr(run), "--run", "a run name is one folder name inside --out: "
                         "letters, digits, _ . - (no / or ..), at most 128 characters")


def simulate_main(trace: str, cluster: str, policy: str, profile: str, seed: int,
                  interval: float | None, restart_cost: float | None, noise: float,
                  window_days: float | None, max_jobs: int | None, json_out: Path | None,
                  jobs_csv: Path | None, information: str = "estimated",
                  estimator: str = "analytic", ground_truth: str = "auto",
                  show_progress: bool = True, deterministic: bool = False) -> dict[str, Any]:
    """``apportion simulate``: replay, write the outputs, and fail loudly on a stalled replay.

    Jobs left unfinished that were neither dropped by the policy nor larger than the
    cluster stopped progressing: the outputs are written (they show the state) and
    :class:`StalledReplay` names them, so the command exits non-zero.
    """
    from apportion import outputs
    from apportion.console import Progress

    _check_policy(policy)
    _check_information(information, estimator)
    sim: dict[str, Any] = {"noise_sigma": noise, "information": information,
                           "estimator": estimator, "deterministic": deterministic}
    if interval is not None:
        sim["interval_s"] = interval
    if restart_cost is not None:
        sim["restart_cost_s"] = restart_cost
    replay = prepare_one(trace, cluster, policy, profile, seed, None, sim, window_days,
                         max_jobs, ground_truth)  # bad input fails before anything runs
    with Progress(f"simulate {policy}", unit="jobs finished", enabled=show_progress) as prog:
        res = replay(lambda _t, done, total: prog.update(done, total))
        prog.update(res.summary["finished"], res.summary["jobs"])
    if json_out:
        outputs.write_json(json_out, res.summary, "--json")
    if jobs_csv:
        outputs.write_with(jobs_csv, lambda fh: res.jobs.to_csv(fh, index=False), "--jobs-csv",
                           newline="")
    jf = res.jobs
    if len(jf):
        stuck = jf[~jf["finished"].astype(bool) & ~jf["dropped"].astype(bool)]
        if len(stuck):
            raise StalledReplay(list(stuck["job_id"].astype(str)), res.summary)
    return res.summary


class StalledReplay(RuntimeError):
    """A replay ended with jobs that stopped progressing (no rate, no capacity ever)."""

    def __init__(self, jobs: list[str], summary: dict[str, Any]) -> None:
        self.jobs = jobs
        self.summary = summary
        shown = ", ".join(jobs[:10]) + (f" and {len(jobs) - 10} more" if len(jobs) > 10 else "")
        super().__init__(
            f"{len(jobs)} of {summary.get('jobs')} jobs stopped progressing and never finished "
            f"({shown}); ground truth {summary.get('truth')!r}, cluster "
            f"{summary.get('cluster')!r}: check the trace's GPU types against the cluster, or "
            "give --truth")


def compare_main(trace: str, cluster: str, policies: str, seeds: int, profile: str, out: Path,
                 run: str | None, workers: int | None, window_days: float | None,
                 max_jobs: int | None, information: str = "estimated",
                 estimator: str = "analytic", engine: str = "local",
                 ray_address: str | None = None, deterministic: bool = False) -> Path:
    _check_information(information, estimator)
    if engine not in ("local", "ray"):
        raise InputError("--engine", "engine", f"{engine!r} is not one of local, ray")
    if ray_address is not None and engine != "ray":
        raise InputError("--ray-address", "ray_address", f"is used only with --engine ray "
                         f"(--engine is {engine}); give --engine ray or leave --ray-address out")
    check_count(seeds, "--seeds", maximum=MAX_SEEDS)
    check_run_name(run)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise InputError(policies, "--policies", "give at least one policy")
    for n in names:
        _check_policy(n)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(policies, "--policies", f"{', '.join(twice)} given twice: each policy "
                         "is one run per seed (its results would be counted twice)")
    if profile not in PROFILES:
        raise InputError(profile, "--profile", f"unknown profile; choose {', '.join(PROFILES)}")
    cluster_from_arg(cluster)
    catalog.load_trace(trace)  # fail on a bad trace before spawning workers
    return compare(trace, cluster, names, seeds, out, run, profile, workers,
                   sim_options={"information": information, "estimator": estimator,
                                "deterministic": deterministic},
                   window_days=window_days, max_jobs=max_jobs, engine=engine,
                   ray_address=ray_address)
