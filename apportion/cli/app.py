"""The ``apportion`` application: the top-level error handler, ``--version``/``-v``, the
command groups, and every command by name from the table that says where it lives
(:mod:`apportion.cli.commands`): a command's module is imported when that command runs, so
``--version``, ``--help`` and a one-off command pay only for what they use.

Any bad input exits 2 with one line naming the file and the field, and nothing is
written; "try again later" (a busy store, a full disk) exits 75; any other failure is one
line (exit 1) with the traceback only under ``-v``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Optional

import typer

from apportion import __version__, protected
from apportion.batch_gc import before_exit, for_batch_work
from apportion.cli.commands import BENCH, CLUSTER, EXPORT, ROOT, LazyGroup, lazy_group
from apportion.cli.exits import EXIT_BAD_INPUT, EXIT_BUG, EXIT_BUSY
from apportion.console import printable, setup_logging, stderr_console, verbose_requested
from apportion.env import variables_help
from apportion.errors import HostError, InputError

log = logging.getLogger("apportion")


#: the optional packages a command may need, by import name, and the extra that brings each
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "ray": "ray",
          "deepspeed": "deepspeed", "kubernetes": "k8s", "kubernetes_validate": "dev",
          "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve"}


def _missing_extra(exc: BaseException) -> str | None:
    """The extra to install when ``exc`` is a missing optional package, else None."""
    if not isinstance(exc, ImportError):
        return None
    root = (getattr(exc, "name", None) or "").split(".")[0]
    return EXTRAS.get(root)


def _uncaught(exc: BaseException) -> int:
    """One line for an error no command handled; the exit code."""
    from apportion.store import StoreBusy, store_error

    extra = _missing_extra(exc)
    if extra is not None:  # a command whose optional part is not installed: say which
        root = (getattr(exc, "name", None) or "").split(".")[0]
        stderr_console().print(f"error: this command needs {root}, which is not installed "
                               f"here: pip install 'apportion[{extra}]'", highlight=False,
                               markup=False, soft_wrap=True)
        return EXIT_BAD_INPUT

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


class _Commands(LazyGroup):
    """The top-level commands, and the top-level handler: whatever a command raises becomes
    one line and an exit code (tracebacks only with ``-v``/``--verbose`` or
    ``APPORTION_LOG=DEBUG``)."""

    table = ROOT

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            with protected.command_scope():  # one command's inputs, never the last one's
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
                       "training. " + variables_help())


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
    log_format: Optional[str] = typer.Option(None, "--log-format", envvar="APPORTION_LOG_FORMAT",
                                             help="text (default) | json: one JSON object "
                                             "per log line, for every command"),
) -> None:
    """apportion: joint resource allocation and execution planning for DL training."""
    setup_logging(verbose, _log_format(log_format))


def _log_format(given: str | None) -> str | None:
    """``--log-format``/``$APPORTION_LOG_FORMAT`` checked, where one is given: the checker
    lives with the commands' shared options, which the front door loads only for a
    command that runs (the fast ``--help``)."""
    if given is None and not os.environ.get("APPORTION_LOG_FORMAT"):
        return None
    from apportion.cli.common import checked_log_format

    return checked_log_format(given)


bench_app = typer.Typer(cls=lazy_group(BENCH), add_completion=False, no_args_is_help=True,
                        help="benchmarks")
app.add_typer(bench_app, name="bench")
cluster_app = typer.Typer(cls=lazy_group(CLUSTER), add_completion=False, no_args_is_help=True,
                          help="describe a real cluster (Slurm, Ray, Kubernetes) as a cluster YAML")
app.add_typer(cluster_app, name="cluster")
export_app = typer.Typer(cls=lazy_group(EXPORT), add_completion=False, no_args_is_help=True,
                         help="write objects for other systems to apply")
app.add_typer(export_app, name="export")


def main() -> None:
    for_batch_work()
    try:
        app(prog_name="apportion")
    finally:  # the command is over, whatever it raised (SystemExit included)
        before_exit()
