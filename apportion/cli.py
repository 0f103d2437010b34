"""The command line: wires commands to the round loop and to the areas, nothing more.

Data goes to files and stdout; progress and logs go to stderr. Any bad input
exits with code 2 and a message naming the file and the field, and nothing is
written. Every output option goes through :mod:`apportion.outputs` (``-`` is
stdout; devices and pipes are written in place; files are replaced atomically),
checked before any work. Any other failure is one line on stderr (exit 2, or 75
for "try again later", 1 for a bug); the traceback only with ``-v``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from apportion import __version__, outputs
from apportion.console import (
    printable,
    setup_logging,
    stderr_console,
    stdout_console,
    verbose_requested,
)
from apportion.errors import HostError, InputError

log = logging.getLogger("apportion")

EXIT_BAD_INPUT = 2
EXIT_BUSY = 75
EXIT_BUG = 1


def _uncaught(exc: BaseException) -> int:
    """One line for an error no command handled; the exit code."""
    from apportion.store import StoreBusy, store_error

    if isinstance(exc, sqlite3.Error):
        exc = store_error(exc, getattr(exc, "path", "the state database"))
    if isinstance(exc, OSError) and not isinstance(exc, InputError):
        from apportion.env import data_root

        name = str(exc.filename or "a file")
        hint = (" (a data set: set APPORTION_DATA to the folder of the data sets)"
                if isinstance(exc, FileNotFoundError) and name.startswith(str(data_root()))
                else "")
        exc = HostError.from_os_error(exc, name + hint)
    err = stderr_console()
    if isinstance(exc, StoreBusy):
        err.print(f"busy: {printable(exc)}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_BUSY
    if isinstance(exc, HostError):
        err.print(f"error: {printable(exc)}", highlight=False, markup=False, soft_wrap=True)
        return exc.exit_code
    if isinstance(exc, InputError):
        err.print(f"error: {printable(exc)}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    err.print(f"error: internal error ({type(exc).__name__}: {printable(exc)}); run it again "
              "with -v for the traceback, and please report it", highlight=False, markup=False,
              soft_wrap=True)
    return EXIT_BUG


class _Commands(TyperGroup):
    """The top-level handler: whatever a command raises becomes one line and an exit code
    (tracebacks only with ``-v``/``--verbose`` or ``APPORTION_LOG=DEBUG``)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            return super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=standalone_mode, **extra)
        except Exception as exc:
            if not standalone_mode:
                raise
            if verbose_requested(argv):
                traceback.print_exception(exc, file=sys.stderr)
                code = EXIT_BUG
            else:
                code = _uncaught(exc)
            sys.exit(code)


app = typer.Typer(cls=_Commands, add_completion=True, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="apportion: joint resource allocation and execution planning for DL "
                       "training. Environment: APPORTION_DATA (the real data sets), "
                       "APPORTION_CACHE (profile cache), APPORTION_LOG (log level), "
                       "APPORTION_PROGRESS_S (seconds between progress lines).")


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"apportion {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the version and exit"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr, for every command"),
) -> None:
    """apportion: joint resource allocation and execution planning for DL training."""
    setup_logging(verbose)


def _setup_logging(verbose: bool) -> None:
    setup_logging(verbose)


def _fail(exc: Exception) -> None:
    from rich.markup import escape  # a value like "[/red]" in the input is text, not markup

    code = exc.exit_code if isinstance(exc, HostError) else EXIT_BAD_INPUT
    stderr_console().print(f"[bold red]error:[/] {escape(printable(exc))}", highlight=False,
                           markup=True, soft_wrap=True)
    raise typer.Exit(code)


def write_json_atomic(path: Path, data: Any) -> None:
    """Kept for callers of the old name: :func:`apportion.outputs.write_json`."""
    outputs.write_json(path, data)


def _check_finite(value: float | None, option: str, minimum: float = 0.0) -> None:
    """A float option must be a number above ``minimum`` (typer lets nan and inf through)."""
    if value is not None and not (math.isfinite(value) and value > minimum):
        raise InputError(option, option.lstrip("-").replace("-", "_"),
                         f"must be a finite number > {minimum:g}, got {value}")


MIP_GAP_HELP = ("an answer within this relative gap of the best proven bound is final "
                "(default 1e-3: the solver chain tries LP rounding first); below 1e-3 "
                "HiGHS goes first and the chain works for the last 0.1 %")


def _print_json(data: Any) -> None:
    """JSON on stdout, for commands whose result is the JSON (escaped like every output)."""
    outputs.write_json(outputs.STDOUT, data)


