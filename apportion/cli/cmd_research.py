"""The research tools: profiling, one cell's estimates, Hydra's shard schedules, YMIR's fine-tuning modes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from apportion import outputs
from apportion.cli import complete
from apportion.cli.complete import ENV_CLUSTER
from apportion.cli.common import (
    check_budget,
    cluster_help,
    emit,
    user_input,
    verbose_logs,
)
from apportion.console import printable, stderr_console
from apportion.errors import InputError


def profile_cmd(
    model: str = typer.Argument(..., help="catalog model (torch: gpt-tiny, bert-tiny, vit-tiny)"),
    backend: str = typer.Option("torch", "--backend", help="torch | jax"),
    batch: int = typer.Option(8, "--batch", min=1, help="the micro-batch profiled; with "
                              "--cell, the job's global batch (as estimate --job MODEL:BATCH)"),
    devices: int = typer.Option(4, "--devices", min=1, help="stage width for DP/TP shards"),
    cell: Optional[str] = typer.Option(None, "--cell", help="GPU_TYPE:GPUS[:STAGES]: profile "
                                       "every stage shard Crius's cell estimator needs for "
                                       "this cell (this machine's GPU type; a machine without "
                                       "GPUs profiles for T4, its worker slots' type)"),
    repeats: int = typer.Option(3, "--repeats", min=1, max=100,
                                help="timed runs per layer or stage (the median is kept)"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
) -> None:
    """Profile a model's DP-only and TP-only stage shards (per-layer torch, or JAX compile).

    The shards are stored, with this machine's device, library versions and the time, in
    the profile cache, where Crius's cell estimator reads them."""
    from apportion.console import Progress
    from apportion.estimation.profilers.stages import check_profile_args, profile_report

    with user_input():
        outputs.check_outputs((json_out, "--json"))
        check_profile_args(model, backend, batch, devices, cell)
        with Progress(f"profile {model} ({backend})", heartbeat=True):
            res = profile_report(model, backend, batch, devices, repeats=repeats, cell=cell)
    err = stderr_console()
    err.print(f"{len(res['stage_records'])} stage profiles stored for {res['gpu_type']} "
              f"(measured on {printable(res['device'])})", highlight=False, markup=False)
    for why in res["skipped"]:
        err.print(f"not profiled: {printable(why)}", highlight=False, markup=False)
    emit(res, json_out)


def estimate_cmd(
    job: str = typer.Option(..., "--job", help="MODEL[:GLOBAL_BATCH], e.g. bert-1.3b:256"),
    cell: str = typer.Option(..., "--cell", help="GPU_TYPE:GPUS[:STAGES], e.g. A40:8:2"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML or a bundled "
                                           "name (default testbed): " + cluster_help(),
                                           envvar=ENV_CLUSTER, autocompletion=complete.clusters,
                                           callback=complete.from_environment),
    estimator: str = typer.Option("all", "--estimator", help="crius | analytic | morphling | all"),
    profile: bool = typer.Option(False, "--profile", help="first measure, here, the stage "
                                 "shards Crius's estimator needs for the cell (torch; this "
                                 "machine's device must be the cell's GPU type)"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
) -> None:
    """Estimate one cell with the estimators and tune it (Crius 5.1-5.2).

    Each figure says where it came from (measured, fitted, profiled or analytic), and a
    stale or foreign-device stage profile is refused by name."""
    from apportion.config import default_cluster, resolve_cluster
    from apportion.estimation.models.tuning import estimate_report, parse_job_cell

    with user_input():
        outputs.check_outputs((json_out, "--json"), inputs=((cluster, "--cluster"),))
        spec, c = parse_job_cell(job, cell)
        cl = resolve_cluster(cluster) if cluster else default_cluster()
        if profile:
            from apportion.console import Progress
            from apportion.estimation.profilers.stages import check_profile_args, profile_report

            check_profile_args(spec.model, "torch", spec.global_batch_size, 1, cell)
            with Progress(f"profile {spec.model} (torch)", heartbeat=True):
                profile_report(spec.model, "torch", spec.global_batch_size, 1, cell=cell)
        res = estimate_report(spec, c, cl, estimator)
    err = stderr_console()
    for why in res.get("refused", []):
        err.print(f"refused: {printable(why)}", highlight=False, markup=False)
    for name, e in res["estimates"].items():
        if e is not None and e.get("source"):
            err.print(f"{name}: {e['source']['kind']} -- {printable(e['source']['detail'])}",
                      highlight=False, markup=False)
    emit(res, json_out)


def solve_shards_cmd(
    units: Path = typer.Option(..., "--units", help="shard-unit problem JSON (devices, models)"),
    method: str = typer.Option("cp-sat", "--method", help="cp-sat | milp | lrtf | random"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the schedule JSON here "
                                            "(- for stdout; default stdout)"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
) -> None:
    """Hydra: schedule shard units of several models on devices (makespan job shop)."""
    verbose_logs(verbose)
    from apportion.solvers.shards import solve_shards_file

    with user_input():
        check_budget(time_budget)
        outputs.check_outputs((json_out, "--json"), inputs=((units, "--units"),))
        result = solve_shards_file(str(units), method, time_budget)
    stderr_console().print(f"makespan {result['makespan']:.6g}  lower bound "
                           f"{result['lower_bound']:.6g}  status {result['status']}",
                           highlight=False, markup=False)
    outputs.write_json(json_out or outputs.STDOUT, result, "--json")


def solve_finetune_cmd(
    tasks: Path = typer.Option(..., "--tasks", help="fine-tuning task YAML (tasks, gains)"),
    capacity: int = typer.Option(..., "--capacity", help="GPUs available"),
    time_budget: float = typer.Option(10.0, "--time-budget", help="solver budget, s"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the answer JSON here "
                                            "(- for stdout; default stdout)"),
    gains: str = typer.Option("file", "--gains", help="file: the task file's gains; auto: "
                              "also Task2Vec-predicted gains from each task's `data` samples"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
) -> None:
    """YMIR: choose normal / temporal / spatial modes and GPUs to minimise total JCT."""
    verbose_logs(verbose)
    from apportion.solvers.finetune import solve_finetune_file

    with user_input():
        if capacity < 1:
            raise InputError("--capacity", "capacity", f"must be at least 1, got {capacity}")
        check_budget(time_budget)
        outputs.check_outputs((json_out, "--json"), inputs=((tasks, "--tasks"),))
        result = solve_finetune_file(str(tasks), capacity, time_budget, gains)
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
