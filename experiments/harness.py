"""The comparison harness: one trace, one cluster, many policies and seeds.

``run_one`` resolves a trace name/path and a cluster argument, picks the
matching ground truth, runs the simulator and returns the result.
``compare`` runs every (policy, seed) in parallel processes with a rich
progress bar per run and writes ``results/<run>/``:

* ``<policy>-s<seed>/jobs.csv``, ``timeline.csv``, ``rounds.csv``,
  ``summary.json`` (a finished run is recognised by its summary and not redone:
  runs are resumable);
* ``summary.csv`` and ``summary.md`` (mean over seeds per policy);
* ``jct_cdf.png``, ``throughput.png``, ``queue.png``, ``utilization.png``,
  ``utilization_by_type.png`` and ``plots.json`` (:mod:`apportion.experiments.plots`:
  titles, hours, bootstrap bands clipped to what is physical).

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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments import truths
from apportion.experiments.plots import write_plots, write_summary_markdown
from apportion.experiments.simulator import PROFILES, SimResult, Simulator

from apportion.batch_gc import for_batch_work
from apportion.cluster import Cluster, NodeGroup
from apportion.config import load_tenants, resolve_cluster
from apportion.errors import InputError
from apportion.inputs import check_count, parse_count
from apportion.policies import objective_policies, objective_preset_options, policy_names, \
    quota_options

log = logging.getLogger(__name__)


def crius_cluster() -> Cluster:
    """Crius table 1: 1,280 GPUs (A100 80x4 NVLink, A40 160x2, A10 160x2, V100 20x16 NVLink)."""
    return resolve_cluster("crius-sim")


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


def truth_choices() -> tuple[str, ...]:
    """``--truth`` values: ``auto`` (the trace format's own truth, or ``tables`` where
    ``--tables`` gives the rates) and every registered ground truth."""
    return ("auto", *truths.truth_names())


def _check_truth_covers(t: tr.Trace, truth: Any, cluster: Cluster, kind: str,
                        coverage: str = "sample") -> None:
    """A ground truth that rates none of the trace's jobs on this cluster would replay
    nothing and report it as a result; where the format is a user's own (``every``), one
    job it cannot rate would stall the replay. Refuse either before the replay, naming
    the choice, the jobs and what would rate them."""
    if coverage == "none" or not t.jobs:
        return

    def rated(j: tr.SimJob) -> bool:
        for g in cluster.gpu_types:
            try:
                if float(truth.rate(j, g, j.gpus)) > 0:
                    return True
            except (KeyError, ValueError, ZeroDivisionError):
                continue
        return False

    where = f"on cluster {cluster.name} ({', '.join(cluster.gpu_types)})"
    if coverage == "every":
        unrated = [j for j in t.jobs if not rated(j)]
        if not unrated:
            return
        groups: dict[tuple[str, int, int], list[str]] = {}
        for j in unrated:
            groups.setdefault((j.model or j.job_type, j.batch, j.gpus), []).append(j.job_id)
        shown = "; ".join(f"model {m} at batch {b} on {g} GPU{'s' if g != 1 else ''} (job"
                          f"{'s' if len(ids) > 1 else ''} {', '.join(ids[:3])}"
                          f"{' ...' if len(ids) > 3 else ''})"
                          for (m, b, g), ids in list(groups.items())[:4])
        more = f" and {len(groups) - 4} more" if len(groups) > 4 else ""
        why = truths.hint(kind, truth, unrated)
        raise InputError(t.source or t.name, "column model",
                         f"the {kind} ground truth has no rate {where} for {len(unrated)} of "
                         f"the trace's {len(t.jobs)} jobs: {shown}{more}"
                         + (f"; {why}" if why else ""))
    sample = t.jobs[:50]
    if any(rated(j) for j in sample):
        return
    why = truths.hint(kind, truth, sample)
    raise InputError(t.source or t.name, "--truth",
                     f"the {kind} ground truth knows none of the first {len(sample)} jobs of "
                     f"this {t.format or 'unknown'}-format trace {where}: every job would "
                     f"stall; give --truth (one of {', '.join(truth_choices()[1:])}) or a "
                     "cluster of the trace's GPU types" + (f"; {why}" if why else ""))


def _truth_of(fmt: tr.TraceFormat, truth: str, tables: Path | None) -> str:
    """The registered truth a replay of ``fmt`` uses: ``--truth`` when given, ``tables``
    where ``--tables`` gives the rates, else the format's own; refused, saying why, where
    it cannot apply to the format's jobs."""
    if truth not in truth_choices():
        raise InputError(truth, "--truth", f"unknown ground truth; choose "
                         f"{', '.join(truth_choices())}")
    if tables is not None and truth not in ("auto", "tables"):
        raise InputError(truth, "--truth", "--tables gives the replay's rates (the tables "
                         "truth): leave --truth out, or give --truth tables")
    if truth == "tables" and tables is None:
        raise InputError(truth, "--truth", "the tables truth is your measured iteration "
                         "times: give them with --tables FILE")
    kind = truth if truth != "auto" else "tables" if tables is not None else fmt.truth_name()
    allowed = fmt.truths if fmt.truths is not None else truths.general_truths()
    if truth == "auto" and tables is None:
        return kind  # the format's own (a plug-in's factory included)
    if kind not in allowed:
        flag = "--tables" if truth == "auto" else "--truth"
        why = fmt.why or ("its jobs carry no fine-tuning targets" if kind == "finetune"
                          else "its jobs are not keyed for it")
        raise InputError(str(tables) if flag == "--tables" else kind, flag,
                         f"a {fmt.name}-format trace replays on "
                         f"{' or '.join(allowed)} rates, not {kind}: {why}")
    return kind


