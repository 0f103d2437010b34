"""The command line: wires commands to the round loop and to the areas, nothing more.

Data goes to files and stdout; progress and logs go to stderr. Any bad input
exits with code 2 and a message naming the file and the field, and nothing is
written.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from apportion.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="apportion: joint resource allocation and execution planning for DL training.")
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
log = logging.getLogger("apportion")

EXIT_BAD_INPUT = 2


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def _fail(exc: Exception) -> None:
    from rich.markup import escape  # a value like "[/red]" in the input is text, not markup

    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True,
              soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _check_output_path(path: Optional[Path], option: str) -> None:
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(str(path), option, "is a directory; give a file name")
    if not parent.exists():
        raise InputError(str(path), option, f"directory {parent} does not exist")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _decision_table(decision: Any) -> Table:
    t = Table(title="apportion round decision", show_lines=False)
    for col in ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
                "est. throughput (samples/s)"):
        t.add_column(col, overflow="fold")
    for a in sorted(decision.allocations, key=lambda a: a.job):
        place = ", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))
        t.add_row(Text(a.job), a.action.value, a.gpu_type, str(a.gpus), str(a.stages),
                  a.plan.label(), place, f"{a.est_throughput:.2f}")  # Text: ids are not markup
    for p in sorted(decision.pending, key=lambda p: p.job):
        t.add_row(Text(p.job), (p.action.value if p.action else "pending"), "-", "-", "-", "-",
                  f"pending: {p.reason.value}", "-")
    return t


def _print_decision(decision: Any) -> None:
    """The decision table on stdout: Rich's box table, or for a big round (past 200 rows,
    where Rich spends longer laying the table out than the solver took) the same columns
    as aligned plain text."""
    rows = [(a.job, a.action.value, a.gpu_type, str(a.gpus), str(a.stages), a.plan.label(),
             ", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items())),
             f"{a.est_throughput:.2f}") for a in sorted(decision.allocations, key=lambda a: a.job)]
    rows += [(p.job, p.action.value if p.action else "pending", "-", "-", "-", "-",
              f"pending: {p.reason.value}", "-") for p in sorted(decision.pending, key=lambda p: p.job)]
    if len(rows) <= 200:
        out.print(_decision_table(decision))
        return
    head = ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
            "est. throughput (samples/s)")
    width = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-2])]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, width)) + "  " + "  ".join(r[-2:])
    sys.stdout.write("apportion round decision\n" + line(head) + "\n"
                     + "".join(line(r) + "\n" for r in rows))


def _report_lines(decision: Any) -> str:
    r = decision.report
    gap = "n/a" if r.gap is None else f"{r.gap:.2%}"
    bound = "n/a" if r.bound is None else f"{r.bound:.4f}"
    obj = "n/a" if r.objective is None else f"{r.objective:.4f}"
    lines = [f"solver: {r.backend}  status: {r.status}  objective: {obj}  bound: {bound}  "
             f"gap: {gap}  wall: {r.wall_s:.3f}s  fallback: {r.fallback}"]
    if r.fallback_reason:
        lines.append(f"fallback reason: {r.fallback_reason}")
    for a in r.attempts:
        lines.append(f"  tried {a['backend']}: {a['status']} objective={a['objective']} "
                     f"wall={a['wall_s']}s {a.get('message', '')}")
    ms = r.model_size
    if ms:
        lines.append(f"model: {ms.get('variables')} variables, {ms.get('rows')} rows; "
                     f"{ms.get('jobs')} jobs, {ms.get('cells')} cells, {ms.get('nodes')} nodes "
                     f"in {ms.get('node_classes')} classes")
    return "\n".join(lines)


POLICY_HELP = ("a registered policy (apportion, apportion-plans, apportion-deadline, sia, gavel, "
               "tiresias, ...; `apportion policies` lists them); default: the formulation's own")
ESTIMATOR_HELP = "analytic | crius | morphling | tables | auto (per job, the best with data)"
INFORMATION_HELP = ("oracle (every policy sees measured truth) | estimated (every policy sees the "
                    "same profiled measurements, extended by --estimator)")
SIM_ESTIMATOR_HELP = "the estimated mode's scaling model: analytic | crius | morphling | tables"


def _estimator_arg(name: str, tables: Optional[Path], store_samples: Any = None) -> Any:
    """The ``--estimator`` choice as an object (``tables``/``auto`` read measurements)."""
    from apportion.estimation.measured import TableEstimator
    from apportion.estimation.registry import make_estimator

    if name not in ("tables", "auto"):
        return name
    table = TableEstimator.from_csv(tables) if tables else TableEstimator()
    if store_samples is not None:
        table = TableEstimator(table.rows + store_samples.rows)
    return make_estimator(name, tables=table)


@app.command("solve-round")
def solve_round(
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML (default: Crius's testbed)"),
    jobs: Optional[Path] = typer.Option(None, "--jobs", help="jobs YAML (default: a dozen Crius jobs)"),
    time_budget: float = typer.Option(10.0, "--time-budget", min=0.01, help="solver wall-clock budget, s"),
    backend: str = typer.Option("auto", "--backend", help="auto | cp-sat | highs | lp-round | greedy"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the decision JSON here"),
    dump_problem: Optional[Path] = typer.Option(None, "--dump-problem",
                                                help="write the candidates and estimates as JSON"),
    search_depth: int = typer.Option(3, "--search-depth", min=0, help="greedy local-search depth"),
    max_changes: Optional[int] = typer.Option(None, "--max-changes", min=0,
                                              help="at most this many running jobs changed"),
    formulation: str = typer.Option("cells", "--formulation", help="cells | plans | deadline | gavel"),
    policy: Optional[str] = typer.Option(None, "--policy", help=POLICY_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=ESTIMATOR_HELP),
    tables: Optional[Path] = typer.Option(None, "--tables", help="measured iteration times CSV "
                                          "(model, gpu_type, gpus, iter_time_s) for tables/auto"),
    isolate: bool = typer.Option(True, "--isolate/--no-isolate",
                                 help="run each solver backend in a child process"),
    tenants: Optional[Path] = typer.Option(None, "--tenants",
                                           help="tenants YAML with GPU quotas (plans)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    state: Optional[Path] = typer.Option(None, "--state", help="state DB: read the queue from it "
                                         "and commit the round to it (instead of --jobs)"),
    round_key: Optional[str] = typer.Option(None, "--round-key", help="with --state: a round "
                                            "committed under this key is not redone"),
    partitions: int = typer.Option(1, "--partitions", min=1, help="> 1: a POP-style partitioned "
                                   "solve in that many parts, in parallel"),
    engine: str = typer.Option("local", "--engine", help="where a partitioned solve's parts run: "
                               "local (child processes) | ray (Ray tasks)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--engine ray: an "
                                              "existing cluster (default: a local one)"),
) -> None:
    """Solve one scheduling round: read cluster and queue, decide, validate, report."""
    started = time.perf_counter()  # the budget covers the whole command from here
    _setup_logging(verbose)
    from apportion.config import default_cluster, default_jobs, load_jobs, load_tenants, resolve_cluster
    from apportion.round import checked_config, run_round

    if state is not None:  # the queue and running jobs come from the state store
        from apportion.store_cli import solve_round_state

        def show(d: Any) -> None:
            _print_decision(d)
            err.print(_report_lines(d), highlight=False, markup=False)

        raise typer.Exit(solve_round_state(
            state, cluster, jobs, backend=backend, time_budget=time_budget,
            search_depth=search_depth, max_changes=max_changes, formulation=formulation,
            json_out=json_out, dump_problem=dump_problem, round_key=round_key, tenants=tenants,
            isolate=isolate, show=show, write_json=write_json_atomic, policy=policy,
            estimator=estimator, tables=tables))

    try:
        quotas = load_tenants(tenants) if tenants else None
        if engine not in ("local", "ray"):
            raise InputError("--engine", "engine", f"{engine!r} is not one of local, ray")
        cfg = checked_config(backend, formulation, policy, estimator, time_budget_s=time_budget,
                             search_depth=search_depth, max_changes=max_changes, quotas=quotas,
                             isolate=isolate, partitions=partitions, engine=engine,
                             ray_address=ray_address)
        cfg.estimator = _estimator_arg(estimator, tables)
        cfg.deadline_s = started + time_budget
        _check_output_path(json_out, "--json")
        _check_output_path(dump_problem, "--dump-problem")
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        jb, now = load_jobs(jobs) if jobs else default_jobs()
    except InputError as exc:
        _fail(exc)
        return
    result = run_round(cl, jb, now, cfg)
    _print_decision(result.decision)
    err.print(_report_lines(result.decision), highlight=False, markup=False)
    if json_out:
        write_json_atomic(json_out, result.decision.as_dict())
    if dump_problem:
        write_json_atomic(dump_problem, result.problem)


@app.command("policies")
def policies_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List every registered policy (usable with --policy on solve-round, run, simulate)."""
    from apportion.experiments.policies import POLICIES

    if as_json:
        sys.stdout.write(json.dumps(POLICIES, indent=2, sort_keys=True) + "\n")
        return
    t = Table(title="policies")
    t.add_column("name")
    t.add_column("what it does")
    for name, doc in sorted(POLICIES.items()):
        t.add_row(name, doc)
    out.print(t)


