"""Benchmarks: replay speed, estimator accuracy, solver time and gap, whole rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from apportion import outputs
from apportion.cli import complete
from apportion.cli.common import (
    DETERMINISTIC_HELP,
    INFORMATION_HELP,
    MIP_GAP_HELP,
    check_budget,
    check_finite,
    emit,
    user_input,
)
from apportion.console import stdout_console
from apportion.errors import InputError


def bench_sim_cmd(
    policy: str = typer.Option("fcfs", "--policy", help="the policy replayed (apportion "
                               "policies lists them)", autocompletion=complete.policies),
    days: float = typer.Option(14.0, "--days", min=0.1, help="the Philly window replayed, "
                               "days (14: about 13,000 jobs)"),
    time_budget: float = typer.Option(2.0, "--time-budget", min=0.05, help="solver budget "
                                      "per round, s (optimising policies)"),
    max_rounds: Optional[int] = typer.Option(None, "--max-rounds", min=1, help="stop after "
                                             "N rounds (default: replay the whole window)"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help="(- for stdout)"),
    information: str = typer.Option("estimated", "--information", help=INFORMATION_HELP),
    mip_gap: float = typer.Option(1e-3, "--mip-gap", help=MIP_GAP_HELP),
    deterministic: bool = typer.Option(False, "--deterministic", help=DETERMINISTIC_HELP),
    persistent: Optional[bool] = typer.Option(None, "--persistent/--fresh",
                                              help="keep the round's LP alive in HiGHS across "
                                              "rounds and re-solve it from the last basis "
                                              "(apportion's policies; the default: "
                                              "solvers/persistent.py), or build it afresh "
                                              "every round"),
    against: Optional[Path] = typer.Option(None, "--against", help="the Python interpreter of "
                                           "another apportion install: the same replay run by "
                                           "it at the same time, and the ratios reported"),
) -> None:
    """Replay speed: a two-week Philly window (10,000+ jobs) on Crius's 1,280-GPU cluster."""
    from apportion.console import Progress
    from apportion.experiments.bench.against import check_against
    from apportion.experiments.bench.sim import check_policy, side_by_side
    from apportion.experiments.bench.sim import main as bench_sim_main
    from apportion.policies import check_mip_gap
    from apportion.view import INFORMATION_MODES

    with user_input():
        outputs.check_outputs((json_out, "--json"))
        check_finite(days, "--days")
        check_budget(time_budget)
        check_mip_gap(mip_gap)
        check_policy(policy)
        if information not in INFORMATION_MODES:
            raise InputError("--information", "information", f"{information!r} is not one of "
                             f"{', '.join(INFORMATION_MODES)}")
        other = check_against(against) if against is not None else None
    with Progress(f"bench sim {policy}", heartbeat=True):
        if other is not None:
            res = side_by_side(other, policy, days, time_budget, max_rounds, information,
                               mip_gap, deterministic, persistent)
        else:
            res = bench_sim_main(policy, days, time_budget, max_rounds, information, mip_gap,
                                 deterministic, persistent)
    emit(res, json_out)


def bench_estimate_cmd(
    against: str = typer.Option(..., "--against", help="morphling | crius | local"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the result JSON here "
                                            "(- for stdout)"),
    markdown_out: Optional[Path] = typer.Option(None, "--markdown", readable=False,
                                                help="write a markdown table "
                                                "(- for stdout)"),
    errors_out: Optional[Path] = typer.Option(None, "--errors", readable=False,
                                              help="--against morphling: write the full error "
                                              "tables (by model, plan family, placement kind "
                                              "and GPU count; worst rows and where their "
                                              "error lives) as markdown (- for stdout)"),
) -> None:
    """Estimator accuracy against measured iteration times (Morphling, Crius, or this machine).

    The measured data comes from $APPORTION_DATA (default: ../shared/data beside the
    repository)."""
    from apportion.console import Progress
    from apportion.experiments.bench.estimate import errors_markdown, markdown, run

    with user_input():
        if against not in ("morphling", "crius", "local"):
            raise InputError("--against", "against", f"{against!r} is not one of morphling, "
                                                     "crius, local")
        if errors_out is not None and against != "morphling":
            raise InputError("--errors", "errors", "the full error tables are Morphling's "
                             "protocols': give --against morphling")
        outputs.check_outputs((json_out, "--json"), (markdown_out, "--markdown"),
                              (errors_out, "--errors"))
    with Progress(f"bench estimate --against {against}", heartbeat=True):
        res = run(against)
    if not outputs.any_stdout(json_out, markdown_out, errors_out):
        stdout_console().print(markdown(res), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, res, "--json")
    if markdown_out:
        outputs.write_text(markdown_out, markdown(res), "--markdown")
    if errors_out:
        outputs.write_text(errors_out, errors_markdown(res), "--errors")