def resolve(trace_arg: str, cluster: Cluster, seed: int = 0,
            window_days: float | None = None, truth: str = "auto",
            tables: str | Path | None = None) -> tuple[tr.Trace, Any]:
    """The trace (prepared as its format and truth prepare it) and the ground truth.

    The format is detected from the trace's content, never its path, and registered
    with how its truth is given (:mod:`apportion.experiments.traces`); ``truth`` names
    another truth, ``tables`` (a measured iteration-times CSV) makes the user's own
    measurements the truth. A raw cluster trace gets Crius's adaptation onto Crius's
    measured models (``window_days``: its busiest days first). Everything prepared into
    the trace is in its ``substitutions``.
    """
    tables_path = Path(tables) if tables is not None else None
    t = catalog.load_trace(trace_arg, seed=seed)
    fmt = tr.trace_format(t.format)
    kind = _truth_of(fmt, truth, tables_path)
    if isinstance(fmt.truth, str) or kind != fmt.truth_name():
        gtruth = truths.make_truth(kind, truths.TruthInputs(cluster, tables_path))
    else:
        gtruth = fmt.truth(cluster)  # a plug-in format's own truth
    if fmt.prepare is not None:
        t = fmt.prepare(t, tr.Preparation(cluster, seed, window_days, kind, gtruth))
    t = truths.prepare_for(kind, t, gtruth)
    _check_truth_covers(t, gtruth, cluster, kind, fmt.coverage)
    return (t if t.format == fmt.name else replace(t, format=fmt.name)), gtruth


