"""``apportion run`` and ``serve``'s options, checked, and the round's config built.

``run`` loops rounds every interval against the state store, applied by an executor;
``serve`` is the same loop with an HTTP server beside it. Both take the one option set
(:class:`~apportion.runtime.session.RunOptions`); :func:`prepare_run` checks it (an
:class:`~apportion.errors.InputError` naming the flag, exit 2) and builds the round's
config with ``solve-round``'s builder (:func:`apportion.cli.round_config.round_config`:
the same checks and the same words for the flags the three share) before anything is
opened; :func:`apportion.runtime.session.run_rounds` then locks the store, starts the
executor and loops.

The loop holds the store's round lock for the whole run (one scheduler per store),
solves (offering each job only the plans its workload kind runs), commits each round,
applies it through the executor, polls progress back into the store, and stops on
``--until-idle`` (every job finished or failed), ``--timeout`` or SIGINT/SIGTERM (every
running job checkpointed first). A run killed with SIGKILL leaves its workers running;
the next run settles them before its first round (:mod:`apportion.runtime.reconcile`).
"""

from __future__ import annotations

import math
from pathlib import Path

from apportion.cli.round_config import RoundFlags, round_config
from apportion.config import resolve_cluster
from apportion.errors import InputError
from apportion.runtime.executors.local.executor import local_cluster
from apportion.runtime.executors.registry import executor_type, readers
from apportion.runtime.session import PreparedRun, RunOptions, executor_options, run_rounds

ORPHAN_POLICIES = ("adopt", "stop")

__all__ = ["ORPHAN_POLICIES", "prepare_run", "run_command"]


def _check(option: str, value: float | None, low: float, integral: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < low or (integral and value != int(value)):
        kind = "a whole number" if integral else "a finite number"
        raise InputError(option, option.lstrip("-").replace("-", "_"),
                         f"must be {kind} >= {low:g}, got {value!r}")


def prepare_run(opts: RunOptions) -> PreparedRun:
    """Check every option (an :class:`InputError` naming the flag) and build the cluster
    and round settings; reads files, writes nothing."""
    kind = executor_type(opts.executor)
    if not opts.interval_s > 0 or not math.isfinite(opts.interval_s):
        raise InputError("--interval", "interval", f"must be positive, got {opts.interval_s}")
    _check("--timeout", opts.timeout_s, 0.0)
    _check("--time-budget", opts.time_budget_s, 0.01)
    _check("--checkpoint-every", opts.checkpoint_every, 0, integral=True)
    _check("--checkpoint-interval", opts.checkpoint_interval_s, 0.0)
    _check("--max-retries", opts.max_retries, 0, integral=True)
    _check("--grace-period", opts.grace_period_s, 0.0)
    if opts.orphans not in ORPHAN_POLICIES:
        raise InputError("--orphans", "orphans", f"{opts.orphans!r} is not one of adopt, stop")
    if opts.ray_address is not None and "ray_address" not in kind.reads:
        raise InputError("--ray-address", "ray_address",
                         f"only with --executor {' or '.join(readers('ray_address'))}")
    # solve-round's builder: the same flags checked the same way (bad names, --tables
    # without a table estimator, quotas a policy would ignore, an unknown preset); a run's
    # rounds solve in this process, each with the whole budget (no command-start deadline),
    # on the executor's device (None: this host's)
    cfg = round_config(RoundFlags(policy=opts.policy, estimator=opts.estimator,
                                  time_budget=opts.time_budget_s, isolate=False,
                                  tenants=opts.tenants, tables=opts.tables,
                                  objective_preset=opts.objective_preset),
                       started=None, device=kind.device)
    cluster = local_cluster() if opts.cluster == "local" else resolve_cluster(opts.cluster)
    # the executor's own settings (a settings file, a variable): exit 2 before the store is
    # locked
    kind.check_settings(executor_options(opts))
    return PreparedRun(opts, cluster, cfg)


def run_command(executor: str, cluster_arg: str, state: Path, interval_s: float, until_idle: bool,
                timeout_s: float | None, workdir: Path, kubeconfig: str | None = None,
                time_budget_s: float = 10.0, k8s_config: Path | None = None,
                drain: bool = False, policy: str | None = None,
                estimator: str = "analytic", *, checkpoint_every: int | None = None,
                checkpoint_interval_s: float | None = None, max_retries: int = 3,
                grace_period_s: float = 120.0, orphans: str = "adopt",
                ray_address: str | None = None, tables: Path | None = None,
                tenants: Path | None = None, objective_preset: str | None = None) -> int:
    """Exit code: 0 stopped cleanly, 2 bad input, 75 another invocation holds the store."""
    opts = RunOptions(executor, cluster_arg, state, interval_s, workdir, kubeconfig,
                      time_budget_s, k8s_config, drain, policy, estimator, checkpoint_every,
                      checkpoint_interval_s, max_retries, grace_period_s, orphans, ray_address,
                      until_idle, timeout_s, tables, tenants, objective_preset)
    return run_rounds(prepare_run(opts))
