"""The access log of ``apportion serve``: one line per request, on ``apportion.serve.access``.

An ASGI middleware, outermost, so requests the Host/Origin guard refuses (421, 403) are
logged too: method, path (without its query: a cursor or a token in a URL stays out of
logs), status, bytes sent, duration, the client's address and its user agent. ``serve``
makes the logger speak at the default level (``--no-access-log`` silences it); with
``--log-format json`` the figures are the line's fields.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from apportion.console import printable

LOGGER = "apportion.serve.access"
log = logging.getLogger(LOGGER)


class AccessLog:
    """Wraps an ASGI application; logs each HTTP request once its answer is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = {"status": 500, "bytes": 0}

        async def watched(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = int(message["status"])
            elif message["type"] == "http.response.body":
                sent["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            ms = (time.perf_counter() - started) * 1000.0
            client = scope.get("client") or ("-", 0)
            agent = next((v.decode("latin-1") for k, v in scope.get("headers", [])
                          if k == b"user-agent"), "-")
            path = printable(scope.get("path", ""), keep_newlines=False)
            fields = {"event": "request", "method": scope.get("method", ""), "path": path,
                      "status": sent["status"], "bytes": sent["bytes"],
                      "duration_ms": round(ms, 3), "client": str(client[0]),
                      "user_agent": printable(agent, keep_newlines=False)[:200]}
            log.info('%s "%s %s" %d %d %.1f ms "%s"', fields["client"], fields["method"],
                     path, sent["status"], sent["bytes"], ms, fields["user_agent"],
                     extra={"fields": fields})
