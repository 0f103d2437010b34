"""uvicorn on a thread of the scheduler's process, on a socket bound before anything else.

The loop keeps the main thread (its SIGINT/SIGTERM handling checkpoints every job);
uvicorn installs no signal handlers off the main thread. The socket is bound by
:func:`bind` before the store is locked, so a port in use exits 2 naming ``--port``
with nothing written. If the server stops by itself, it sets the observer's stop flag
and the loop stops as it would on SIGTERM: a scheduler nobody can reach does not go on.

The server speaks HTTP/1.1 through :mod:`.connections` (uvicorn's h11 protocol with read
deadlines and a connection cap), with no WebSocket upgrade (no route takes one); the
cap is checked against the process's file-descriptor limit before anything starts.
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

from apportion.errors import HostError, InputError
from apportion.serve.connections import OncePerInterval, guarded_protocol
from apportion.serve.observer import LoopObserver

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
GRACE_S = 5.0
#: descriptors kept for everything but client connections: the store's connections of the
#: request threads (three files each), the loop's, the executor's workers and logs
RESERVED_FDS = 256
#: the largest head of a request (its line and headers): h11's default, stated
MAX_HEAD_BYTES = 16 * 1024


def check_descriptors(max_connections: int) -> None:
    """Room for ``max_connections`` client connections under the process's limit on open
    files: the soft limit is raised towards the hard one where it is too low; a cap that
    still does not fit is an :class:`InputError` naming ``--max-connections`` (running out
    of descriptors stops the server accepting anyone)."""
    if max_connections < 1:
        raise InputError("--max-connections", "max_connections",
                         f"must be at least 1, got {max_connections}")
    need = max_connections + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        raise InputError("--max-connections", "max_connections",
                         f"{max_connections} connections need {need} open files with the "
                         f"server's own, and this process may open {soft} (ulimit -n); "
                         f"give at most {max(1, soft - RESERVED_FDS)} or raise the limit")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError("--host", "host", f"{host!r} is not an address of this machine "
                         f"({exc})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InputError("--port", "port", f"cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """The base URL a client on this machine would use."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class HttpServer:
    """A context: the server answers inside it, and has stopped once it is left."""

    def __init__(self, app: Any, sock: socket.socket, observer: LoopObserver,
                 read_timeout_s: float = 30.0, max_connections: int = 512) -> None:
        self.sock = sock
        self.observer = observer
        # log_config=None: apportion's own logging setup stays as it is
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off",
            timeout_graceful_shutdown=int(GRACE_S), server_header=False,
            http=guarded_protocol(read_timeout_s, max_connections), ws="none",
            h11_max_incomplete_event_size=MAX_HEAD_BYTES))
        self._quiet = OncePerInterval()
        logging.getLogger("uvicorn.error").addFilter(self._quiet)
        self.thread = threading.Thread(target=self._run, name="apportion-http", daemon=True)
        self._leaving = False
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: uvicorn exits on errors
            self.error = exc
            log.error("the HTTP server failed: %s", exc)
        finally:
            if not self._leaving:
                log.error("the HTTP server stopped; stopping the rounds (every job "
                          "checkpointed)")
                self.observer.stop.set()

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self._leaving = True
                self.server.should_exit = True
                raise HostError(f"the HTTP server did not start on {url_of(self.sock)}"
                                + (f": {self.error}" if self.error else ""))
            time.sleep(0.02)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._leaving = True
        self.server.should_exit = True
        self.thread.join(GRACE_S + 5.0)
        logging.getLogger("uvicorn.error").removeFilter(self._quiet)
        if self.thread.is_alive():
            log.warning("the HTTP server did not stop within %.0f s", GRACE_S + 5.0)