def _decision_table(decision: Any) -> Table:
    t = Table(title="apportion round decision", show_lines=False)
    for col in ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
                "est. throughput (samples/s)"):
        t.add_column(col, overflow="fold")
    for a in sorted(decision.allocations, key=lambda a: a.job):
        place = ", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))
        t.add_row(Text(printable(a.job, False)), a.action.value, a.gpu_type, str(a.gpus),
                  str(a.stages), a.plan.label(), printable(place), f"{a.est_throughput:.2f}")
    for p in sorted(decision.pending, key=lambda p: p.job):
        t.add_row(Text(printable(p.job, False)), (p.action.value if p.action else "pending"),
                  "-", "-", "-", "-", f"pending: {p.reason.value}", "-")
    return t


def _decision_rows(decision: Any) -> list[tuple[str, ...]]:
    rows = [(printable(a.job, False), a.action.value, a.gpu_type, str(a.gpus), str(a.stages),
             a.plan.label(), printable(", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))),
             f"{a.est_throughput:.2f}") for a in sorted(decision.allocations, key=lambda a: a.job)]
    rows += [(printable(p.job, False), p.action.value if p.action else "pending", "-", "-", "-",
              "-", f"pending: {p.reason.value}", "-")
             for p in sorted(decision.pending, key=lambda p: p.job)]
    return rows


def _plain_decision(rows: list[tuple[str, ...]], stream: Any) -> None:
    """The decision table's columns as aligned plain text: for a big round (past 200 rows),
    where Rich spends longer laying the table out than the solver took."""
    head = ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
            "est. throughput (samples/s)")
    width = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-2])]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, width)) + "  " + "  ".join(r[-2:])

    stream.write("apportion round decision\n" + line(head) + "\n"
                 + "".join(line(r) + "\n" for r in rows))
    stream.flush()


def _report_lines(decision: Any) -> str:
    r = decision.report
    gap = "n/a" if r.gap is None else f"{r.gap:.2%}"
    bound = "n/a" if r.bound is None else f"{r.bound:.4f}"
    obj = "n/a" if r.objective is None else f"{r.objective:.4f}"
    lines = [(f"solver: {r.backend}  status: {r.status}  objective: {obj}  bound: {bound}  "
              f"gap: {gap}  wall: {r.wall_s:.3f}s  fallback: {r.fallback}")]
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
    return printable("\n".join(lines))


def _show_decision(decision: Any, data_on_stdout: bool) -> None:
    """The decision table on stdout (stderr when an output option is ``-``), the solver
    report on stderr."""
    rows = _decision_rows(decision)
    if len(rows) > 200:
        _plain_decision(rows, sys.stderr if data_on_stdout else sys.stdout)
    else:
        console = stderr_console() if data_on_stdout else stdout_console()
        console.print(_decision_table(decision))
    stderr_console().print(_report_lines(decision), highlight=False, markup=False)


def _cluster_help() -> str:
    from apportion.config import cluster_names_help

    return cluster_names_help()


POLICY_HELP = ("a registered policy (apportion, apportion-plans, apportion-deadline, sia, gavel, "
               "tiresias, ...; `apportion policies` lists them); default: the formulation's own")
ESTIMATOR_HELP = "analytic | crius | morphling | tables | auto (per job, the best with data)"
INFORMATION_HELP = ("oracle (every policy sees measured truth) | estimated (every policy sees the "
                    "same profiled measurements, extended by --estimator)")
SIM_ESTIMATOR_HELP = "the estimated mode's scaling model: analytic | crius | morphling | tables"


