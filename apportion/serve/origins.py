"""Which ``Host`` and ``Origin`` headers a request may carry: the DNS-rebinding and
cross-site checks, as one ASGI middleware in front of every route.

**Host** (421 Misdirected Request otherwise). A page on ``evil.example`` whose name is
made to resolve to this server's address (DNS rebinding) talks to the server as its own
origin: the browser lets it read the answers and send anything. Its requests still carry
``Host: evil.example``, so the server answers only names it knows it has:

* any IP address (``127.0.0.1:8080``, ``[::1]``, ``10.1.2.3``): a browser sends an
  address only when the page's own address is that address, which rebinding cannot make;
  this is what a Kubernetes probe and a Prometheus scrape send (the pod's IP);
* ``localhost``, the ``--host`` name, and, when listening beyond loopback, this machine's
  host name;
* every ``--allowed-host`` (a name, ``.example.org`` for it and every name below it, or
  ``*`` for any name, which turns the check off).

A request without ``Host`` (HTTP/1.0) passes: no browser sends one.

**Origin** (403 otherwise). A browser names the page that made a request in ``Origin``
on every ``POST`` and ``DELETE`` and on every cross-origin one; the server accepts it
only when it is the server's own origin (the same host and port as ``Host``) or one of
``--allowed-origin``. ``Origin: null`` (a sandboxed frame, a file) is refused.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from apportion.console import printable
from apportion.errors import InputError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` too) as (lower-case host, port); None if malformed."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/?#@ \t\\"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = value.partition(":")
        if ":" in port_text:
            return None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        return host.rstrip("."), int(port_text)
    return host.rstrip("."), None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalise_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case without a default port, or None."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc or parts.path not in ("", "/") \
            or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    split = _split_host(parts.netloc)
    if split is None:
        return None
    host, port = split
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS[parts.scheme]:
        return f"{parts.scheme}://{shown}"
    return f"{parts.scheme}://{shown}:{port}"


def check_allowed_hosts(values: Iterable[str], option: str = "--allowed-host") -> list[str]:
    """The ``--allowed-host`` values (comma-separated lists too), checked; exit-2 errors
    name the option."""
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip().lower().rstrip(".")
            if not name:
                continue
            if name == "*":
                out.append(name)
                continue
            bare = name.removeprefix(".")
            split = _split_host(bare)
            if not bare or split is None or split[1] is not None or "*" in bare:
                raise InputError(option, option.lstrip("-").replace("-", "_"),
                                 f"{name!r} is not a host name (give a name such as "
                                 "scheduler.example.org, .example.org for every name below "
                                 "it, or * for any)")
            out.append(name)
    return out


def check_allowed_origins(values: Iterable[str],
                          option: str = "--allowed-origin") -> list[str]:
    """The ``--allowed-origin`` values (comma-separated lists too), normalised."""
    out: list[str] = []
    for value in values:
        for origin in value.split(","):
            if not origin.strip():
                continue
            norm = normalise_origin(origin)
            if norm is None:
                raise InputError(option, option.lstrip("-").replace("-", "_"),
                                 f"{origin.strip()!r} is not an origin (give "
                                 "scheme://host[:port], e.g. https://dash.example.org)")
            out.append(norm)
    return out


@dataclass(frozen=True)
class HostPolicy:
    """The names a request's ``Host`` may give and the origins its ``Origin`` may name."""

    names: frozenset[str] = frozenset({"localhost"})
    suffixes: tuple[str, ...] = ()
    any_name: bool = False
    origins: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def for_listener(cls, listen_host: str, allowed_hosts: Iterable[str] = (),
                     allowed_origins: Iterable[str] = ()) -> HostPolicy:
        """The policy of a server listening on ``listen_host`` (see the module docstring)."""
        names = {"localhost"}
        host = listen_host.strip("[]").lower().rstrip(".")
        if host and not _is_address(host):
            names.add(host)
        if not is_loopback(listen_host):
            names.update(n.lower().rstrip(".") for n in (socket.gethostname(),) if n)
        suffixes = []
        any_name = False
        for name in allowed_hosts:
            if name == "*":
                any_name = True
            elif name.startswith("."):
                suffixes.append(name)
                names.add(name[1:])
            else:
                names.add(name)
        return cls(frozenset(names), tuple(suffixes), any_name, frozenset(allowed_origins))

    def host_allowed(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header's name, no port) is one this server has."""
        return (self.any_name or host in self.names or _is_address(host)
                or any(host.endswith(s) for s in self.suffixes))

    def check(self, host_header: str | None, origin: str | None) -> tuple[int, str, str] | None:
        """None when the request may go on, else (status, header, why)."""
        split = None
        if host_header is not None:
            split = _split_host(host_header)
            if split is None or not self.host_allowed(split[0]):
                return (421, "Host", (f"this server does not answer for Host {host_header!r}: "
                                      "it is not an address, localhost or a name given with "
                                      "--allowed-host"))
        if origin is None:
            return None
        norm = normalise_origin(origin)
        if norm is not None and norm in self.origins:
            return None
        if norm is not None and split is not None:
            scheme = norm.split("://", 1)[0]
            host, port = split
            shown = f"[{host}]" if ":" in host else host
            own = f"{scheme}://{shown}" if port in (None, _DEFAULT_PORTS[scheme]) \
                else f"{scheme}://{shown}:{port}"
            if own == norm:
                return None
        return (403, "Origin", (f"requests from the page at {origin!r} are refused: only "
                                "this server's own pages and origins given with "
                                "--allowed-origin may call it"))


class HostOriginGuard:
    """ASGI middleware: a request whose ``Host`` or ``Origin`` the policy refuses is
    answered with a Problem (421 or 403) naming the header, before any route runs."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", ()):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        refused = self.policy.check(host, origin)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, header, why = refused
        body = json.dumps({"detail": printable(why, False), "field": header}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