def bench_solve_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the rows as JSON "
                                            "(- for stdout)"),
    budget: float = typer.Option(5.0, "--time-budget", help="per-backend budget, s"),
    quick: bool = typer.Option(False, "--quick", help="three sizes instead of the full grid"),
    backends: str = typer.Option("highs,cp-sat,chain", "--backends", help="comma-separated"),
    seed: int = typer.Option(0, "--seed", help="the synthetic rounds' seed (jobs, models, "
                             "GPU requests)"),
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

        with user_input():
            outputs.check_outputs((json_out, "--json"))
            check_budget(budget)
            ns = pb.parse_sizes(sizes, quick)
        with Progress("bench solve --peers", heartbeat=True):
            rows = pb.bench_peers(ns, budget_s=budget, seed=seed if seed else 1)
        if not outputs.is_stdout(json_out):
            stdout_console().print(pb.markdown(rows, budget), markup=False, highlight=False)
        if json_out:
            outputs.write_json(json_out, rows, "--json")
        return
    with user_input():
        outputs.check_outputs((json_out, "--json"))
        check_budget(budget)
        names = [b.strip() for b in backends.split(",") if b.strip()]
        bad = [b for b in names if b not in ("highs", "cp-sat", "chain")]
        if bad or not names:
            raise InputError("--backends", "backends", f"unknown {bad}; use highs, cp-sat, chain")
    grid = QUICK_GRID if quick else DEFAULT_GRID
    with Progress("bench solve", heartbeat=True):
        rows = run_bench(grid, names, budget, seed)
    if not outputs.is_stdout(json_out):
        stdout_console().print(markdown(rows), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, rows, "--json")


def bench_round_cmd(
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the rows as JSON (- for stdout)"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="runs per case"),
    seed: int = typer.Option(1, "--seed", help="the held-out rounds' seed"),
    case: Optional[list[str]] = typer.Option(None, "--case", help="JOBS:GPUS:BUDGET[:PARTS"
                                             "[:ENGINE]] (repeatable; default: the targets)"),
    formulation: str = typer.Option("cells", "--formulation",
                                    help="the rounds' formulation (cells | plans | deadline); "
                                    "plans' targets: --case 1000:1280:10 --case 300:1280:10"),
    against: Optional[Path] = typer.Option(None, "--against", help="the Python interpreter of "
                                           "another apportion install (the previous release, "
                                           "a commit in a second venv): every case also run by "
                                           "it, alternately, and the ratios reported"),
    deterministic: bool = typer.Option(False, "--deterministic", help="the rounds' solver "
                                       "budgets counted in work: the same answer on any "
                                       "machine, so only the times differ (partitioned "
                                       "cases too: each part with its share)"),
    queue_format: str = typer.Option("auto", "--queue-format", help="the queue file each "
                                     "case writes: yaml | jsonl | auto (YAML up to 20,000 "
                                     "jobs, JSON lines past it)"),
    store: bool = typer.Option(False, "--store", help="through the state store: `submit` "
                               "the queue to a fresh store (timed too), then `solve-round "
                               "--state`"),
) -> None:
    """The whole solve-round command on held-out rounds: wall, CPU, memory, gap, load."""
    from apportion.console import Progress
    from apportion.experiments.bench import rounds
    from apportion.experiments.bench.against import check_against

    with user_input():
        outputs.check_outputs((json_out, "--json"))
        cases = rounds.parse_cases(case)
        if formulation not in ("cells", "plans", "deadline"):
            raise InputError("--formulation", "formulation",
                             f"{formulation!r}: use cells, plans or deadline")
        other = check_against(against) if against is not None else None
        if queue_format not in rounds.QUEUE_FORMATS:
            raise InputError("--queue-format", "queue_format", f"{queue_format!r}: use "
                             f"{', '.join(rounds.QUEUE_FORMATS)}")
    with Progress("bench round", heartbeat=True):
        rows = rounds.main(cases, seed, repeat, formulation, other, deterministic,
                           queue_format, store)
    if not outputs.is_stdout(json_out):
        stdout_console().print(rounds.markdown(rows), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, rows, "--json")