@app.command("solve-round")
def solve_round(
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML or a bundled "
                                           "name (default: Crius's testbed); bundled: "
                                           + _cluster_help()),
    jobs: Optional[Path] = typer.Option(None, "--jobs", help="jobs YAML (default: a dozen Crius jobs)"),
    time_budget: float = typer.Option(10.0, "--time-budget", min=0.01, help="solver wall-clock budget, s"),
    backend: str = typer.Option("auto", "--backend", help="auto | cp-sat | highs | lp-round | scip | greedy"),
    mip_gap: float = typer.Option(1e-3, "--mip-gap", help=MIP_GAP_HELP),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the decision JSON here "
                                            "(- for stdout)"),
    dump_problem: Optional[Path] = typer.Option(None, "--dump-problem", readable=False,
                                                help="write the candidates and estimates as JSON "
                                                     "(- for stdout)"),
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
    from apportion.config import (
        check_running,
        default_cluster,
        default_jobs,
        load_jobs,
        load_tenants,
        resolve_cluster,
    )
    from apportion.policies import check_round_flags, checked_config, estimator_from, run_round

    try:
        check_round_flags(formulation=formulation, policy=policy, estimator=estimator,
                          tables=tables, tenants=tenants, engine=engine,
                          ray_address=ray_address, state=state, round_key=round_key)
    except InputError as exc:
        _fail(exc)
    data_on_stdout = outputs.any_stdout(json_out, dump_problem)
    if state is not None:  # the queue and running jobs come from the store
        from apportion.store_cli import solve_round_state

        raise typer.Exit(solve_round_state(
            state, cluster, jobs, backend=backend, time_budget=time_budget,
            search_depth=search_depth, max_changes=max_changes, formulation=formulation,
            json_out=json_out, dump_problem=dump_problem, round_key=round_key, tenants=tenants,
            isolate=isolate, show=lambda d: _show_decision(d, data_on_stdout), policy=policy,
            estimator=estimator, tables=tables, mip_gap=mip_gap))

    try:
        _check_finite(time_budget, "--time-budget")
        quotas = load_tenants(tenants) if tenants else None
        if engine not in ("local", "ray"):
            raise InputError("--engine", "engine", f"{engine!r} is not one of local, ray")
        cfg = checked_config(backend, formulation, policy, estimator, time_budget_s=time_budget,
                             search_depth=search_depth, max_changes=max_changes, quotas=quotas,
                             isolate=isolate, partitions=partitions, engine=engine,
                             ray_address=ray_address, mip_gap=mip_gap)
        cfg.estimator = estimator_from(estimator, tables)
        cfg.deadline_s = started + time_budget
        outputs.check_outputs((json_out, "--json"), (dump_problem, "--dump-problem"))
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        jb, now = load_jobs(jobs) if jobs else default_jobs()
        check_running(jb, cl, str(jobs) if jobs else "<embedded default jobs>")
    except InputError as exc:
        _fail(exc)
        return
    result = run_round(cl, jb, now, cfg)
    _show_decision(result.decision, data_on_stdout)
    if json_out:
        outputs.write_json(json_out, result.decision.as_dict(), "--json")
    if dump_problem:
        outputs.write_json(dump_problem, result.problem, "--dump-problem")


@app.command("policies")
def policies_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List every registered policy (usable with --policy on solve-round, run, simulate)."""
    from apportion.policies import POLICIES

    if as_json:
        import json

        sys.stdout.write(json.dumps(POLICIES, indent=2, sort_keys=True) + "\n")
        return
    t = Table(title="policies")
    t.add_column("name")
    t.add_column("what it does")
    for name, doc in sorted(POLICIES.items()):
        t.add_row(name, doc)
    stdout_console().print(t)


@app.command("models")
def models(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List the model catalog with parameter counts and forward FLOPs per sample."""
    from apportion.models import MODEL_NAMES, get_model

    rows = []
    for name in MODEL_NAMES:
        m = get_model(name)
        rows.append({"name": name, "family": m.family, "params": m.params,
                     "flops_per_sample": m.flops_per_sample, "layers": len(m.layers)})
    if as_json:
        _print_json({"models": rows})
        return
    t = Table(title="model catalog")
    for col in ("name", "family", "params (B)", "fwd GFLOP/sample", "layers"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["family"], f"{r['params'] / 1e9:.3f}",
                  f"{r['flops_per_sample'] / 1e9:.1f}", str(r["layers"]))
    stdout_console().print(t)


