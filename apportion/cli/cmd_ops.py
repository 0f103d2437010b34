"""Operating real clusters: the run loop and the service around it, importing a cluster,
exporting to Kubernetes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from apportion import outputs
from apportion.cli import complete
from apportion.cli.common import (
    ESTIMATOR_HELP,
    OBJECTIVE_PRESET_HELP,
    POLICY_HELP,
    check_budget,
    check_finite,
    cluster_help,
    service_logging,
    user_input,
    verbose_logs,
)
from apportion.cli.complete import ENV_CLUSTER, ENV_STATE
from apportion.console import adopt_logger, stderr_console
from apportion.errors import InputError

# The options `run` and `serve` share (one loop, one set of flags), declared once.
WORKDIR = typer.Option(Path("apportion-runs"), "--workdir", help="checkpoints, logs")
KUBECONFIG = typer.Option(None, "--kubeconfig", help="apply manifests here (in-cluster: the "
                          "pod's service account)")
TIME_BUDGET = typer.Option(10.0, "--time-budget", help="solver budget per round, s")
POLICY = typer.Option(None, "--policy", help=POLICY_HELP, autocompletion=complete.policies)
ESTIMATOR = typer.Option("analytic", "--estimator", help=ESTIMATOR_HELP,
                         autocompletion=complete.estimators)
K8S_CONFIG = typer.Option(None, "--k8s-config", help="kubernetes settings YAML (namespace, "
                          "image, PVC, queue, priorities)")
DRAIN = typer.Option(False, "--drain", help="kubernetes: on stop, suspend (checkpoint) every "
                     "job instead of leaving them running")
CHECKPOINT_EVERY = typer.Option(None, "--checkpoint-every", help="periodic checkpoints every N "
                                "iterations (0: off; default off; a job's "
                                "workload.checkpoint_every wins)")
CHECKPOINT_INTERVAL = typer.Option(None, "--checkpoint-interval", help="... or every S seconds "
                                   "(0: off; default 120)")
MAX_RETRIES = typer.Option(3, "--max-retries", help="relaunches of a failing job without a new "
                           "checkpoint before it is failed")
GRACE_PERIOD = typer.Option(120.0, "--grace-period", help="seconds a stopped workload has to "
                            "checkpoint and exit before SIGKILL")
ORPHANS = typer.Option("adopt", "--orphans", help="workers a killed run left: adopt | stop")
RAY_ADDRESS = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS",
                           help="join this Ray cluster (--executor ray)")
TIMEOUT = typer.Option(None, "--timeout", help="stop after this many s")
TABLES = typer.Option(None, "--tables", help="measured iteration times CSV (model, gpu_type, "
                      "gpus, iter_time_s) for --estimator tables/auto")
TENANTS = typer.Option(None, "--tenants", help="tenants YAML (quota_gpus per tenant), for "
                       "--policy apportion (the default) or apportion-plans")
OBJECTIVE_PRESET = typer.Option(None, "--objective-preset", help=OBJECTIVE_PRESET_HELP,
                                autocompletion=complete.objective_presets)
LOG_FORMAT = typer.Option(None, "--log-format", envvar="APPORTION_LOG_FORMAT",
                          help="text (default) | json: one JSON object per log line (a "
                          "round's line: backend, status, placed, pending, gap, wall)")
VERBOSE = typer.Option(False, "--verbose", "-v", help="logs (INFO) and tracebacks on stderr")
EXECUTOR_HELP = ("dry-run | local | slurm | ray | kubernetes, or a plug-in's (apportion "
                 "executors lists them)")
ROUNDS_LOGGER = "apportion.rounds"  # runtime.round_log's
ACCESS_LOGGER = "apportion.serve.access"  # serve.access's



def run_cmd(
    executor: str = typer.Option("dry-run", "--executor", help=EXECUTOR_HELP,
                                 autocompletion=complete.executors),
    cluster: str = typer.Option("local", "--cluster", help="FILE.yaml, local, or a bundled "
                                "name: " + cluster_help(), envvar=ENV_CLUSTER,
                                autocompletion=complete.clusters,
                                callback=complete.from_environment),
    state: Path = typer.Option(..., "--state", help="state DB (apportion submit creates it)",
                               envvar=ENV_STATE, callback=complete.from_environment),
    interval: float = typer.Option(300.0, "--interval", help="seconds between rounds"),
    until_idle: bool = typer.Option(False, "--until-idle", help="stop once every job is done"),
    timeout: Optional[float] = TIMEOUT,
    workdir: Path = WORKDIR,
    kubeconfig: Optional[str] = KUBECONFIG,
    time_budget: float = TIME_BUDGET,
    policy: Optional[str] = POLICY,
    estimator: str = ESTIMATOR,
    k8s_config: Optional[Path] = K8S_CONFIG,
    drain: bool = DRAIN,
    checkpoint_every: Optional[int] = CHECKPOINT_EVERY,
    checkpoint_interval: Optional[float] = CHECKPOINT_INTERVAL,
    max_retries: int = MAX_RETRIES,
    grace_period: float = GRACE_PERIOD,
    orphans: str = ORPHANS,
    ray_address: Optional[str] = RAY_ADDRESS,
    tables: Optional[Path] = TABLES,
    tenants: Optional[Path] = TENANTS,
    objective_preset: Optional[str] = OBJECTIVE_PRESET,
    log_format: Optional[str] = LOG_FORMAT,
    verbose: bool = VERBOSE,
) -> None:
    """Run rounds every interval: solve, apply through an executor, poll progress back.

    One log line per round."""
    service_logging(verbose, log_format, ROUNDS_LOGGER)
    from apportion.cli.run_command import run_command
    from apportion.runtime.executors.registry import reads

    with user_input():
        check_finite(interval, "--interval")
        check_finite(timeout, "--timeout")
        check_budget(time_budget)
        outputs.check_output_dir(workdir, "--workdir")
        if not reads(executor, "ray_address"):  # $RAY_ADDRESS set for another executor
            ray_address = None
        code = run_command(executor, cluster, state, interval, until_idle, timeout, workdir,
                           kubeconfig, time_budget, k8s_config, drain, policy=policy,
                           estimator=estimator, checkpoint_every=checkpoint_every,
                           checkpoint_interval_s=checkpoint_interval, max_retries=max_retries,
                           grace_period_s=grace_period, orphans=orphans,
                           ray_address=ray_address, tables=tables, tenants=tenants,
                           objective_preset=objective_preset)
    raise typer.Exit(code)


def cluster_import_cmd(
    source: str = typer.Option(..., "--from", help="slurm | ray | k8s"),
    nodes_file: Optional[Path] = typer.Argument(None, help="k8s: NODES.json (kubectl get nodes "
                                                "-o json); slurm: saved `scontrol show node "
                                                "--json`, `sinfo --json` or `scontrol -d show "
                                                "node -o` (default: ask scontrol)"),
    out_file: str = typer.Option(..., "--out", help="cluster YAML to write (- for stdout)"),
    gpu_map: Optional[Path] = typer.Option(None, "--gpu-map", help="YAML: raw GPU name -> "
                                           "catalog name (extends the built-in table; maps "
                                           "MIG slices too)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS",
                                              help="with --from ray: the head's address "
                                              "(HOST:PORT, auto, ray://...)"),
    name: Optional[str] = typer.Option(None, "--name", help="cluster name (default SOURCE-cluster)"),
    include_unavailable: bool = typer.Option(False, "--include-unavailable",
                                             help="slurm: keep drained, down and reserved "
                                             "nodes, and the GPUs running jobs hold"),
    pods: Optional[Path] = typer.Option(None, "--pods", help="k8s: PODS.json (kubectl get "
                                        "pods -A -o json): what running pods request is "
                                        "taken off each node"),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="k8s: the settings "
                                              "YAML whose tolerations say which tainted "
                                              "nodes apportion's pods may use"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log what the import does"),
) -> None:
    """Write a cluster YAML from a Slurm, Ray or Kubernetes cluster, real node names kept.

    Every node left out or offered in part is said on stderr with why."""
    verbose_logs(verbose)
    from apportion.runtime.cluster_import import import_cluster

    with user_input():
        doc, imported = import_cluster(source, out_file, nodes_file, ray_address, gpu_map,
                                       name, include_unavailable, pods, k8s_config)
    groups = doc["node_groups"]
    gpus: dict[str, int] = {}
    for g in groups:
        gpus[g["gpu_type"]] = gpus.get(g["gpu_type"], 0) + g["gpus_per_node"] * len(g["nodes"])
    err = stderr_console()
    for line in imported.lines():
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    err.print(f"{'stdout' if out_file == '-' else out_file}: {len(groups)} node groups, "
              f"{sum(len(g['nodes']) for g in groups)} nodes, GPUs "
              + ", ".join(f"{k} x{v}" for k, v in sorted(gpus.items()))
              + (f"; {len(imported.left_out)} nodes left out" if imported.left_out else ""),
              highlight=False, markup=False)


def export_k8s_cmd(
    decision: Path = typer.Option(..., "--decision", help="decision JSON (solve-round --json)"),
    cluster: str = typer.Option(..., "--cluster", help="cluster YAML or a bundled name",
                                envvar=ENV_CLUSTER, autocompletion=complete.clusters,
                                callback=complete.from_environment),
    jobs: Path = typer.Option(..., "--jobs", help="jobs YAML the decision was solved for, "
                              "or default (solve-round's jobs without --jobs)"),
    out_dir: Path = typer.Option(..., "--out", help="directory for the YAML files"),
    api: Optional[str] = typer.Option(None, "--api", help="trainjob (default) | jobset | pytorchjob"),
    queue: Optional[str] = typer.Option(None, "--queue", help="Kueue LocalQueue for every job"),
    queue_per_tenant: bool = typer.Option(False, "--queue-per-tenant",
                                          help="each job in its tenant's LocalQueue (export kueue)"),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="namespace (default: default)"),
    image: Optional[str] = typer.Option(None, "--image", help="worker image"),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="settings YAML"),
    gang: Optional[str] = typer.Option(None, "--gang", help="none | volcano (a PodGroup per "
                                       "job) | kai (KAI's queue label): the pods' gang "
                                       "scheduler"),
    scheduler_name: Optional[str] = typer.Option(None, "--scheduler-name", help="the pods' "
                                                 "schedulerName (default: the gang's own)"),
    runtime_ref: Optional[str] = typer.Option(None, "--runtime-ref", help="--api trainjob: "
                                              "refer every TrainJob to this "
                                              "ClusterTrainingRuntime of the platform (e.g. "
                                              "torch-distributed) instead of writing a "
                                              "TrainingRuntime per job"),
    skip_unsupported: bool = typer.Option(False, "--skip-unsupported",
                                          help="write the others when a plan or placement "
                                               "cannot be expressed"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
) -> None:
    """One TrainJob / JobSet / PyTorchJob per allocation, pinned to the decision's nodes."""
    verbose_logs(verbose)
    from apportion.runtime.executors.kubernetes.config import load_k8s_config
    from apportion.runtime.executors.kubernetes.export import export_k8s

    with user_input():
        cfg = load_k8s_config(k8s_config, api=api, queue=queue, namespace=namespace, image=image,
                              queue_per_tenant=queue_per_tenant or None, gang=gang,
                              scheduler_name=scheduler_name, runtime_ref=runtime_ref)
        index = export_k8s(decision, cluster, jobs, out_dir, cfg, skip_unsupported)
    stderr_console().print(f"{len(index['jobs'])} jobs written to {out_dir} ({cfg.api}); "
              f"{len(index['refused'])} refused", highlight=False, markup=False)