@app.command("models")
def models() -> None:
    """List the model catalog with parameter counts and forward FLOPs per sample."""
    from apportion.models import MODEL_NAMES, get_model

    t = Table(title="model catalog")
    for col in ("name", "family", "params (B)", "fwd GFLOP/sample", "layers"):
        t.add_column(col)
    for name in MODEL_NAMES:
        m = get_model(name)
        t.add_row(name, m.family, f"{m.params / 1e9:.3f}", f"{m.flops_per_sample / 1e9:.1f}",
                  str(len(m.layers)))
    out.print(t)


@app.command("gpus")
def gpus() -> None:
    """List the GPU catalog (vendor data-sheet figures)."""
    from apportion.gpus import gpu_catalog

    t = Table(title="GPU catalog")
    for col in ("name", "arch", "memory GiB", "16-bit TFLOP/s", "fp32 TFLOP/s", "HBM GB/s", "link"):
        t.add_column(col)
    for g in gpu_catalog().values():
        t.add_row(g.name, g.architecture, f"{g.memory_gib:g}", f"{g.half_tflops:g}",
                  f"{g.fp32_tflops:g}", f"{g.hbm_GBps:g}", f"{g.link} {g.link_GBps:g} GB/s")
    out.print(t)


# -- the state store (logic in apportion/store_cli.py; exit 2 bad input, 75 busy) --------------
@app.command("submit")
def submit(file: Path = typer.Argument(..., help="jobs YAML (the --jobs format)"),
           state: Path = typer.Option(..., "--state", help="state DB (created if missing)")) -> None:
    """Add the jobs of a YAML file to the state store, all or nothing."""
    from apportion.store_cli import submit as run

    raise typer.Exit(run(file, state))