@app.command("gpus")
def gpus(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List the GPU catalog (vendor data-sheet figures)."""
    from apportion.gpus import gpu_catalog

    rows = [{"name": g.name, "architecture": g.architecture, "memory_gib": g.memory_gib,
             "half_tflops": g.half_tflops, "fp32_tflops": g.fp32_tflops, "hbm_GBps": g.hbm_GBps,
             "link": g.link, "link_GBps": g.link_GBps} for g in gpu_catalog().values()]
    if as_json:
        _print_json({"gpus": rows})
        return
    t = Table(title="GPU catalog")
    for col in ("name", "arch", "memory GiB", "16-bit TFLOP/s", "fp32 TFLOP/s", "HBM GB/s", "link"):
        t.add_column(col)
    for g in rows:
        t.add_row(g["name"], g["architecture"], f"{g['memory_gib']:g}", f"{g['half_tflops']:g}",
                  f"{g['fp32_tflops']:g}", f"{g['hbm_GBps']:g}", f"{g['link']} {g['link_GBps']:g} GB/s")
    stdout_console().print(t)


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
    """Jobs and their lifecycle states (a waiting job with its reason), the queue, cluster use
    and node health. Needs only read access to the store."""
    from apportion.store_cli import status as run

    raise typer.Exit(run(state, as_json))


@app.command("history")
def history(state: Path = typer.Option(..., "--state", help="state DB"),
            as_json: bool = typer.Option(False, "--json", help="print JSON on stdout"),
            limit: Optional[int] = typer.Option(None, "--limit", min=1, help="last N rounds")) -> None:
    """Committed rounds with their solver reports."""
    from apportion.store_cli import history as run

    raise typer.Exit(run(state, as_json, limit))


DETERMINISTIC_HELP = ("count the optimising policies' solver budgets in work, not seconds: "
                      "the replay repeats exactly on any machine under any load (the "
                      "clock stays a safety stop at 4x the budget; the summary counts "
                      "the rounds it cut short)")


@app.command("simulate")
def simulate_cmd(
    trace: str = typer.Option(..., "--trace", help="normalised CSV, Gavel .trace, or a bundled name"),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a "
                                "bundled name: " + _cluster_help()),
    policy: str = typer.Option(..., "--policy", help="policy name (see apportion.policies)"),
    profile: str = typer.Option("default", "--profile", help="default | gavel"),
    seed: int = typer.Option(0, "--seed"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the summary JSON here "
                                            "(- for stdout)"),
    jobs_csv: Optional[Path] = typer.Option(None, "--jobs-csv", readable=False,
                                            help="write the per-job CSV here "
                                            "(- for stdout)"),
    interval: Optional[float] = typer.Option(None, "--interval", min=1.0, help="round length, s"),
    restart_cost: Optional[float] = typer.Option(None, "--restart-cost", min=0.0, help="s per restart"),
    noise: float = typer.Option(0.0, "--noise", min=0.0, help="log-normal sigma on what the policy sees"),
    window_days: Optional[float] = typer.Option(None, "--window-days", min=0.01,
                                                help="raw traces: busiest window of this many days"),
    max_jobs: Optional[int] = typer.Option(None, "--max-jobs", min=1, help="first N jobs only"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=SIM_ESTIMATOR_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    truth: str = typer.Option("auto", "--truth", help="ground truth: auto (from the trace's "
                              "detected format) | gavel | crius | morphling | elasticflow | "
                              "analytic"),
    deterministic: bool = typer.Option(False, "--deterministic", help=DETERMINISTIC_HELP),
) -> None:
    """Replay a trace on a simulated cluster under one policy; print and write the summary.

    Exits 1, naming them, when jobs stopped progressing (the outputs are still written)."""
    _setup_logging(verbose)
    from apportion.experiments.harness import StalledReplay, simulate_main

    try:
        outputs.check_outputs((json_out, "--json"), (jobs_csv, "--jobs-csv"))
        _check_finite(interval, "--interval")
        _check_finite(restart_cost, "--restart-cost", -1e-300)
        _check_finite(noise, "--noise", -1e-300)
        _check_finite(window_days, "--window-days")
        summary = simulate_main(trace, cluster, policy, profile, seed, interval, restart_cost, noise,
                                window_days, max_jobs, json_out, jobs_csv, information, estimator,
                                truth, deterministic=deterministic)
    except InputError as exc:
        _fail(exc)
        return
    except StalledReplay as exc:
        if not outputs.any_stdout(json_out, jobs_csv):
            _print_json(exc.summary)
        stderr_console().print(f"error: {printable(exc)}", highlight=False, markup=False,
                               soft_wrap=True)
        raise typer.Exit(EXIT_BUG) from None
    if not outputs.any_stdout(json_out, jobs_csv):
        _print_json(summary)


@app.command("compare")
def compare_cmd(
    trace: str = typer.Option(..., "--trace", help="normalised CSV, Gavel .trace, or a bundled name"),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a "
                                "bundled name: " + _cluster_help()),
    policies: str = typer.Option(..., "--policies", help="comma-separated policy names"),
    seeds: int = typer.Option(1, "--seeds", min=1),
    profile: str = typer.Option("default", "--profile", help="default | gavel"),
    out_dir: Path = typer.Option(Path("results"), "--out", help="results root (a folder)"),
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
    deterministic: bool = typer.Option(False, "--deterministic", help=DETERMINISTIC_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Replay a trace under many policies and seeds in parallel; write CSV, markdown, plots."""
    _setup_logging(verbose)
    from apportion.experiments.harness import compare_main

    try:
        outputs.check_output_dir(out_dir, "--out")
        _check_finite(window_days, "--window-days")
        root = compare_main(trace, cluster, policies, seeds, profile, out_dir, run, workers,
                            window_days, max_jobs, information, estimator, engine, ray_address,
                            deterministic=deterministic)
    except InputError as exc:
        _fail(exc)
        return
    stdout_console().print((root / "summary.md").read_text(), markup=False, highlight=False)
    stderr_console().print(f"results in {printable(root)}", highlight=False, markup=False)


bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="benchmarks")
app.add_typer(bench_app, name="bench")