def export_kueue_cmd(
    cluster: str = typer.Option(..., "--cluster", help="cluster YAML or a bundled name",
                                envvar=ENV_CLUSTER, autocompletion=complete.clusters,
                                callback=complete.from_environment),
    tenants: Path = typer.Option(..., "--tenants", help="tenants YAML (quota_gpus per tenant)"),
    out_dir: Path = typer.Option(..., "--out", help="directory for the YAML files"),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="LocalQueues' namespace"),
    k8s_config: Optional[Path] = typer.Option(None, "--k8s-config", help="settings YAML"),
    kueue_api: Optional[str] = typer.Option(None, "--kueue-api", help="v1beta2 (default; "
                                            "Kueue 0.15 and later) | v1beta1 (older Kueue)"),
) -> None:
    """ResourceFlavors, a Topology, ClusterQueues and LocalQueues (named after the tenants)."""
    from apportion.runtime.executors.kubernetes.config import load_k8s_config
    from apportion.runtime.executors.kubernetes.export import export_kueue

    with user_input():
        cfg = load_k8s_config(k8s_config, namespace=namespace, kueue_api=kueue_api)
        names = export_kueue(cluster, tenants, out_dir, cfg)
    stderr_console().print(f"{len(names)} objects written to {out_dir}", highlight=False, markup=False)


