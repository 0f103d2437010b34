"""What the routes share: the server's state and the token checks in front of them.

Kept apart from ``app`` so that every route module (``routes_probes``, ``routes_jobs``,
``routes_reads``) takes the same :class:`ServeState` and guards without importing the
application that includes it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from apportion.cluster import Cluster
from apportion.serve.answers import ApiError
from apportion.serve.auth import authorized
from apportion.serve.observer import LoopObserver

# module level: FastAPI resolves the (postponed) annotations of routes in this module's names
BEARER = HTTPBearer(auto_error=False, description="the token of --token-file")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


@dataclass
class ServeState:
    """What the routes need: where the store is, the loop's cluster and observer."""

    state: Path
    cluster: Cluster
    executor: str
    interval_s: float
    observer: LoopObserver
    registry: CollectorRegistry
    token: str | None = None
    #: with ``--read-token-file``: reads need this token (or the write token)
    read_token: str | None = None
    #: how long a request body may take to arrive (``--read-timeout``)
    read_timeout_s: float = 30.0
    #: where a generated token was written (named in a 401's detail)
    token_hint: Path | None = None
    #: tenants' GPU quotas for guaranteed jobs (``--tenants``), for the tenants' panel
    quotas: dict[str, int] = field(default_factory=dict)
    #: this server's start, in every ETag: a store replaced between two starts never
    #: answers 304 to a tag of the old one
    instance: str = field(default_factory=lambda: secrets.token_hex(4))


#: a route's dependency: returns when the request may go on, raises a 401 when not
Guard = Callable[[Request, HTTPAuthorizationCredentials | None], None]


def guards(s: ServeState) -> tuple[Guard, Guard]:
    """The writes' and the reads' token checks over ``s``'s tokens, as dependencies
    (``Depends(writer)``): a write needs the write token; a read, with
    ``--read-token-file``, that token or the write one."""

    def writer(request: Request, _: Credentials) -> None:
        if not authorized(s.token, request.headers.get("authorization")):
            where = (f"; the token is in {s.token_hint} on the server's machine"
                     if s.token_hint is not None else "")
            raise ApiError(401, "this server needs 'Authorization: Bearer <token>' for writes"
                           + where, "Authorization", {"WWW-Authenticate": "Bearer"})

    def reader(request: Request, _: Credentials) -> None:
        """Reads need a token only with ``--read-token-file``: that one, or the write
        token (who may write may read)."""
        if s.read_token is None:
            return
        header = request.headers.get("authorization")
        if authorized(s.read_token, header) or (s.token is not None
                                                and authorized(s.token, header)):
            return
        raise ApiError(401, "this server needs 'Authorization: Bearer <token>' for reads "
                       "too (the token of --read-token-file, or the write token)",
                       "Authorization", {"WWW-Authenticate": "Bearer"})
    return writer, reader
