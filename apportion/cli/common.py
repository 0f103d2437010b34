"""What every command shares: the one-line failure, option checks, help texts,
and the output block (a result on stdout unless an output option is ``-``, then written to
each output path).

Every output option goes through :mod:`apportion.outputs` (``-`` is stdout; devices and
pipes are written in place; files are replaced atomically), checked before any work.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from apportion import outputs
from apportion.cli.exits import EXIT_BAD_INPUT
from apportion.console import log_format, printable, service_logs, setup_logging, stderr_console
from apportion.errors import HostError, InputError
from apportion.formulations.objectives import PRESETS

MIP_GAP_HELP = ("an answer within this relative gap of the best proven bound is final "
                "(default 1e-3: the solver chain tries LP rounding first); below 1e-3 "
                "HiGHS goes first and the chain works for the last 0.1 %")
POLICY_HELP = ("a registered policy (apportion, apportion-plans, apportion-deadline, sia, gavel, "
               "tiresias, ...; `apportion policies` lists them); default: the formulation's own")
ESTIMATOR_HELP = "analytic | crius | morphling | tables | auto (per job, the best with data)"
INFORMATION_HELP = ("oracle (every policy sees measured truth) | estimated (every policy sees the "
                    "same profiled measurements, extended by --estimator)")
SIM_ESTIMATOR_HELP = ("the estimated mode's scaling model: analytic | crius | morphling | "
                      "tables | auto (every replayed job is profiled, so auto answers from "
                      "its tables)")
MAX_INPUT_BYTES_HELP = ("the largest queue file read, in bytes or with a unit (64MiB, 1GB); "
                        "default: 4 MiB of YAML, 64 MiB of JSON lines or 4 KiB a job its "
                        "header declares (docs/formats.md); a file this machine cannot hold "
                        "is refused whatever it says")
OBJECTIVE_PRESET_HELP = (f"apportion's objective by name: {' | '.join(PRESETS)} (apportion is "
                         "the default; docs/objective.md); apportion's policies only")
ROUND_DETERMINISTIC_HELP = ("count the solver budget in work, not seconds: the same round "
                            "gives the same answer on any machine under any load (solved in "
                            "this process, or with --partitions K each part with 1/K of the "
                            "work; the clock stays a safety stop at 4x the budget)")
DETERMINISTIC_HELP = ("count the optimising policies' solver budgets in work, not seconds: "
                      "the replay repeats exactly on any machine under any load (the "
                      "clock stays a safety stop at 4x the budget; the summary counts "
                      "the rounds it cut short)")


def cluster_help() -> str:
    from apportion.config import cluster_names_help

    return cluster_names_help()


def verbose_logs(verbose: bool) -> None:
    setup_logging(verbose)


def checked_log_format(given: str | None) -> str | None:
    """``--log-format`` (or ``$APPORTION_LOG_FORMAT``) checked: a bad one exits 2 naming
    the choices; None when neither is given."""
    if given is None and not os.environ.get("APPORTION_LOG_FORMAT"):
        return None
    try:
        return log_format(given)
    except ValueError as exc:
        fail(InputError("--log-format", "log_format", str(exc)))
    return None


def service_logging(verbose: bool, fmt: str | None, *loggers: str) -> None:
    """``run`` and ``serve``: the log format, and their round (and request) lines at the
    default level."""
    setup_logging(verbose, checked_log_format(fmt))
    service_logs(*loggers)


def fail(exc: Exception) -> None:
    """One line on stderr and the exit code: 2 for bad input, a host error's own."""
    from rich.markup import escape  # a value like "[/red]" in the input is text, not markup

    code = exc.exit_code if isinstance(exc, HostError) else EXIT_BAD_INPUT
    stderr_console().print(f"[bold red]error:[/] {escape(printable(exc))}", highlight=False,
                           markup=True, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_input() -> Iterator[None]:
    """The block that reads and checks what the user gave: bad input is one line, exit 2,
    and nothing after the block runs."""
    try:
        yield
    except InputError as exc:
        fail(exc)


def check_finite(value: float | None, option: str, minimum: float = 0.0) -> None:
    """A float option must be a number above ``minimum`` (typer lets nan and inf through)."""
    if value is not None and not (math.isfinite(value) and value > minimum):
        raise InputError(option, option.lstrip("-").replace("-", "_"),
                         f"must be a finite number > {minimum:g}, got {value}")


def max_input_bytes(text: str | None) -> int | None:
    """``--max-input-bytes`` as bytes (None: the formats' own limits); an
    :class:`InputError` naming the option for a value that is not a size."""
    if text is None:
        return None
    from apportion.memory_guard import parse_size

    return parse_size(text, "--max-input-bytes", "max_input_bytes")


#: the longest solver budget any command takes: a week. A round that may think longer is a
#: typo (1e308 once overflowed the clock's arithmetic deep inside the solver chain)
MAX_TIME_BUDGET_S = 7 * 86400.0


def check_budget(value: float | None, option: str = "--time-budget") -> None:
    """A solver budget: finite, positive and at most :data:`MAX_TIME_BUDGET_S`."""
    check_finite(value, option)
    if value is not None and value > MAX_TIME_BUDGET_S:
        raise InputError(option, option.lstrip("-").replace("-", "_"),
                         f"at most {MAX_TIME_BUDGET_S:.0f} s (a week), got {value:g}")


def print_json(data: Any) -> None:
    """JSON on stdout, for commands whose result is the JSON (escaped like every output)."""
    outputs.write_json(outputs.STDOUT, data)


def emit(result: Any, json_out: Path | None, show: Callable[[Any], None] = print_json,
         flag: str = "--json") -> None:
    """The output block: ``show`` the result on stdout unless ``json_out`` is stdout, then
    write the JSON where ``json_out`` says."""
    if not outputs.is_stdout(json_out):
        show(result)
    if json_out:
        outputs.write_json(json_out, result, flag)