def export_slurm_cmd(
    decision: Path = typer.Option(..., "--decision", help="decision JSON (solve-round --json)"),
    cluster: str = typer.Option(..., "--cluster", help="cluster YAML or a bundled name",
                                envvar=ENV_CLUSTER, autocompletion=complete.clusters,
                                callback=complete.from_environment),
    jobs: Path = typer.Option(..., "--jobs", help="jobs YAML the decision was solved for, "
                              "or default (solve-round's jobs without --jobs)"),
    out_dir: Path = typer.Option(..., "--out", help="directory for the batch scripts"),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="the shared folder of the "
                                           "jobs' folders (checkpoints, launch files; default "
                                           "--out)"),
    partition: Optional[str] = typer.Option(None, "--partition", envvar="APPORTION_SLURM_"
                                            "PARTITION", help="Slurm partition"),
    sbatch_args: Optional[str] = typer.Option(None, "--sbatch-args", envvar="APPORTION_SLURM_"
                                              "SBATCH_ARGS", help="site options, shell words "
                                              "(--account=lab --qos=normal)"),
    time_limit: Optional[str] = typer.Option(None, "--time-limit", envvar="APPORTION_SLURM_"
                                             "TIME_LIMIT", help="--time for every job (Slurm's "
                                             "format: MM, HH:MM:SS, D-HH:MM); default: each "
                                             "job's estimated remaining time + the margin"),
    time_margin: float = typer.Option(0.25, "--time-margin", envvar="APPORTION_SLURM_TIME_"
                                      "MARGIN", help="share added to the estimated remaining "
                                      "time (and 10 min of start-up)"),
    python: str = typer.Option("python3", "--python", envvar="APPORTION_SLURM_PYTHON",
                               help="the interpreter on the nodes (apportion installed)"),
    grace: float = typer.Option(60.0, "--grace", envvar="APPORTION_SLURM_GRACE_S",
                                help="seconds the workers have to checkpoint when stopped"),
    slurm_nodes: Optional[Path] = typer.Option(None, "--slurm-nodes", help="saved `scontrol "
                                               "show node -o`: GRES types and limits as Slurm "
                                               "says (default: the cluster file's)"),
    skip_unsupported: bool = typer.Option(False, "--skip-unsupported",
                                          help="write the others when a job's workload "
                                               "cannot run its plan"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="logs (INFO) and tracebacks on stderr"),
) -> None:
    """One sbatch script per allocation, #SBATCH lines and all: what the Slurm executor
    submits, to read and resubmit (sbatch DIR/JOB.sbatch)."""
    verbose_logs(verbose)
    import shlex

    from apportion.runtime.executors.slurm.export import export_slurm
    from apportion.runtime.executors.slurm.submit import parse_time

    with user_input():
        limit_s = parse_time(time_limit) if time_limit else None
        if not (0.0 <= time_margin <= 100.0):
            raise InputError("--time-margin", "time_margin", f"must be a share between 0 and "
                             f"100 (0.25: a quarter more than the estimate), got {time_margin}")
        check_finite(grace, "--grace")
        try:
            args = shlex.split(sbatch_args or "")
        except ValueError as exc:
            raise InputError("--sbatch-args", "sbatch_args", f"not shell words: {exc}") from None
        index = export_slurm(decision, cluster, jobs, out_dir, workdir, partition, args,
                             limit_s, time_margin, python, grace, slurm_nodes,
                             skip_unsupported)
    untimed = sum(1 for j in index["jobs"].values() if j["time"] is None)
    stderr_console().print(f"{len(index['jobs'])} batch scripts written to {out_dir}"
                           + (f"; {untimed} without --time (no estimate)" if untimed else "")
                           + (f"; {len(index['refused'])} refused" if index["refused"] else ""),
                           highlight=False, markup=False)


