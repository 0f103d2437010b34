"""``apportion serve``: the command's whole logic and validation, behind one function.

``serve`` is ``run`` with an HTTP server beside its loop. It shares ``run``'s options
(:class:`~apportion.runtime.session.RunOptions`) and its one setup path
(:func:`~apportion.runtime.session.run_rounds`: lock, executor, reconciliation,
loop); the server is the loop's *companion*, started once the store is locked and the
executor reconciled, stopped once the loop has checkpointed and stopped. Unlike ``run``
it creates a missing store (an operator submits through the API) and has no
``--until-idle`` (a service serves until it is stopped).

Order, so that a bad flag writes nothing: the web framework is imported (missing: exit
2 naming the extra), every flag is checked (exit 2 naming it), the token read, the
port bound (in use: exit 2 naming ``--port``); only then is the store opened and locked.
A generated token (neither ``--token-file`` nor ``--no-token``) is written once the
store is locked, so a second server refused the store never replaces the first's.
Exit codes: 0 stopped cleanly (SIGTERM/SIGINT: every job checkpointed), 2 bad input,
75 another scheduler holds the store.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from apportion import outputs
from apportion.console import printable, stderr_console
from apportion.errors import HostError, InputError
from apportion.runtime.executors.registry import reads
from apportion.runtime.session import (
    LoopContext,
    LoopHooks,
    PreparedRun,
    RunOptions,
    run_rounds,
)
from apportion.serve.auth import read_token, remove_generated_token, write_generated_token
from apportion.serve.origins import (
    HostPolicy,
    check_allowed_hosts,
    check_allowed_origins,
    is_loopback,
)

log = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2
EXTRA_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def _missing_extra() -> str | None:
    """The first module of the ``serve`` extra this environment lacks, if any."""
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def _error(message: str, code: int = EXIT_BAD_INPUT) -> int:
    stderr_console().print(f"[bold red]error:[/] {escape(printable(message))}",
                           highlight=False, soft_wrap=True)
    return code


def serve_command(state: Path, cluster: str = "local", executor: str = "dry-run",
                  interval_s: float = 300.0, host: str = "127.0.0.1", port: int = 8080,
                  token_file: Path | None = None, *, workdir: Path = Path("apportion-runs"),
                  kubeconfig: str | None = None, time_budget_s: float = 10.0,
                  k8s_config: Path | None = None, drain: bool = False,
                  policy: str | None = None, estimator: str = "analytic",
                  checkpoint_every: int | None = None,
                  checkpoint_interval_s: float | None = None, max_retries: int = 3,
                  grace_period_s: float = 120.0, orphans: str = "adopt",
                  ray_address: str | None = None, timeout_s: float | None = None,
                  tables: Path | None = None, tenants: Path | None = None,
                  objective_preset: str | None = None, no_token: bool = False,
                  allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = (),
                  read_timeout_s: float = 30.0, max_connections: int = 512,
                  read_token_file: Path | None = None,
                  prepare: Callable[[RunOptions], PreparedRun]) -> int:
    """Run the rounds of ``apportion run`` and serve the API, probes, metrics and dashboard
    until SIGTERM/SIGINT (or ``timeout_s``). ``prepare`` checks the loop's options and
    builds its round config (``apportion.cli.run_command.prepare_run``: ``run``'s and
    ``solve-round``'s builder). Returns the exit code; errors are printed."""
    missing = _missing_extra()
    if missing is not None:
        return _error(f"apportion serve needs the 'serve' extra ({missing} is not "
                      "installed): pip install 'apportion[serve]'")
    try:
        access = _checked_access(host, port, no_token, token_file, read_token_file,
                                 allowed_hosts, allowed_origins, read_timeout_s,
                                 max_connections)
        from apportion.serve.server import bind, check_descriptors

        check_descriptors(max_connections)
        outputs.check_output_dir(workdir, "--workdir")
        prep = prepare(RunOptions(
            executor, cluster, state, interval_s, workdir, kubeconfig, time_budget_s,
            k8s_config, drain, policy, estimator, checkpoint_every, checkpoint_interval_s,
            max_retries, grace_period_s, orphans,
            ray_address if reads(executor, "ray_address") else None, False, timeout_s,
            tables, tenants,
            objective_preset))
        sock = bind(host, port)
    except InputError as exc:
        return _error(str(exc))

    beside = _api_beside(access, sock, state, executor, interval_s, time_budget_s, prep)
    try:
        return run_rounds(prep, create_store=True, lock_command="serve", companion=beside)
    except InputError as exc:
        return _error(str(exc))
    except HostError as exc:
        return _error(str(exc), exc.exit_code)
    finally:
        sock.close()


@dataclass(frozen=True)
class _Access:
    """Who may use the server and how it listens, from the checked flags."""

    token: str | None
    read_token: str | None
    hosts: HostPolicy
    no_token: bool
    read_timeout_s: float
    max_connections: int


def _checked_access(host: str, port: int, no_token: bool, token_file: Path | None,
                    read_token_file: Path | None, allowed_hosts: Sequence[str],
                    allowed_origins: Sequence[str], read_timeout_s: float,
                    max_connections: int) -> _Access:
    """The listener's and the tokens' flags checked (InputError naming the flag), in the
    order the command documents, and the tokens read."""
    if not host or "\0" in host:
        raise InputError("--host", "host", "give an address to listen on, e.g. "
                         "127.0.0.1 or 0.0.0.0")
    if not 0 <= port <= 65535:
        raise InputError("--port", "port", f"must be 0..65535 (0: any free port), got {port}")
    if no_token and token_file is not None:
        raise InputError("--no-token", "no_token", "give --token-file or --no-token, "
                         "not both")
    if no_token and not is_loopback(host):
        raise InputError("--no-token", "no_token", f"writes without a token are allowed "
                         f"only on a loopback address (127.0.0.1, ::1, localhost), not "
                         f"--host {host}: anyone who reaches it could run commands "
                         "through the executor; give --token-file instead")
    token = read_token(token_file) if token_file is not None else None
    read_tok = (read_token(read_token_file, "--read-token-file")
                if read_token_file is not None else None)
    hosts = HostPolicy.for_listener(host, check_allowed_hosts(allowed_hosts),
                                     check_allowed_origins(allowed_origins))
    if not (math.isfinite(read_timeout_s) and read_timeout_s > 0):
        raise InputError("--read-timeout", "read_timeout",
                         f"must be a positive number of seconds, got {read_timeout_s}")
    return _Access(token, read_tok, hosts, no_token, read_timeout_s, max_connections)


def _api_beside(access: _Access, sock: socket.socket, state: Path, executor: str,
                interval_s: float, time_budget_s: float, prep: PreparedRun
                ) -> Callable[[LoopContext], contextlib.AbstractContextManager[LoopHooks]]:
    """The loop's companion: the HTTP server (API, probes, metrics, dashboard) for as long
    as the loop runs, with a generated token when none was given (removed after)."""

    @contextlib.contextmanager
    def beside(ctx: LoopContext) -> Iterator[LoopHooks]:
        """The HTTP server, for as long as the loop runs."""
        from prometheus_client import CollectorRegistry

        from apportion.serve.app import create_app
        from apportion.serve.metrics import ServeMetrics, StoreCollector
        from apportion.serve.observer import LoopObserver
        from apportion.serve.server import HttpServer, url_of
        from apportion.serve.state import ServeState

        registry = CollectorRegistry()
        observer = LoopObserver(interval_s, time_budget_s,
                                ServeMetrics(registry, executor, interval_s))
        registry.register(StoreCollector(state, prep.cluster, lambda: int(ctx.refit.refits),
                                         prep.round_config.quotas))
        needed, generated = access.token, None
        if access.token is None and not access.no_token:
            needed, generated = write_generated_token(state)
        app = create_app(ServeState(state, prep.cluster, executor, interval_s, observer,
                                    registry, needed, read_token=access.read_token,
                                    read_timeout_s=access.read_timeout_s,
                                    token_hint=generated,
                                    quotas=dict(prep.round_config.quotas or {})), access.hosts)
        try:
            with HttpServer(app, sock, observer, access.read_timeout_s,
                            access.max_connections):
                url = url_of(sock)
                writes = ("open (--no-token)" if needed is None else
                          f"need the token in {generated} (Authorization: Bearer TOKEN)"
                          if generated is not None else "need the token of --token-file")
                stderr_console().print(
                    f"apportion serve: {url}/ (dashboard), {url}/api/v1 (API), "
                    f"{url}/metrics; state {state}, executor {executor}, cluster "
                    f"{prep.cluster.name}, writes {writes}, reads "
                    f"{'need a token (--read-token-file)' if access.read_token else 'open'}",
                    highlight=False, markup=False, soft_wrap=True)
                yield LoopHooks(on_round=observer.on_round, should_stop=observer.should_stop)
        finally:
            if generated is not None and needed is not None:
                remove_generated_token(generated, needed)

    return beside