def bench_rates_cmd(
    trace: Optional[list[str]] = typer.Option(None, "--trace", autocompletion=complete.traces,
                                              help="a quality-table family (crius-venus, "
                                              "crius-pai, philly-d1/4/7/10/13, morphling-base/"
                                              "bp/mt, gavel-max-min-fairness, "
                                              "elasticflow-philly, fm-1-roberta-base), "
                                              "philly-dN, a bundled trace or a file "
                                              "(repeatable; default: every family)"),
    estimator: Optional[list[str]] = typer.Option(None, "--estimator",
                                                  autocompletion=complete.estimators,
                                                  help="repeatable (default: analytic, crius, "
                                                  "morphling, tables)"),
    seeds: int = typer.Option(3, "--seeds", help="profile-noise seeds 0 .. N-1 (each also "
                              "the replay seed a raw trace is adapted with)"),
    max_jobs: Optional[int] = typer.Option(None, "--max-jobs",
                                           help="the first N jobs of each trace"),
    cluster: Optional[str] = typer.Option(None, "--cluster", autocompletion=complete.clusters,
                                          help="every trace on this cluster (default: the "
                                          "cluster its quality-table row used)"),
    profile_noise: float = typer.Option(0.1, "--profile-noise",
                                        help="sigma of the profiles' log-normal noise"),
    cache: Optional[Path] = typer.Option(None, "--cache", file_okay=False,
                                         help="keep the scaling models' rates in this folder "
                                         "between runs (Crius's cell estimator takes minutes "
                                         "on Crius's cluster); delete it when an estimator "
                                         "changes"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the result JSON here (- for stdout)"),
) -> None:
    """Accuracy of the estimated mode's rates per estimator, on the cells a policy is offered."""
    import math

    from apportion.console import Progress
    from apportion.experiments.bench import replay_rates as rr
    from apportion.experiments.harness import cluster_from_arg
    from apportion.inputs import check_count

    with user_input():
        outputs.check_outputs((json_out, "--json"))
        check_count(seeds, "--seeds", maximum=rr.MAX_SEEDS)
        if max_jobs is not None:
            check_count(max_jobs, "--max-jobs", maximum=10**7)
        if not (math.isfinite(profile_noise) and 0.0 <= profile_noise <= 2.0):
            raise InputError("--profile-noise", "profile_noise",
                             f"must be a number from 0 to 2, got {profile_noise}")
        if cluster is not None:
            cluster_from_arg(cluster)
        if cache is not None and cache.exists() and not cache.is_dir():
            raise InputError("--cache", "cache", f"{cache} is not a folder")
        ests = rr.check_estimators(estimator)
        traces = rr.check_traces(trace)
        for t in traces:  # a trace the harness cannot replay is named before any work
            rr.load_setting(t, 0, cluster, 1)
    with Progress("bench rates", total=len(traces), heartbeat=True) as prog:
        res = rr.run(traces, ests, seeds, max_jobs, profile_noise, cluster, cache,
                     progress=lambda i, n, t: prog.update(i, n))
    if not outputs.is_stdout(json_out):
        # soft_wrap: a markdown table's rows are wider than a pipe's 200 columns
        stdout_console().print(rr.markdown(res), markup=False, highlight=False, soft_wrap=True)
    if json_out:
        outputs.write_json(json_out, res, "--json")


def bench_decide_cmd(
    queued: int = typer.Option(1000, "--queued", min=0, max=100_000,
                               help="jobs in the store before the probes"),
    gpus: int = typer.Option(1280, "--gpus", min=1, max=1_000_000,
                             help="the synthetic cluster's GPUs"),
    probes: int = typer.Option(20, "--probes", min=1, max=1000,
                               help="jobs submitted one at a time, each waited for"),
    time_budget: float = typer.Option(5.0, "--time-budget", help="serve's round budget (s)"),
    seed: int = typer.Option(1, "--seed", min=0, help="the queue's seed"),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False,
                                            help="write the row as JSON (- for stdout)"),
) -> None:
    """Submit to decision through a running serve with a queue in the store: p50, p99, max."""
    from apportion.console import Progress
    from apportion.experiments.bench import decide

    with user_input():
        outputs.check_outputs((json_out, "--json"))
        check_budget(time_budget, "--time-budget")
    with Progress("bench decide", heartbeat=True):
        row = decide.measure(queued, gpus, 3, probes, time_budget, seed)
    if not outputs.is_stdout(json_out):
        stdout_console().print(decide.markdown(row), markup=False, highlight=False)
    if json_out:
        outputs.write_json(json_out, row, "--json")