@bench_app.command("sim")
def bench_sim_cmd(
    policy: str = typer.Option("fcfs", "--policy"),
    days: float = typer.Option(14.0, "--days", min=0.1),
    time_budget: float = typer.Option(2.0, "--time-budget", min=0.05),
    max_rounds: Optional[int] = typer.Option(None, "--max-rounds", min=1),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    mip_gap: float = typer.Option(1e-3, "--mip-gap", help=MIP_GAP_HELP),
) -> None:
    """Replay speed: a two-week Philly window (10,000+ jobs) on Crius's 1,280-GPU cluster."""
    from apportion.console import Progress
    from apportion.experiments.bench.sim import check_policy
    from apportion.experiments.bench.sim import main as bench_sim_main
    from apportion.policies import check_mip_gap
    from apportion.view import INFORMATION_MODES

    try:
        outputs.check_outputs((json_out, "--json"))
        _check_finite(days, "--days")
        _check_finite(time_budget, "--time-budget")
        check_mip_gap(mip_gap)
        check_policy(policy)
        if information not in INFORMATION_MODES:
            raise InputError("--information", "information", f"{information!r} is not one of "
                             f"{', '.join(INFORMATION_MODES)}")
    except InputError as exc:
        _fail(exc)
        return
    with Progress(f"bench sim {policy}", heartbeat=True):
        res = bench_sim_main(policy, days, time_budget, max_rounds, information, mip_gap)
    if not outputs.is_stdout(json_out):
        _print_json(res)
    if json_out:
        outputs.write_json(json_out, res, "--json")


@bench_app.command("estimate")
def bench_estimate_cmd(
    against: str = typer.Option(..., "--against", help="morphling | crius | local"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the result JSON here "
                                            "(- for stdout)"),
    markdown_out: Optional[Path] = typer.Option(None, "--markdown", readable=False,
                                                help="write a markdown table "
                                                "(- for stdout)"),
) -> None:
    """Estimator accuracy against measured iteration times (Morphling, Crius, or this machine).

    The measured data comes from $APPORTION_DATA (default: ../shared/data beside the
    repository)."""
    from apportion.console import Progress
    from apportion.experiments.bench.estimate import markdown, run

    try:
        if against not in ("morphling", "crius", "local"):
            raise InputError("--against", "against", f"{against!r} is not one of morphling, "
                                                     "crius, local")
        outputs.check_outputs((json_out, "--json"), (markdown_out, "--markdown"))
    except InputError as exc:
        _fail(exc)
        return
    with Progress(f"bench estimate --against {against}", heartbeat=True):
        res = run(against)
    if not outputs.any_stdout(json_out, markdown_out):
        stdout_console().print(markdown(res), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, res, "--json")
    if markdown_out:
        outputs.write_text(markdown_out, markdown(res), "--markdown")