# serve's own options (the ones it shares with run are above)
TOKEN_FILE = typer.Option(None, "--token-file", help="file holding a token: writes (POST, "
                          "DELETE) then need 'Authorization: Bearer TOKEN'; reads stay open. "
                          "Without it a token is generated into STATE.token (0600)")
READ_TOKEN_FILE = typer.Option(None, "--read-token-file", help="file holding a read token: "
                               "reads (the API's GETs, /metrics) then need it or the write "
                               "token; the probes and the dashboard's page stay open")
ALLOWED_HOST = typer.Option(
    None, "--allowed-host", envvar="APPORTION_ALLOWED_HOSTS",
    help="a Host name the server answers besides addresses and localhost (repeatable; "
    ".example.org for every name below it; * for any)")
ALLOWED_ORIGIN = typer.Option(
    None, "--allowed-origin", envvar="APPORTION_ALLOWED_ORIGINS",
    help="a page origin (scheme://host[:port]) allowed to call the API besides the "
    "server's own (repeatable)")
READ_TIMEOUT = typer.Option(30.0, "--read-timeout", help="seconds a request's head, and then "
                            "its body, may take to arrive")
MAX_CONNECTIONS = typer.Option(512, "--max-connections", help="open HTTP connections at most "
                               "(the longest idle gives way to a new one)")
