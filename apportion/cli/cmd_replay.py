"""Replays: one trace under one policy (simulate) or many policies and seeds (compare)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from apportion import outputs
from apportion.cli import complete
from apportion.cli.complete import ENV_CLUSTER
from apportion.cli.common import (
    DETERMINISTIC_HELP,
    INFORMATION_HELP,
    OBJECTIVE_PRESET_HELP,
    SIM_ESTIMATOR_HELP,
    check_finite,
    cluster_help,
    fail,
    print_json,
    user_input,
    verbose_logs,
)
from apportion.cli.exits import EXIT_BUG
from apportion.console import printable, stderr_console, stdout_console
from apportion.errors import InputError


TRACE_HELP = ("a trace file (its format detected from its content: `apportion traces` "
              "lists the formats) or a bundled name")
TABLES_HELP = ("your measured iteration times CSV (model, gpu_type, gpus, iter_time_s"
               "[, global_batch_size], as solve-round --tables reads): the replay's ground "
               "truth, so models the catalog lacks replay at your rates")


def _note(line: str) -> None:
    """A substitution the trace's loading made, on stderr before the replay."""
    stderr_console().print(f"note: {printable(line)}", highlight=False, markup=False,
                           soft_wrap=True)


def simulate_cmd(
    trace: str = typer.Option(..., "--trace", help=TRACE_HELP,
                              autocompletion=complete.traces),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a "
                                "bundled name: " + cluster_help(), envvar=ENV_CLUSTER,
                                autocompletion=complete.clusters,
                                callback=complete.from_environment),
    policy: str = typer.Option(..., "--policy", help="policy name (apportion policies)",
                               autocompletion=complete.policies),
    profile: str = typer.Option("default", "--profile", help="round rules: default | gavel | ymir | pollux (Pollux's 60-s rounds, 30-s starts and restarts)"),
    seed: int = typer.Option(0, "--seed", help="the replay's seed: the noise on what the "
                             "policy sees and the estimated mode's profiling draws"),
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
    estimator: str = typer.Option("analytic", "--estimator", help=SIM_ESTIMATOR_HELP,
                                  autocompletion=complete.sim_estimators),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
    truth: str = typer.Option("auto", "--truth", help="ground truth: auto (the detected "
                              "format's own; tables with --tables) | gavel | crius | morphling "
                              "| elasticflow | analytic | tables | finetune"),
    tables: Optional[Path] = typer.Option(None, "--tables", help=TABLES_HELP),
    tenants: Optional[Path] = typer.Option(None, "--tenants", help="tenants YAML (quota_gpus "
                                           "per tenant): the quotas every policy that keeps "
                                           "quotas is given"),
    deterministic: bool = typer.Option(False, "--deterministic", help=DETERMINISTIC_HELP),
    objective_preset: Optional[str] = typer.Option(None, "--objective-preset",
                                                   help=OBJECTIVE_PRESET_HELP,
                                                   autocompletion=complete.objective_presets),
) -> None:
    """Replay a trace on a simulated cluster under one policy; print and write the summary.

    Exits 1, naming them, when jobs stopped progressing (the outputs are still written)."""
    verbose_logs(verbose)
    from apportion.experiments.harness import StalledReplay, simulate_main

    try:
        outputs.check_outputs((json_out, "--json"), (jobs_csv, "--jobs-csv"),
                              inputs=((trace, "--trace"), (cluster, "--cluster"),
                                      (tenants, "--tenants")))
        check_finite(interval, "--interval")
        check_finite(restart_cost, "--restart-cost", -1e-300)
        check_finite(noise, "--noise", -1e-300)
        check_finite(window_days, "--window-days")
        summary = simulate_main(trace, cluster, policy, profile, seed, interval, restart_cost, noise,
                                window_days, max_jobs, json_out, jobs_csv, information, estimator,
                                truth, deterministic=deterministic, tenants=tenants,
                                objective_preset=objective_preset, tables=tables,
                                notify=_note)
    except InputError as exc:
        fail(exc)
        return
    except StalledReplay as exc:
        if not outputs.any_stdout(json_out, jobs_csv):
            print_json(exc.summary)
        stderr_console().print(f"error: {printable(exc)}", highlight=False, markup=False,
                               soft_wrap=True)
        raise typer.Exit(EXIT_BUG) from None
    if not outputs.any_stdout(json_out, jobs_csv):
        print_json(summary)