@app.command("profile")
def profile_cmd(
    model: str = typer.Argument(..., help="catalog model (torch: gpt-tiny, bert-tiny, vit-tiny)"),
    backend: str = typer.Option("torch", "--backend", help="torch | jax"),
    batch: int = typer.Option(8, "--batch", min=1),
    devices: int = typer.Option(4, "--devices", min=1, help="stage width for DP/TP shards"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
) -> None:
    """Profile a model's DP-only and TP-only stage shards (per-layer torch, or JAX compile)."""
    from apportion.console import Progress
    from apportion.estimation.profilers.profile_torch import check_profile_args, profile_report

    try:
        outputs.check_outputs((json_out, "--json"))
        check_profile_args(model, backend, batch, devices)
        with Progress(f"profile {model} ({backend})", heartbeat=True):
            res = profile_report(model, backend, batch, devices)
    except InputError as exc:
        _fail(exc)
        return
    if not outputs.is_stdout(json_out):
        _print_json(res)
    if json_out:
        outputs.write_json(json_out, res, "--json")


@app.command("estimate")
def estimate_cmd(
    job: str = typer.Option(..., "--job", help="MODEL[:GLOBAL_BATCH], e.g. bert-1.3b:256"),
    cell: str = typer.Option(..., "--cell", help="GPU_TYPE:GPUS[:STAGES], e.g. A40:8:2"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML or a bundled "
                                           "name (default testbed): " + _cluster_help()),
    estimator: str = typer.Option("all", "--estimator", help="crius | analytic | morphling | all"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
) -> None:
    """Estimate one cell with the estimators and tune it (Crius 5.1-5.2)."""
    from apportion.config import default_cluster, resolve_cluster
    from apportion.estimation.models.tuning import estimate_report, parse_job_cell

    try:
        outputs.check_outputs((json_out, "--json"))
        spec, c = parse_job_cell(job, cell)
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        res = estimate_report(spec, c, cl, estimator)
    except InputError as exc:
        _fail(exc)
        return
    if not outputs.is_stdout(json_out):
        _print_json(res)
    if json_out:
        outputs.write_json(json_out, res, "--json")


@app.command("run")
def run_cmd(
    executor: str = typer.Option("dry-run", "--executor", help="dry-run | local | slurm | ray | kubernetes"),
    cluster: str = typer.Option("local", "--cluster", help="FILE.yaml, local, or a bundled "
                                "name: " + _cluster_help()),
    state: Path = typer.Option(..., "--state", help="state DB (apportion submit creates it)"),
    interval: float = typer.Option(300.0, "--interval", help="seconds between rounds"),
    until_idle: bool = typer.Option(False, "--until-idle", help="stop once every job is done"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="stop after this many s"),
    workdir: Path = typer.Option(Path("apportion-runs"), "--workdir", help="checkpoints, logs"),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", help="apply manifests here "
                                             "(in-cluster: the pod's service account)"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget per round, s"),
    policy: Optional[str] = typer.Option(None, "--policy", help=POLICY_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=ESTIMATOR_HELP),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="kubernetes settings "
                                              "YAML (namespace, image, PVC, queue, priorities)"),
    drain: bool = typer.Option(False, "--drain", help="kubernetes: on stop, suspend (checkpoint) "
                               "every job instead of leaving them running"),
    checkpoint_every: Optional[int] = typer.Option(
        None, "--checkpoint-every", help="periodic checkpoints every N iterations (0: off; "
        "default off; a job's workload.checkpoint_every wins)"),
    checkpoint_interval: Optional[float] = typer.Option(
        None, "--checkpoint-interval", help="... or every S seconds (0: off; default 120)"),
    max_retries: int = typer.Option(3, "--max-retries", help="relaunches of a failing job "
                                    "without a new checkpoint before it is failed"),
    grace_period: float = typer.Option(120.0, "--grace-period", help="seconds a stopped "
                                       "workload has to checkpoint and exit before SIGKILL"),
    orphans: str = typer.Option("adopt", "--orphans", help="workers a killed run left: "
                                "adopt | stop"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS",
                                              help="join this Ray cluster (--executor ray)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run rounds every interval: solve, apply through an executor, poll progress back."""
    _setup_logging(verbose)
    from apportion.runtime.run_command import run_command

    try:
        _check_finite(interval, "--interval")
        _check_finite(timeout, "--timeout")
        _check_finite(time_budget, "--time-budget")
        outputs.check_output_dir(workdir, "--workdir")
        code = run_command(executor, cluster, state, interval, until_idle, timeout, workdir,
                           kubeconfig, time_budget, k8s_config, drain, policy=policy,
                           estimator=estimator, checkpoint_every=checkpoint_every,
                           checkpoint_interval_s=checkpoint_interval, max_retries=max_retries,
                           grace_period_s=grace_period, orphans=orphans,
                           ray_address=ray_address if executor == "ray" else None)
    except InputError as exc:
        _fail(exc)
        return
    raise typer.Exit(code)


cluster_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="describe a real cluster (Slurm, Ray, Kubernetes) as a cluster YAML")
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("import")
def cluster_import_cmd(
    source: str = typer.Option(..., "--from", help="slurm | ray | k8s"),
    nodes_file: Optional[Path] = typer.Argument(None, help="k8s: NODES.json (kubectl get nodes "
                                                "-o json); slurm: saved `scontrol show node -o` "
                                                "text (default: ask scontrol)"),
    out_file: str = typer.Option(..., "--out", help="cluster YAML to write (- for stdout)"),
    gpu_map: Optional[Path] = typer.Option(None, "--gpu-map", help="YAML: raw GPU name -> "
                                           "catalog name (extends the built-in table)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="with --from ray"),
    name: Optional[str] = typer.Option(None, "--name", help="cluster name (default SOURCE-cluster)"),
    include_unavailable: bool = typer.Option(False, "--include-unavailable",
                                             help="keep drained / down nodes"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Write a cluster YAML from a Slurm, Ray or Kubernetes cluster, real node names kept."""
    _setup_logging(verbose)
    from apportion.runtime.cluster_import import import_cluster

    try:
        doc = import_cluster(source, out_file, nodes_file, ray_address, gpu_map, name,
                             include_unavailable)
    except InputError as exc:
        _fail(exc)
        return
    groups = doc["node_groups"]
    gpus: dict[str, int] = {}
    for g in groups:
        gpus[g["gpu_type"]] = gpus.get(g["gpu_type"], 0) + g["gpus_per_node"] * len(g["nodes"])
    stderr_console().print(f"{'stdout' if out_file == '-' else out_file}: {len(groups)} node groups, "
              f"{sum(len(g['nodes']) for g in groups)} nodes, GPUs "
              + ", ".join(f"{k} x{v}" for k, v in sorted(gpus.items())),
              highlight=False, markup=False)


@app.command("solve-shards")
def solve_shards_cmd(
    units: Path = typer.Option(..., "--units", help="shard-unit problem JSON (devices, models)"),
    method: str = typer.Option("cp-sat", "--method", help="cp-sat | milp | lrtf | random"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the schedule JSON here "
                                            "(- for stdout; default stdout)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Hydra: schedule shard units of several models on devices (makespan job shop)."""
    _setup_logging(verbose)
    from apportion.solvers.shards import solve_shards_file

    try:
        outputs.check_outputs((json_out, "--json"))
        result = solve_shards_file(str(units), method, time_budget)
    except InputError as exc:
        _fail(exc)
        return
    stderr_console().print(f"makespan {result['makespan']:.6g}  lower bound "
                           f"{result['lower_bound']:.6g}  status {result['status']}",
                           highlight=False, markup=False)
    outputs.write_json(json_out or outputs.STDOUT, result, "--json")


@app.command("solve-finetune")
def solve_finetune_cmd(
    tasks: Path = typer.Option(..., "--tasks", help="fine-tuning task YAML (tasks, gains)"),
    capacity: int = typer.Option(..., "--capacity", help="GPUs available"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the answer JSON here "
                                            "(- for stdout; default stdout)"),
    gains: str = typer.Option("file", "--gains", help="file: the task file's gains; auto: "
                              "also Task2Vec-predicted gains from each task's `data` samples"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """YMIR: choose normal / temporal / spatial modes and GPUs to minimise total JCT."""
    _setup_logging(verbose)
    from apportion.solvers.finetune import solve_finetune_file

    try:
        if capacity < 1:
            raise InputError("--capacity", "capacity", f"must be at least 1, got {capacity}")
        _check_finite(time_budget, "--time-budget")
        outputs.check_outputs((json_out, "--json"))
        result = solve_finetune_file(str(tasks), capacity, time_budget, gains)
    except InputError as exc:
        _fail(exc)
        return
    err = stderr_console()
    for tid, why in result.get("gains_auto", {}).get("unavailable", {}).items():
        err.print(f"--gains auto: no gains for task {printable(tid)}: {why}", highlight=False,
                  markup=False)
    note = result.get("gains_auto", {}).get("gain_map", {}).get("note")
    if note:
        err.print(f"--gains auto: {note}", highlight=False, markup=False)
    err.print(f"total JCT {result['total_jct']}  status {result['status']}",
              highlight=False, markup=False)
    outputs.write_json(json_out or outputs.STDOUT, result, "--json")


@bench_app.command("solve")
def bench_solve_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the rows as JSON "
                                            "(- for stdout)"),
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
    from apportion.console import Progress
    from apportion.experiments.bench.solve import DEFAULT_GRID, QUICK_GRID, markdown, run_bench

    if peers:
        from apportion.experiments.bench import peers as pb

        try:
            outputs.check_outputs((json_out, "--json"))
            _check_finite(budget, "--time-budget")
            ns = pb.parse_sizes(sizes, quick)
        except InputError as exc:
            _fail(exc)
            return
        with Progress("bench solve --peers", heartbeat=True):
            rows = pb.bench_peers(ns, budget_s=budget, seed=seed if seed else 1)
        if not outputs.is_stdout(json_out):
            stdout_console().print(pb.markdown(rows, budget), markup=False, highlight=False)
        if json_out:
            outputs.write_json(json_out, rows, "--json")
        return
    try:
        outputs.check_outputs((json_out, "--json"))
        _check_finite(budget, "--time-budget")
        names = [b.strip() for b in backends.split(",") if b.strip()]
        bad = [b for b in names if b not in ("highs", "cp-sat", "chain")]
        if bad or not names:
            raise InputError("--backends", "backends", f"unknown {bad}; use highs, cp-sat, chain")
    except InputError as exc:
        _fail(exc)
        return
    grid = QUICK_GRID if quick else DEFAULT_GRID
    with Progress("bench solve", heartbeat=True):
        rows = run_bench(grid, names, budget, seed)
    if not outputs.is_stdout(json_out):
        stdout_console().print(markdown(rows), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, rows, "--json")


# -- Kubernetes: manifests and Kueue objects (logic in runtime/executors/k8s_export.py) ---------------------
export_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="write objects for other systems to apply")
app.add_typer(export_app, name="export")


@export_app.command("k8s")
def export_k8s_cmd(
    decision: Path = typer.Option(..., "--decision", help="decision JSON (solve-round --json)"),
    cluster: str = typer.Option(..., "--cluster", help="cluster YAML or a bundled name"),
    jobs: Path = typer.Option(..., "--jobs", help="jobs YAML the decision was solved for"),
    out_dir: Path = typer.Option(..., "--out", help="directory for the YAML files"),
    api: Optional[str] = typer.Option(None, "--api", help="trainjob (default) | jobset | pytorchjob"),
    queue: Optional[str] = typer.Option(None, "--queue", help="Kueue LocalQueue for every job"),
    queue_per_tenant: bool = typer.Option(False, "--queue-per-tenant",
                                          help="each job in its tenant's LocalQueue (export kueue)"),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="namespace (default: default)"),
    image: Optional[str] = typer.Option(None, "--image", help="worker image"),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="settings YAML"),
    skip_unsupported: bool = typer.Option(False, "--skip-unsupported",
                                          help="write the others when a plan or placement "
                                               "cannot be expressed"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """One TrainJob / JobSet / PyTorchJob per allocation, pinned to the decision's nodes."""
    _setup_logging(verbose)
    from apportion.runtime.executors.k8s_config import load_k8s_config
    from apportion.runtime.executors.k8s_export import export_k8s

    try:
        cfg = load_k8s_config(k8s_config, api=api, queue=queue, namespace=namespace, image=image,
                              queue_per_tenant=queue_per_tenant or None)
        index = export_k8s(decision, cluster, jobs, out_dir, cfg, skip_unsupported)
    except InputError as exc:
        _fail(exc)
        return
    stderr_console().print(f"{len(index['jobs'])} jobs written to {out_dir} ({cfg.api}); "
              f"{len(index['refused'])} refused", highlight=False, markup=False)


@export_app.command("kueue")
def export_kueue_cmd(
    cluster: str = typer.Option(..., "--cluster", help="cluster YAML or a bundled name"),
    tenants: Path = typer.Option(..., "--tenants", help="tenants YAML (quota_gpus per tenant)"),
    out_dir: Path = typer.Option(..., "--out", help="directory for the YAML files"),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="LocalQueues' namespace"),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="settings YAML"),
) -> None:
    """ResourceFlavors, a Topology, ClusterQueues and LocalQueues for the cluster's tenants."""
    from apportion.runtime.executors.k8s_config import load_k8s_config
    from apportion.runtime.executors.k8s_export import export_kueue

    try:
        cfg = load_k8s_config(k8s_config, namespace=namespace)
        names = export_kueue(cluster, tenants, out_dir, cfg)
    except InputError as exc:
        _fail(exc)
        return
    stderr_console().print(f"{len(names)} objects written to {out_dir}", highlight=False, markup=False)


@bench_app.command("round")
def bench_round_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the rows as JSON (- for stdout)"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="runs per case"),
    seed: int = typer.Option(1, "--seed", help="the held-out rounds' seed"),
    case: Optional[list[str]] = typer.Option(None, "--case", help="JOBS:GPUS:BUDGET[:PARTS"
                                             "[:ENGINE]] (repeatable; default: the targets)"),
) -> None:
    """The whole solve-round command on held-out rounds: wall and CPU time, gap, load."""
    from apportion.console import Progress
    from apportion.experiments.bench import rounds

    try:
        outputs.check_outputs((json_out, "--json"))
        cases = rounds.parse_cases(case)
    except InputError as exc:
        _fail(exc)
        return
    with Progress("bench round", heartbeat=True):
        rows = rounds.main(cases, seed, repeat)
    if not outputs.is_stdout(json_out):
        stdout_console().print(rounds.markdown(rows), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, rows, "--json")


def main() -> None:
    app(prog_name="apportion")


if __name__ == "__main__":
    main()