@app.command("cancel")
def cancel(job: str = typer.Argument(..., help="job id"),
           state: Path = typer.Option(..., "--state", help="state DB")) -> None:
    """Cancel a job: it is dropped and its GPUs are free for the next round."""
    from apportion.store_cli import cancel as run

    raise typer.Exit(run(job, state))


@app.command("status")
def status(state: Path = typer.Option(..., "--state", help="state DB"),
           as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """Jobs and their lifecycle states, the queue, cluster use and node health."""
    from apportion.store_cli import status as run

    raise typer.Exit(run(state, as_json))


@app.command("history")
def history(state: Path = typer.Option(..., "--state", help="state DB"),
            as_json: bool = typer.Option(False, "--json", help="print JSON on stdout"),
            limit: Optional[int] = typer.Option(None, "--limit", min=1, help="last N rounds")) -> None:
    """Committed rounds with their solver reports."""
    from apportion.store_cli import history as run

    raise typer.Exit(run(state, as_json, limit))


@app.command("simulate")
def simulate_cmd(
    trace: str = typer.Option(..., "--trace", help="normalised CSV, Gavel .trace, or a bundled name"),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a name"),
    policy: str = typer.Option(..., "--policy", help="policy name (see apportion.experiments.policies)"),
    profile: str = typer.Option("default", "--profile", help="default | gavel"),
    seed: int = typer.Option(0, "--seed"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the summary JSON here"),
    jobs_csv: Optional[Path] = typer.Option(None, "--jobs-csv", help="write the per-job CSV here"),
    interval: Optional[float] = typer.Option(None, "--interval", min=1.0, help="round length, s"),
    restart_cost: Optional[float] = typer.Option(None, "--restart-cost", min=0.0, help="s per restart"),
    noise: float = typer.Option(0.0, "--noise", min=0.0, help="log-normal sigma on what the policy sees"),
    window_days: Optional[float] = typer.Option(None, "--window-days", min=0.01,
                                                help="raw traces: busiest window of this many days"),
    max_jobs: Optional[int] = typer.Option(None, "--max-jobs", min=1, help="first N jobs only"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=SIM_ESTIMATOR_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Replay a trace on a simulated cluster under one policy; print and write the summary."""
    _setup_logging(verbose)
    from apportion.experiments.harness import simulate_main

    try:
        _check_output_path(json_out, "--json")
        _check_output_path(jobs_csv, "--jobs-csv")
        summary = simulate_main(trace, cluster, policy, profile, seed, interval, restart_cost, noise,
                                window_days, max_jobs, json_out, jobs_csv, information, estimator)
    except InputError as exc:
        _fail(exc)
        return
    out.print_json(data=summary)


@app.command("compare")
def compare_cmd(
    trace: str = typer.Option(..., "--trace", help="normalised CSV, Gavel .trace, or a bundled name"),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a name"),
    policies: str = typer.Option(..., "--policies", help="comma-separated policy names"),
    seeds: int = typer.Option(1, "--seeds", min=1),
    profile: str = typer.Option("default", "--profile", help="default | gavel"),
    out_dir: Path = typer.Option(Path("results"), "--out", help="results root"),
    run: Optional[str] = typer.Option(None, "--run", help="run name (default: trace-cluster)"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1),
    window_days: Optional[float] = typer.Option(None, "--window-days", min=0.01),
    max_jobs: Optional[int] = typer.Option(None, "--max-jobs", min=1),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=SIM_ESTIMATOR_HELP),
    engine: str = typer.Option("local", "--engine", help="local (processes) | ray (a Ray task "
                               "per policy and seed)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--engine ray: an "
                                              "existing cluster (default: a local one)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Replay a trace under many policies and seeds in parallel; write CSV, markdown, plots."""
    _setup_logging(verbose)
    from apportion.experiments.harness import compare_main

    try:
        root = compare_main(trace, cluster, policies, seeds, profile, out_dir, run, workers,
                            window_days, max_jobs, information, estimator, engine, ray_address)
    except InputError as exc:
        _fail(exc)
        return
    out.print((root / "summary.md").read_text(), markup=False, highlight=False)
    err.print(f"results in {root}", highlight=False)


bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="benchmarks")
app.add_typer(bench_app, name="bench")


@bench_app.command("sim")
def bench_sim_cmd(
    policy: str = typer.Option("fcfs", "--policy"),
    days: float = typer.Option(14.0, "--days", min=0.1),
    time_budget: float = typer.Option(2.0, "--time-budget", min=0.05),
    max_rounds: Optional[int] = typer.Option(None, "--max-rounds", min=1),
    json_out: Optional[Path] = typer.Option(None, "--json"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
) -> None:
    """Replay speed: a two-week Philly window (10,000+ jobs) on Crius's 1,280-GPU cluster."""
    from apportion.experiments.bench.sim import main as bench_sim_main
    from apportion.view import INFORMATION_MODES

    if information not in INFORMATION_MODES:
        _fail(InputError("--information", "information", f"{information!r} is not one of "
                         f"{', '.join(INFORMATION_MODES)}"))
        return
    res = bench_sim_main(policy, days, time_budget, max_rounds, information)
    out.print_json(data=res)
    if json_out:
        write_json_atomic(json_out, res)


@bench_app.command("estimate")
def bench_estimate_cmd(
    against: str = typer.Option(..., "--against", help="morphling | crius | local"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result JSON here"),
    markdown_out: Optional[Path] = typer.Option(None, "--markdown", help="write a markdown table"),
) -> None:
    """Estimator accuracy against measured iteration times (Morphling, Crius, or this machine)."""
    from apportion.experiments.bench.estimate import markdown, run

    try:
        if against not in ("morphling", "crius", "local"):
            raise InputError("--against", "against", f"{against!r} is not one of morphling, "
                                                     "crius, local")
        _check_output_path(json_out, "--json")
        _check_output_path(markdown_out, "--markdown")
    except InputError as exc:
        _fail(exc)
        return
    res = run(against)
    out.print(markdown(res), markup=False, highlight=False)
    if json_out:
        write_json_atomic(json_out, res)
    if markdown_out:
        markdown_out.write_text(markdown(res))


@app.command("profile")
def profile_cmd(
    model: str = typer.Argument(..., help="catalog model (torch: gpt-tiny, bert-tiny, vit-tiny)"),
    backend: str = typer.Option("torch", "--backend", help="torch | jax"),
    batch: int = typer.Option(8, "--batch", min=1),
    devices: int = typer.Option(4, "--devices", min=1, help="stage width for DP/TP shards"),
    json_out: Optional[Path] = typer.Option(None, "--json"),
) -> None:
    """Profile a model's DP-only and TP-only stage shards (per-layer torch, or JAX compile)."""
    from apportion.estimation.profile_torch import profile_report

    try:
        _check_output_path(json_out, "--json")
        res = profile_report(model, backend, batch, devices)
    except InputError as exc:
        _fail(exc)
        return
    out.print_json(data=res)
    if json_out:
        write_json_atomic(json_out, res)


@app.command("estimate")
def estimate_cmd(
    job: str = typer.Option(..., "--job", help="MODEL[:GLOBAL_BATCH], e.g. bert-1.3b:256"),
    cell: str = typer.Option(..., "--cell", help="GPU_TYPE:GPUS[:STAGES], e.g. A40:8:2"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML (default testbed)"),
    estimator: str = typer.Option("all", "--estimator", help="crius | analytic | morphling | all"),
    json_out: Optional[Path] = typer.Option(None, "--json"),
) -> None:
    """Estimate one cell with the estimators and tune it (Crius 5.1-5.2)."""
    from apportion.config import default_cluster, resolve_cluster
    from apportion.estimation.tuning import estimate_report, parse_job_cell

    try:
        _check_output_path(json_out, "--json")
        spec, c = parse_job_cell(job, cell)
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        res = estimate_report(spec, c, cl, estimator)
    except InputError as exc:
        _fail(exc)
        return
    out.print_json(data=res)
    if json_out:
        write_json_atomic(json_out, res)


@app.command("run")
def run_cmd(
    executor: str = typer.Option("dry-run", "--executor", help="dry-run | local | ray | kubernetes"),
    cluster: str = typer.Option("local", "--cluster", help="FILE.yaml, a bundled name, or local"),
    state: Path = typer.Option(..., "--state", help="state DB (apportion submit creates it)"),
    interval: float = typer.Option(300.0, "--interval", help="seconds between rounds"),
    until_idle: bool = typer.Option(False, "--until-idle", help="stop once every job is done"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="stop after this many s"),
    workdir: Path = typer.Option(Path("apportion-runs"), "--workdir", help="checkpoints, logs"),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="apply manifests here"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget per round, s"),
    policy: Optional[str] = typer.Option(None, "--policy", help=POLICY_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=ESTIMATOR_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run rounds every interval: solve, apply through an executor, poll progress back."""
    _setup_logging(verbose)
    from apportion.runtime.run_command import run_command

    try:
        code = run_command(executor, cluster, state, interval, until_idle, timeout, workdir,
                           kubeconfig, time_budget, policy=policy, estimator=estimator)
    except InputError as exc:
        _fail(exc)
        return
    raise typer.Exit(code)


@app.command("solve-shards")
def solve_shards_cmd(
    units: Path = typer.Option(..., "--units", help="shard-unit problem JSON (devices, models)"),
    method: str = typer.Option("cp-sat", "--method", help="cp-sat | milp | lrtf | random"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the schedule JSON here"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Hydra: schedule shard units of several models on devices (makespan job shop)."""
    _setup_logging(verbose)
    from apportion.solvers.shards import solve_shards_file

    try:
        _check_output_path(json_out, "--json")
        result = solve_shards_file(str(units), method, time_budget)
    except InputError as exc:
        _fail(exc)
        return
    err.print(f"makespan {result['makespan']:.6g}  lower bound {result['lower_bound']:.6g}  "
              f"status {result['status']}", highlight=False, markup=False)
    if json_out:
        write_json_atomic(json_out, result)
    else:
        out.print_json(data=result)


@app.command("solve-finetune")
def solve_finetune_cmd(
    tasks: Path = typer.Option(..., "--tasks", help="fine-tuning task YAML (tasks, gains)"),
    capacity: int = typer.Option(..., "--capacity", help="GPUs available"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the answer JSON here"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """YMIR: choose normal / temporal / spatial modes and GPUs to minimise total JCT."""
    _setup_logging(verbose)
    from apportion.solvers.finetune import solve_finetune_file

    try:
        if capacity < 1:
            raise InputError("--capacity", "capacity", f"must be at least 1, got {capacity}")
        if not time_budget > 0:
            raise InputError("--time-budget", "time_budget", f"must be positive, got {time_budget}")
        _check_output_path(json_out, "--json")
        result = solve_finetune_file(str(tasks), capacity, time_budget)
    except InputError as exc:
        _fail(exc)
        return
    err.print(f"total JCT {result['total_jct']}  status {result['status']}", highlight=False,
              markup=False)
    if json_out:
        write_json_atomic(json_out, result)
    else:
        out.print_json(data=result)


@bench_app.command("solve")
def bench_solve_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
    budget: float = typer.Option(5.0, "--time-budget", help="per-backend budget, s"),
    quick: bool = typer.Option(False, "--quick", help="three sizes instead of the full grid"),
    backends: str = typer.Option("highs,cp-sat,chain", "--backends", help="comma-separated"),
    seed: int = typer.Option(0, "--seed"),
    peers: bool = typer.Option(False, "--peers", help="apportion, Gavel's LPs, POP-2/4/8, Sia's "
                               "ILP and Crius's greedy on the same rounds (1,000-10,000 jobs)"),
    sizes: Optional[str] = typer.Option(None, "--sizes", help="--peers: comma-separated job "
                                        "counts (default 1000,2000,5000,10000)"),
) -> None:
    """Solve time and gap of the cell round vs jobs, GPUs and GPU types, per backend."""
    from apportion.experiments.bench.solve import DEFAULT_GRID, QUICK_GRID, markdown, run_bench

    if peers:
        from apportion.experiments.bench import peers as pb

        try:
            _check_output_path(json_out, "--json")
            ns = tuple(int(x) for x in sizes.split(",")) if sizes else \
                ((1000,) if quick else pb.PEER_SIZES)
            if any(n < 1 for n in ns):
                raise ValueError
        except ValueError:
            _fail(InputError("--sizes", "sizes", f"{sizes!r}: give positive job counts"))
            return
        except InputError as exc:
            _fail(exc)
            return
        rows = pb.bench_peers(ns, budget_s=budget, seed=seed if seed else 1)
        out.print(pb.markdown(rows, budget), markup=False, highlight=False)
        if json_out:
            write_json_atomic(json_out, rows)
        return
    try:
        _check_output_path(json_out, "--json")
        names = [b.strip() for b in backends.split(",") if b.strip()]
        bad = [b for b in names if b not in ("highs", "cp-sat", "chain")]
        if bad or not names:
            raise InputError("--backends", "backends", f"unknown {bad}; use highs, cp-sat, chain")
    except InputError as exc:
        _fail(exc)
        return
    rows = run_bench(QUICK_GRID if quick else DEFAULT_GRID, names, budget, seed)
    out.print(markdown(rows), markup=False, highlight=False)
    if json_out:
        write_json_atomic(json_out, rows)


@bench_app.command("round")
def bench_round_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="runs per case"),
    seed: int = typer.Option(1, "--seed", help="the held-out rounds' seed"),
    case: Optional[list[str]] = typer.Option(None, "--case", help="JOBS:GPUS:BUDGET[:PARTS"
                                             "[:ENGINE]] (repeatable; default: the targets)"),
) -> None:
    """The whole solve-round command on held-out rounds: wall and CPU time, gap, load."""
    from apportion.experiments.bench import rounds

    try:
        _check_output_path(json_out, "--json")
        cases = None
        if case:
            cases = []
            for c in case:
                f = c.split(":")
                if len(f) < 3 or f[4:5] not in ([], ["local"], ["ray"]):
                    raise InputError("--case", "case", f"{c!r}: JOBS:GPUS:BUDGET[:PARTS[:ENGINE]]")
                cases.append((int(f[0]), int(f[1]), 4, float(f[2]), int(f[3]) if len(f) > 3
                              else 1, f[4] if len(f) > 4 else "local"))
    except ValueError:
        _fail(InputError("--case", "case", "numbers expected: JOBS:GPUS:BUDGET[:PARTS[:ENGINE]]"))
        return
    except InputError as exc:
        _fail(exc)
        return
    rows = rounds.main(cases, seed, repeat)
    out.print(rounds.markdown(rows), markup=False, highlight=False)
    if json_out:
        write_json_atomic(json_out, rows)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