@dataclass
class Replay:
    """One replay, read and checked, not yet run: call it (with a progress callback) to
    run it. ``trace`` is what it replays, as prepared (its ``substitutions`` say what was
    read into the file), ``truth`` the ground truth."""

    cluster: Cluster
    trace: tr.Trace
    policy: Any
    truth: Any
    config: Any

    def __call__(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        res = Simulator(self.cluster, self.trace, self.policy, self.truth, self.config,
                        progress=progress).run()
        res.summary["trace_format"] = self.trace.format
        res.summary["substitutions"] = self.trace.substitution_report()
        return res


def prepare_one(trace: str, cluster: str, policy: str, profile: str = "default",
                seed: int = 0, policy_options: dict[str, Any] | None = None,
                sim_options: dict[str, Any] | None = None, window_days: float | None = None,
                max_jobs: int | None = None, ground_truth: str = "auto",
                tables: str | Path | None = None) -> Replay:
    """Everything a replay reads, read and checked (profile, cluster, trace, truth, policy):
    a bad input raises here, before any progress is shown; the result runs the replay
    (given a progress callback). ``tables``: the user's measured iteration times, the
    replay's truth."""
    from apportion.policies import make_policy

    if profile not in PROFILES:
        raise InputError(profile, "--profile", f"unknown profile; choose {', '.join(PROFILES)}")
    check_count(seed, "--seed", minimum=0, maximum=2**63 - 1)  # numpy's seeds are unsigned
    cl = cluster_from_arg(cluster)
    t, truth = resolve(trace, cl, seed, window_days, ground_truth, tables)
    if max_jobs:
        t = t.head(max_jobs)
    options = dict(sim_options or {})
    load = options.pop("load", None)  # the trace's, not the simulator's: a load sweep's row
    if load is not None:
        t = t.at_load(float(load))
    cfg = replace(PROFILES[profile], seed=seed, **options)
    pol = make_policy(policy, **(policy_options or {}))
    return Replay(cl, t, pol, truth, cfg)


def run_one(trace: str, cluster: str, policy: str, profile: str = "default", seed: int = 0,
            policy_options: dict[str, Any] | None = None, sim_options: dict[str, Any] | None = None,
            window_days: float | None = None, max_jobs: int | None = None,
            progress: Any = None, ground_truth: str = "auto",
            tables: str | Path | None = None) -> SimResult:
    return prepare_one(trace, cluster, policy, profile, seed, policy_options, sim_options,
                       window_days, max_jobs, ground_truth, tables)(progress)


def write_run(res: SimResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res.jobs.to_csv(out / "jobs.csv", index=False)
    res.timeline.to_csv(out / "timeline.csv", index=False)
    res.rounds.to_csv(out / "rounds.csv", index=False)
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(res.summary, indent=2, default=str) + "\n")
    os.replace(tmp, out / "summary.json")  # written last: its presence marks a finished run


def _run_worker(args: tuple[Any, ...]) -> dict[str, Any]:
    """One (policy, seed) run of :func:`compare`: its summary (read back when a finished run
    left one: runs are resumable)."""
    (trace, cluster, policy, profile, seed, popts, sopts, window, max_jobs, out, queue,
     tables) = args
    run_dir = Path(out) / f"{policy}-s{seed}"
    if (run_dir / "summary.json").exists():
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        return summary

    def tick(sim_t: float, done: int, total: int) -> None:
        if queue is not None:
            queue.put((policy, seed, done, total))

    res = run_one(trace, cluster, policy, profile, seed, popts, sopts, window, max_jobs, tick,
                  tables=tables)
    write_run(res, run_dir)
    if queue is not None:
        queue.put((policy, seed, res.summary["jobs"], res.summary["jobs"]))
    return res.summary


def _worker(args: tuple[Any, ...]) -> tuple[str, int, dict[str, Any] | None, str | None]:
    """:func:`_run_worker` in a worker process: ``(policy, seed, summary, None)``, or
    ``(policy, seed, None, error)`` when the run failed. Every exception reaches the parent
    as text (its class, message and traceback), whatever its class: one that cannot be
    pickled back (a constructor with required arguments, a class the parent cannot import)
    would otherwise kill the pool's result thread and leave the parent waiting forever."""
    policy, seed = str(args[2]), int(args[4])
    try:
        return policy, seed, _run_worker(args), None
    except Exception as exc:  # noqa: BLE001 - the run failed; its row says so
        return policy, seed, None, _error_text(exc)


def _error_text(exc: BaseException) -> str:
    """``Class: message`` on the first line, then the traceback (what a failed row keeps)."""
    import traceback

    head = f"{type(exc).__name__}: {exc}".strip()
    return head + "\n" + "".join(traceback.format_exception(exc)).rstrip()


class CompareFailed(RuntimeError):
    """Some runs of a comparison failed: their rows say so (``error``), the others' results
    are written; the command exits non-zero naming each failed run and the first line of
    its error."""

    def __init__(self, root: Path, failures: dict[tuple[str, int], str], runs: int) -> None:
        self.root = root
        self.failures = failures
        lines = "; ".join(f"{p} seed {s}: {err.splitlines()[0]}"
                          for (p, s), err in sorted(failures.items()))
        super().__init__(f"{len(failures)} of {runs} runs failed ({lines}); the other runs' "
                         f"results and the failed rows are in {root}")


SUMMARY_COLS = ["policy", "jobs", "finished", "avg_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s",
                "avg_queue_s", "makespan_s", "utilization", "avg_throughput_samples_s",
                "peak_throughput_samples_s", "avg_restarts", "deadline_ratio", "ftf_rho_mean",
                "solver_s_mean", "fallbacks", "gap_mean", "avg_jct_all_s", "p99_jct_all_s",
                "sla_kept", "sla_jobs", "avg_jct_lower_bound_s", "avg_jct_all_lower_bound_s",
                "avg_jct_to_bound"]


def trace_jobs(trace: str, cluster: str, window_days: float | None = None,
               max_jobs: int | None = None, tables: str | Path | None = None) -> int:
    """How many jobs one run of ``trace`` replays (seed 0; the generated families draw the
    same count for every seed): a comparison's progress total, known before any run
    starts. Resolving the trace here also refuses a trace the cluster cannot replay
    (:class:`InputError`) before any worker is spawned."""
    t, _ = resolve(trace, cluster_from_arg(cluster), 0, window_days, tables=tables)
    return len(t.head(max_jobs)) if max_jobs else len(t)


def compare(trace: str, cluster: str, policies: list[str], seeds: int = 1, out: str | Path = "results",
            run: str | None = None, profile: str = "default", workers: int | None = None,
            policy_options: dict[str, dict[str, Any]] | None = None,
            sim_options: dict[str, Any] | None = None, window_days: float | None = None,
            max_jobs: int | None = None, show_progress: bool = True, plots: bool = True,
            engine: str = "local", ray_address: str | None = None,
            tables: str | Path | None = None, per_run_jobs: int | None = None) -> Path:
    """Run every policy x seed (parallel processes, or Ray tasks with ``engine="ray"``),
    then write tables and plots.

    Progress (jobs finished over all runs, out of every run's jobs from the start; runs
    finished on Ray) goes to stderr: a bar on a terminal, plain periodic lines otherwise
    (:class:`apportion.console.Progress`). A run that fails fails its row (``error`` in
    ``summary.csv`` and ``summary.md``); the others are written, then
    :class:`CompareFailed` names the failed runs. A worker process that dies (killed, out
    of memory) fails the runs it had: nothing waits on it. ``tables``: measured iteration
    times, the runs' truth; ``per_run_jobs``: the jobs one run replays, where the caller
    resolved the trace already (the progress total; else it is resolved here)."""
    check_run_name(run)
    mode = (sim_options or {}).get("information", "estimated")
    name = run or re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{Path(trace).stem}-{cluster}-{mode}")
    root = Path(out) / name
    root.mkdir(parents=True, exist_ok=True)
    runs = [(p, s) for p in policies for s in range(seeds)]
    if engine == "ray":
        args = [(trace, cluster, p, profile, s, (policy_options or {}).get(p, {}),
                 sim_options or {}, window_days, max_jobs, str(root), None,
                 None if tables is None else str(tables)) for p, s in runs]
        outcomes = _run_on_ray(args, ray_address, show_progress)
    else:
        outcomes = _run_local(trace, cluster, runs, profile, policy_options, sim_options,
                              window_days, max_jobs, root, workers, show_progress, tables,
                              per_run_jobs)
    results = [(p, s, summ) for p, s, summ, _ in outcomes if summ is not None]
    failures = {(p, s): err or "failed" for p, s, summ, err in outcomes if summ is None}
    write_tables(root, results, failures)
    if plots:
        write_plots(root, policies, seeds)
    if failures:
        raise CompareFailed(root, failures, len(runs))
    return root


#: one run's outcome: (policy, seed, its summary, None) or (policy, seed, None, its error)
Outcome = tuple[str, int, dict[str, Any] | None, str | None]


def _run_local(trace: str, cluster: str, runs: list[tuple[str, int]], profile: str,
               policy_options: dict[str, dict[str, Any]] | None,
               sim_options: dict[str, Any] | None, window_days: float | None,
               max_jobs: int | None, root: Path, workers: int | None,
               show_progress: bool, tables: str | Path | None = None,
               per_run_jobs: int | None = None) -> list[Outcome]:
    """Every run in a pool of spawned processes (:class:`ProcessPoolExecutor`: a worker that
    dies breaks the pool, and every run it had fails, where ``multiprocessing.Pool`` would
    wait for it forever); the parent sleeps between progress reports."""
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from apportion.console import Progress

    per_run = per_run_jobs if per_run_jobs is not None else \
        trace_jobs(trace, cluster, window_days, max_jobs, tables)
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    outcomes: list[Outcome] = []
    try:
        q = manager.Queue()
        nproc = max(1, min(workers or os.cpu_count() or 1, len(runs)))
        state: dict[tuple[str, int], int] = {}
        total = per_run * len(runs)
        desc = f"compare {len({p for p, _ in runs})} policies x " \
               f"{len({s for _, s in runs})} seeds ({len(runs)} runs)"

        def drain(prog: Progress) -> None:
            moved = False
            while True:
                try:
                    p, s, d, _tot = q.get_nowait()
                except queue_mod.Empty:
                    break
                state[(p, s)] = int(d)
                moved = True
            if moved:
                prog.update(sum(state.values()), total)

        with Progress(desc, total=total, unit="jobs finished", heartbeat=True,
                      enabled=show_progress) as prog, \
                ProcessPoolExecutor(nproc, mp_context=ctx,
                                    initializer=for_batch_work) as pool:
            futures = {pool.submit(_worker, (trace, cluster, p, profile, s,
                                             (policy_options or {}).get(p, {}),
                                             sim_options or {}, window_days, max_jobs,
                                             str(root), q,
                                             None if tables is None else str(tables))): (p, s)
                       for p, s in runs}
            pending = set(futures)
            while pending:  # the parent sleeps in ``wait``: no spinning
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                drain(prog)
                for f in done:
                    p, s = futures[f]
                    try:
                        outcomes.append(f.result())
                    except Exception as exc:  # noqa: BLE001 - its process died
                        outcomes.append((p, s, None, _error_text(exc)))
                    got = outcomes[-1][2]
                    state[(p, s)] = int(got["jobs"]) if got else state.get((p, s), 0)
                if done:
                    prog.update(sum(state.values()), total)
    finally:
        manager.shutdown()
    order = {r: i for i, r in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[(o[0], o[1])])


def _run_on_ray(args: list[tuple[Any, ...]], address: str | None, show_progress: bool
                ) -> list[Outcome]:
    """Every (policy, seed) run as a Ray task (one CPU each) on the cluster at ``address``,
    or on a local Ray instance of its own; a run whose summary exists is not redone (the
    results folder must be visible to the workers: a shared filesystem). A task that
    fails (its worker died) fails its run."""
    from apportion.solvers.ray_engine import RayEngine

    from apportion.console import Progress

    eng = RayEngine(address)
    try:
        remote = eng.ray.remote(num_cpus=1, max_retries=0)(_worker)
        refs = {remote.remote(a): (str(a[2]), int(a[4])) for a in args}
        pending = list(refs)
        with Progress(f"compare on ray: {len(refs)} runs", total=len(refs), unit="runs finished",
                      heartbeat=True, enabled=show_progress) as prog:
            while pending:
                _, pending = eng.ray.wait(pending, num_returns=1)
                prog.update(len(refs) - len(pending), len(refs))
        outcomes: list[Outcome] = []
        for r, (p, s) in refs.items():
            try:
                outcomes.append(eng.ray.get(r))
            except Exception as exc:  # noqa: BLE001 - the task's worker died
                outcomes.append((p, s, None, _error_text(exc)))
        return outcomes
    finally:
        eng.close()


CI_COLS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "utilization",
           "avg_jct_all_s", "p99_jct_all_s", "sla_kept", "avg_jct_to_bound")