NO_ACCESS_LOG = typer.Option(False, "--no-access-log", help="no log line per HTTP request")


def serve_cmd(
    state: Path = typer.Option(..., "--state", help="state DB (created if missing)",
                               envvar=ENV_STATE, callback=complete.from_environment),
    cluster: str = typer.Option("local", "--cluster", help="FILE.yaml, local, or a bundled "
                                "name: " + cluster_help(), envvar=ENV_CLUSTER,
                                autocompletion=complete.clusters,
                                callback=complete.from_environment),
    executor: str = typer.Option("dry-run", "--executor", help=EXECUTOR_HELP,
                                 autocompletion=complete.executors),
    interval: float = typer.Option(300.0, "--interval", help="seconds between rounds"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on "
                             "(0.0.0.0: every interface)"),
    port: int = typer.Option(8080, "--port", help="TCP port (0: any free port)"),
    token_file: Optional[Path] = TOKEN_FILE,
    no_token: bool = typer.Option(False, "--no-token", help="writes need no token (only on "
                                  "a loopback --host)"),
    read_token_file: Optional[Path] = READ_TOKEN_FILE,
    allowed_host: Optional[list[str]] = ALLOWED_HOST,
    allowed_origin: Optional[list[str]] = ALLOWED_ORIGIN,
    read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    workdir: Path = WORKDIR,
    kubeconfig: Optional[str] = KUBECONFIG,
    time_budget: float = TIME_BUDGET,
    policy: Optional[str] = POLICY,
    estimator: str = ESTIMATOR,
    k8s_config: Optional[Path] = K8S_CONFIG,
    drain: bool = DRAIN,
    checkpoint_every: Optional[int] = CHECKPOINT_EVERY,
    checkpoint_interval: Optional[float] = CHECKPOINT_INTERVAL,
    max_retries: int = MAX_RETRIES,
    grace_period: float = GRACE_PERIOD,
    orphans: str = ORPHANS,
    ray_address: Optional[str] = RAY_ADDRESS,
    timeout: Optional[float] = TIMEOUT,
    tables: Optional[Path] = TABLES,
    tenants: Optional[Path] = TENANTS,
    objective_preset: Optional[str] = OBJECTIVE_PRESET,
    log_format: Optional[str] = LOG_FORMAT,
    no_access_log: bool = NO_ACCESS_LOG,
    verbose: bool = VERBOSE,
) -> None:
    """The rounds of `run`, and beside them an HTTP server: REST API (/api/v1, /openapi.json),
    /healthz and /readyz, Prometheus /metrics, and a dashboard at /.

    One log line per round and per request."""
    service_logging(verbose, log_format, ROUNDS_LOGGER,
                    *(() if no_access_log else (ACCESS_LOGGER,)))
    adopt_logger("uvicorn")  # the HTTP server's own warnings, in the same format
    from apportion.cli.run_command import prepare_run
    from apportion.serve.command import serve_command

    raise typer.Exit(serve_command(
        state, cluster, executor, interval, host, port, token_file, workdir=workdir,
        kubeconfig=kubeconfig, time_budget_s=time_budget, k8s_config=k8s_config, drain=drain,
        policy=policy, estimator=estimator, checkpoint_every=checkpoint_every,
        checkpoint_interval_s=checkpoint_interval, max_retries=max_retries,
        grace_period_s=grace_period, orphans=orphans, ray_address=ray_address,
        timeout_s=timeout, tables=tables, tenants=tenants,
        objective_preset=objective_preset, no_token=no_token,
        allowed_hosts=tuple(allowed_host or ()), allowed_origins=tuple(allowed_origin or ()),
        read_timeout_s=read_timeout, max_connections=max_connections,
        read_token_file=read_token_file, prepare=prepare_run))
