"""The state store's commands: submit, cancel, status, history (logic in apportion.cli.store)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from apportion.cli import complete
from apportion.cli.common import MAX_INPUT_BYTES_HELP
from apportion.cli.complete import ENV_STATE


def submit(file: Path = typer.Argument(..., help="jobs YAML or JSON lines (the --jobs "
                                       "formats)"),
           state: Path = typer.Option(..., "--state", help="state DB (created if missing)",
                                      envvar=ENV_STATE, callback=complete.from_environment),
           max_input_bytes: Optional[str] = typer.Option(None, "--max-input-bytes",
                                                         help=MAX_INPUT_BYTES_HELP),
           ) -> None:
    """Add the jobs of a queue file (YAML or JSON lines) to the state store, all or nothing."""
    from apportion.cli.store import submit as run

    raise typer.Exit(run(file, state, max_input_bytes))


def cancel(job: str = typer.Argument(..., help="job id"),
           state: Path = typer.Option(..., "--state", help="state DB", envvar=ENV_STATE,
                                      callback=complete.from_environment)) -> None:
    """Cancel a job: it is dropped and its GPUs are free for the next round."""
    from apportion.cli.store import cancel as run

    raise typer.Exit(run(job, state))


def status(state: Path = typer.Option(..., "--state", help="state DB", envvar=ENV_STATE,
                                      callback=complete.from_environment),
           as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """Jobs and their lifecycle states (a waiting job with its reason), the queue, cluster use
    and node health. Needs only read access to the store."""
    from apportion.cli.store import status as run

    raise typer.Exit(run(state, as_json))


def history(state: Path = typer.Option(..., "--state", help="state DB", envvar=ENV_STATE,
                                      callback=complete.from_environment),
            as_json: bool = typer.Option(False, "--json", help="print JSON on stdout"),
            limit: Optional[int] = typer.Option(None, "--limit", min=1, help="last N rounds")) -> None:
    """Committed rounds with their solver reports."""
    from apportion.cli.store import history as run

    raise typer.Exit(run(state, as_json, limit))