def ci95(values: Any) -> float:
    """Half-width of the 95 % confidence interval of the mean (Student's t); 0 for one value."""
    import numpy as np
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not pd.isna(x)], dtype=float)
    if len(v) < 2:
        return 0.0
    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def write_tables(root: Path, results: list[tuple[str, int, dict[str, Any]]],
                 failures: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    """Mean over seeds per policy, with the 95 % CI half-width of the key metrics
    (``<metric>_ci95``) and the number of seeds; the information mode in the header. A
    policy with failed runs says so in ``error`` (the seeds that failed and the first
    line of the first error); its means are over the seeds that ran, if any."""
    failures = failures or {}
    rows = [{**{k: s.get(k) for k in SUMMARY_COLS if k != "policy"}, "policy": p, "seed": seed}
            for p, seed, s in results]
    num = [c for c in SUMMARY_COLS if c != "policy"]
    df = pd.DataFrame(rows, columns=["policy", "seed", *num])
    grouped = df.groupby("policy", sort=False)
    mean = grouped[num].mean(numeric_only=True).reset_index()
    mean = mean[[c for c in SUMMARY_COLS if c in mean.columns]]
    mean.insert(1, "seeds", grouped["seed"].count().to_numpy())
    for c in CI_COLS:
        if c in mean.columns:
            mean[f"{c}_ci95"] = grouped[c].apply(ci95).to_numpy()
    failed_policies = list(dict.fromkeys(p for p, _ in sorted(failures)))
    missing = [p for p in failed_policies if p not in set(mean["policy"])]
    if missing:
        mean = pd.concat([mean, pd.DataFrame({"policy": missing, "seeds": 0})],
                         ignore_index=True)
    if failures:
        mean["error"] = [_failed_cell(p, failures) for p in mean["policy"]]
    mean.to_csv(root / "summary.csv", index=False)
    write_summary_markdown(root, mean, results)  # hours, ± n/a for one seed, best in bold
    return mean


def _failed_cell(policy: str, failures: dict[tuple[str, int], str]) -> str:
    seeds = sorted(s for p, s in failures if p == policy)
    if not seeds:
        return ""
    first = failures[(policy, seeds[0])].splitlines()[0]
    return f"failed (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}): {first}"


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


# ---------------------------------------------------------------------------
# What the CLI calls (command bodies stay thin)
# ---------------------------------------------------------------------------
def _check_policy(name: str) -> None:
    from apportion.policies import POLICIES, load_plugins

    load_plugins()
    if name not in POLICIES:
        raise InputError(name, "--policy", f"unknown policy; known: {', '.join(sorted(POLICIES))}")


def _check_information(information: str, estimator: str) -> None:
    from apportion.estimation.registry import estimator_names

    from apportion.view import INFORMATION_MODES

    if information not in INFORMATION_MODES:
        raise InputError("--information", "information", f"{information!r} is not one of "
                         f"{', '.join(INFORMATION_MODES)}")
    if estimator not in estimator_names():
        raise InputError("--estimator", "estimator", f"{estimator!r} is not one of "
                         f"{', '.join(estimator_names())} (a replay's scaling model)")


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
                  show_progress: bool = True, deterministic: bool = False,
                  tenants: Path | None = None,
                  objective_preset: str | None = None, tables: Path | None = None,
                  notify: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``apportion simulate``: replay, write the outputs, and fail loudly on a stalled replay.

    Jobs left unfinished that were neither dropped by the policy nor larger than the
    cluster stopped progressing: the outputs are written (they show the state) and
    :class:`StalledReplay` names them, so the command exits non-zero. ``tables``: the
    user's measured iteration times, the replay's truth. ``notify`` is given one line per
    substitution the trace's loading and preparation made, before the replay runs.
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
    popts = None
    if tenants is not None:
        popts = quota_options(policy, load_tenants(tenants))
        if popts is None:
            raise InputError(str(tenants), "--tenants", f"policy {policy} keeps no tenant "
                             f"quotas (those that do: {', '.join(quota_policies())})")
    popts = _with_preset({policy: popts or {}}, [policy], objective_preset).get(policy) or popts
    replay = prepare_one(trace, cluster, policy, profile, seed, popts, sim, window_days,
                         max_jobs, ground_truth, tables)  # bad input fails before anything runs
    if notify is not None:
        for line in substitution_notes(replay.trace):
            notify(line)
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


#: substitution lines shown on stderr; the summary JSON keeps every one
MAX_NOTES = 10


def substitution_notes(trace: tr.Trace) -> list[str]:
    """What the trace's loading and preparation read into it, one line each (at most
    :data:`MAX_NOTES`, then how many more the summary's ``substitutions`` holds)."""
    lines = trace.substitution_lines()
    head = f"trace {trace.name} ({trace.format} format): "
    out = [head + line for line in lines[:MAX_NOTES]]
    if len(lines) > MAX_NOTES:
        out.append(head + f"{len(lines) - MAX_NOTES} more substitutions (the summary JSON's "
                   "substitutions lists every one)")
    return out


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
                 ray_address: str | None = None, deterministic: bool = False,
                 tenants: Path | None = None, objective_preset: str | None = None,
                 tables: Path | None = None,
                 notify: Callable[[str], None] | None = None,
                 load: float | None = None) -> Path:
    """``apportion compare``: every input checked before any worker starts (the trace
    resolved as its runs will resolve it: ``notify`` gets its substitutions), then
    :func:`compare`. ``load``: the trace's arrivals that many times as fast (one row of
    ``compare --load``, :mod:`apportion.experiments.load_sweep`)."""
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
    cl = cluster_from_arg(cluster)
    resolved, _ = resolve(trace, cl, 0, window_days, tables=tables)  # fails before any worker
    if max_jobs:
        resolved = resolved.head(max_jobs)
    if notify is not None:
        for line in substitution_notes(resolved):
            notify(line)
    # the same quotas to every policy that keeps quotas; the others have none to keep
    quotas = load_tenants(tenants) if tenants is not None else None
    popts = {n: o for n in names if quotas is not None
             and (o := quota_options(n, quotas)) is not None}
    popts = _with_preset(popts, names, objective_preset)
    return compare(trace, cluster, names, seeds, out, run, profile, workers,
                   policy_options=popts or None,
                   sim_options={"information": information, "estimator": estimator,
                                "deterministic": deterministic,
                                **({} if load is None else {"load": load})},
                   window_days=window_days, max_jobs=max_jobs, engine=engine,
                   ray_address=ray_address, tables=tables, per_run_jobs=len(resolved))


def _with_preset(popts: dict[str, dict[str, Any]], names: list[str],
                 preset: str | None) -> dict[str, dict[str, Any]]:
    """``popts`` with the named objective (``--objective-preset``) for every policy of
    ``names`` whose objective is apportion's; refused by name when none of them is."""
    if preset is None:
        return popts
    out = dict(popts)
    try:
        for n in names:
            o = objective_preset_options(n, preset)
            if o is not None:
                out[n] = {**out.get(n, {}), **o}
    except ValueError as exc:
        raise InputError(preset, "--objective-preset", str(exc)) from None
    if not any(n in objective_policies() for n in names):
        raise InputError(preset, "--objective-preset", f"no policy given takes apportion's "
                         f"objective (those that do: {', '.join(objective_policies())})")
    return out


def quota_policies() -> list[str]:
    """The registered policies that keep tenants' quotas."""
    return [n for n in policy_names() if quota_options(n, {}) is not None]