def compare_cmd(
    trace: str = typer.Option(..., "--trace", help=TRACE_HELP,
                              autocompletion=complete.traces),
    cluster: str = typer.Option(..., "--cluster", help="FILE.yaml, V100:P100:K80 counts, or a "
                                "bundled name: " + cluster_help(), envvar=ENV_CLUSTER,
                                autocompletion=complete.clusters,
                                callback=complete.from_environment),
    policies: str = typer.Option(..., "--policies", help="comma-separated policy names",
                                 autocompletion=complete.policy_list),
    seeds: int = typer.Option(1, "--seeds", min=1, help="replay each policy with seeds "
                              "0 .. N-1; tables and plots give means and confidence "
                              "intervals over them"),
    profile: str = typer.Option("default", "--profile", help="round rules: default | gavel | ymir | pollux (Pollux's 60-s rounds, 30-s starts and restarts)"),
    out_dir: Path = typer.Option(Path("results"), "--out", help="results root (a folder)"),
    run: Optional[str] = typer.Option(None, "--run", help="run name (default: trace-cluster)"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="replays run in "
                                          "parallel, one process each (default: the CPU "
                                          "count, at most one per replay)"),
    window_days: Optional[float] = typer.Option(None, "--window-days", min=0.01,
                                                help="raw traces: busiest window of this many "
                                                "days"),
    max_jobs: Optional[int] = typer.Option(None, "--max-jobs", min=1,
                                           help="first N jobs only"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    estimator: str = typer.Option("analytic", "--estimator", help=SIM_ESTIMATOR_HELP,
                                  autocompletion=complete.sim_estimators),
    engine: str = typer.Option("local", "--engine", help="local (processes) | ray (a Ray task "
                               "per policy and seed)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--engine ray: an "
                                              "existing cluster (default: a local one)"),
    tenants: Optional[Path] = typer.Option(None, "--tenants", help="tenants YAML (quota_gpus "
                                           "per tenant): the quotas every policy that keeps "
                                           "quotas is given"),
    deterministic: bool = typer.Option(False, "--deterministic", help=DETERMINISTIC_HELP),
    objective_preset: Optional[str] = typer.Option(None, "--objective-preset",
                                                   help=OBJECTIVE_PRESET_HELP,
                                                   autocompletion=complete.objective_presets),
    tables: Optional[Path] = typer.Option(None, "--tables", help=TABLES_HELP),
    load: Optional[str] = typer.Option(None, "--load", help="a load sweep: comma-separated "
                                       "arrival rates in times the trace's (0.5,1,1.5,2); "
                                       "one comparison per load in RUN/load-X, and "
                                       "load_sweep.csv/.md and jct_vs_load plots in RUN"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
) -> None:
    """Replay a trace under many policies and seeds in parallel; write CSV, markdown, plots."""
    verbose_logs(verbose)
    from apportion.experiments.harness import CompareFailed, compare_main
    from apportion.experiments.load_sweep import compare_loads, parse_loads

    failed: CompareFailed | None = None
    with user_input():
        outputs.check_output_dir(out_dir, "--out")
        check_finite(window_days, "--window-days")
        options = dict(deterministic=deterministic, tenants=tenants,
                       objective_preset=objective_preset, tables=tables, notify=_note)
        try:
            if load is not None:
                root = compare_loads(trace, cluster, policies, seeds, profile, out_dir, run,
                                     parse_loads(load), workers=workers,
                                     window_days=window_days, max_jobs=max_jobs,
                                     information=information, estimator=estimator,
                                     engine=engine, ray_address=ray_address, **options)
            else:
                root = compare_main(trace, cluster, policies, seeds, profile, out_dir, run,
                                    workers, window_days, max_jobs, information, estimator,
                                    engine, ray_address, **options)
        except CompareFailed as exc:  # the other runs' rows are written: show them, exit 1
            failed, root = exc, exc.root
    table = root / ("load_sweep.md" if load is not None else "summary.md")
    stdout_console().print(table.read_text(), markup=False, highlight=False)
    stderr_console().print(f"results in {printable(root)}", highlight=False, markup=False)
    if failed is not None:
        stderr_console().print(f"error: {printable(failed)}", highlight=False, markup=False,
                               soft_wrap=True)
        raise typer.Exit(EXIT_BUG)
