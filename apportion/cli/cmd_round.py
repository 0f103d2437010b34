"""solve-round: one scheduling round, from files or from the state store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional

import typer

from apportion import outputs
from apportion.batch_gc import collector_paused
from apportion.cli import complete
from apportion.cli.complete import ENV_CLUSTER, ENV_STATE, env_state
from apportion.cli.common import (
    ESTIMATOR_HELP,
    MAX_INPUT_BYTES_HELP,
    ROUND_DETERMINISTIC_HELP,
    MIP_GAP_HELP,
    OBJECTIVE_PRESET_HELP,
    POLICY_HELP,
    cluster_help,
    user_input,
    verbose_logs,
)
from apportion.cli.show import show_decision
from apportion.errors import InputError

if TYPE_CHECKING:  # annotations only: the command imports what it uses when it runs
    from apportion.cli.round_config import RoundFlags
    from apportion.cluster import Cluster
    from apportion.jobs import JobSpec


#: the options' help, kept here so that the command's signature reads as its flags
HELP = {
    "--cluster": "cluster YAML or a bundled name (default: Crius's testbed); bundled: "
                 + cluster_help(),
    "--jobs": "jobs YAML, or JSON lines for a large queue (docs/formats.md; default: a dozen "
              "Crius jobs)",
    "--backend": "auto | cp-sat | highs | lp-round | scip | greedy",
    "--json": "write the decision JSON here (- for stdout)",
    "--dump-problem": "write the candidates and estimates as JSON (- for stdout)",
    "--tables": "measured iteration times CSV (model, gpu_type, gpus, iter_time_s) for "
                "tables/auto",
    "--isolate": "run each solver backend in a child process (default: yes, unless "
                 "--deterministic)",
    "--tenants": "tenants YAML with GPU quotas for guaranteed jobs (cells, plans)",
    "--state": "state DB: read the queue from it and commit the round to it (instead of "
               f"--jobs; default ${ENV_STATE} unless --jobs is given)",
    "--round-key": "with --state: a round committed under this key is not redone",
    "--partitions": "> 1: a POP-style partitioned solve in that many parts, in parallel",
    "--engine": "where a partitioned solve's parts run: local (child processes) | ray (Ray "
                "tasks)",
    "--ray-address": "--engine ray: an existing cluster (default: a local one)",
}


def solve_round(
    cluster: Optional[Path] = typer.Option(None, "--cluster", help=HELP["--cluster"],
                                           envvar=ENV_CLUSTER,
                                           autocompletion=complete.clusters,
                                           callback=complete.from_environment),
    jobs: Optional[Path] = typer.Option(None, "--jobs", help=HELP["--jobs"]),
    max_input_bytes: Optional[str] = typer.Option(None, "--max-input-bytes",
                                                  help=MAX_INPUT_BYTES_HELP),
    time_budget: float = typer.Option(10.0, "--time-budget", min=0.01, help="solver wall-clock budget, s"),
    backend: str = typer.Option("auto", "--backend", help=HELP["--backend"],
                                autocompletion=complete.backends),
    mip_gap: float = typer.Option(1e-3, "--mip-gap", help=MIP_GAP_HELP),
    json_out: Optional[Path] = typer.Option(None, "--json", readable=False, help=HELP["--json"]),
    dump_problem: Optional[Path] = typer.Option(None, "--dump-problem", readable=False,
                                                help=HELP["--dump-problem"]),
    search_depth: int = typer.Option(3, "--search-depth", min=0, help="greedy local-search depth"),
    max_changes: Optional[int] = typer.Option(None, "--max-changes", min=0,
                                              help="at most this many running jobs changed"),
    formulation: str = typer.Option("cells", "--formulation", help="cells | plans | deadline | gavel"),
    policy: Optional[str] = typer.Option(None, "--policy", help=POLICY_HELP,
                                         autocompletion=complete.policies),
    estimator: str = typer.Option("analytic", "--estimator", help=ESTIMATOR_HELP,
                                  autocompletion=complete.estimators),
    tables: Optional[Path] = typer.Option(None, "--tables", help=HELP["--tables"]),
    isolate: Optional[bool] = typer.Option(None, "--isolate/--no-isolate", help=HELP["--isolate"]),
    tenants: Optional[Path] = typer.Option(None, "--tenants", help=HELP["--tenants"]),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
    state: Optional[Path] = typer.Option(None, "--state", help=HELP["--state"]),
    round_key: Optional[str] = typer.Option(None, "--round-key", help=HELP["--round-key"]),
    partitions: int = typer.Option(1, "--partitions", min=1, help=HELP["--partitions"]),
    engine: str = typer.Option("local", "--engine", help=HELP["--engine"]),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help=HELP["--ray-address"]),
    objective_preset: Optional[str] = typer.Option(None, "--objective-preset",
                                                   help=OBJECTIVE_PRESET_HELP,
                                                   autocompletion=complete.objective_presets),
    deterministic: bool = typer.Option(False, "--deterministic",
                                       help=ROUND_DETERMINISTIC_HELP),
) -> None:
    """Solve one scheduling round: read cluster and queue, decide, validate, report."""
    started = time.perf_counter()  # the budget covers the whole command from here
    verbose_logs(verbose)
    if state is None and jobs is None and env_state():  # the operator's store; --jobs wins
        state = Path(env_state() or "")
    from apportion.cli.round_config import RoundFlags, round_config
    from apportion.policies import check_round_flags, run_round

    with user_input():  # flags the round would ignore, refused by name before anything
        check_round_flags(formulation=formulation, policy=policy, estimator=estimator,
                          tables=tables, tenants=tenants, engine=engine,
                          ray_address=ray_address, state=state, round_key=round_key,
                          time_budget=time_budget, dump_problem=dump_problem)
    data_on_stdout = outputs.any_stdout(json_out, dump_problem)
    flags = RoundFlags(backend, formulation, policy, estimator, time_budget, mip_gap,
                       search_depth, max_changes, not deterministic if isolate is None else
                       isolate, tenants, tables, partitions, engine, ray_address, deterministic,
                       objective_preset=objective_preset)
    if state is not None:  # the queue and running jobs come from the store
        _solve_round_in_store(state, cluster, jobs, max_input_bytes, flags, started, json_out,
                              dump_problem, round_key, data_on_stdout)
    with user_input():
        cfg = round_config(flags, started)
        outputs.check_outputs((json_out, "--json"), (dump_problem, "--dump-problem"),
                              inputs=((cluster, "--cluster"), (jobs, "--jobs"),
                                      (tables, "--tables"), (tenants, "--tenants")))
        cl, jb, now, finished = _cluster_and_queue(cluster, jobs, max_input_bytes)
    # one round and the command ends: what the round allocates lives until then, and its
    # cycles are few (a 1,000-job round's collections found 8 objects in 14 ms)
    with collector_paused():
        result = run_round(cl, jb, now, cfg, finished=finished)
    show_decision(result.decision, data_on_stdout)
    if json_out:
        outputs.write_json(json_out, result.decision.as_dict(), "--json")
    if dump_problem:
        outputs.write_json(dump_problem, result.problem, "--dump-problem")


def _solve_round_in_store(state: Path, cluster: Path | None, jobs: Path | None,
                          max_input_bytes: str | None, flags: RoundFlags, started: float,
                          json_out: Path | None, dump_problem: Path | None,
                          round_key: str | None, data_on_stdout: bool) -> NoReturn:
    """The round over the store's queue and running jobs, committed to it; exits with its
    status. ``--max-input-bytes`` bounds a ``--jobs`` file, so without one it is refused."""
    if max_input_bytes is not None and jobs is None:
        with user_input():
            raise InputError("--max-input-bytes", "max_input_bytes", "bounds the --jobs file "
                             "read; with --state the queue comes from the store (give it to "
                             "`apportion submit FILE --state DB --max-input-bytes ...`)")
    from apportion.cli.store import solve_round_state

    raise typer.Exit(solve_round_state(
        state, cluster, jobs, flags, started, json_out=json_out, dump_problem=dump_problem,
        round_key=round_key, show=lambda d: show_decision(d, data_on_stdout)))


def _cluster_and_queue(cluster: Path | None, jobs: Path | None,
                       max_input_bytes: str | None
                       ) -> tuple[Cluster, list[JobSpec], float, list[Any]]:
    """The round's cluster and queue from the files (or the embedded defaults), a queue
    too large for this machine refused before a line of it is read; raises InputError."""
    from apportion.cli.common import max_input_bytes as size_of
    from apportion.config import (
        check_running,
        declared_jobs,
        default_cluster,
        default_jobs,
        load_queue,
        resolve_cluster,
    )
    from apportion.memory_guard import check_round_fits

    limit = size_of(max_input_bytes)
    cl = resolve_cluster(cluster) if cluster else default_cluster()
    if jobs and (declared := declared_jobs(jobs)) is not None:
        # a queue too large for this machine, refused before a line of it is read
        check_round_fits(declared, cl.total_gpus, str(jobs))
    if jobs:
        queue = load_queue(jobs, limit)
        jb, now, finished = queue.jobs, queue.now_s, queue.finished
    else:
        (jb, now), finished = default_jobs(), []
    check_running(jb, cl, str(jobs) if jobs else "<embedded default jobs>")
    check_round_fits(len(jb), cl.total_gpus, str(jobs) if jobs else "<embedded default jobs>")
    return cl, jb, now, finished
