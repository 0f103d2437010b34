"""Read deadlines and a connection cap for the HTTP server: idle and slow clients cannot
hold it.

uvicorn (0.29 to 0.55 read for this) gives a server ``timeout_keep_alive`` (an idle
connection is closed that long after its last response, but the timer stops at the
first byte of a new request), ``limit_concurrency`` (answers 503 once that many
connections are open, so idle ones deny everybody else), ``h11_max_incomplete_event_size``
(a request head of more than 16 KB is a 400) and ``backlog``. Nothing times out a
connection that never sends a complete request: a client that opens connections and
sends nothing, or a header a byte at a time (slowloris), holds each for ever, and about
20,000 of them exhausted the process's file descriptors. This module adds, on uvicorn's
own h11 protocol (``Config(http=...)``), what a server facing untrusted clients needs:

* **a deadline for each request head**: the whole head must arrive within
  ``read_timeout_s`` of the connection (or of the previous response); a trickle does
  not extend it. A late head is answered 408 and the connection closed;
* **a deadline for each body**: the whole body within ``read_timeout_s`` of its head
  (the route that reads a body answers 408 itself a little earlier);
* **a deadline for a stalled reader**: a client that stops reading its answer for
  ``read_timeout_s`` is disconnected;
* **a connection cap** (``max_connections``): a connection past it takes the place of
  the open connection that has waited longest for its client's next request (idle or
  part-sent); when every connection is busy with a request, it is answered 503 and
  closed. A flood of idle connections therefore cannot keep a real client out.

The timers are event-loop timers, one per connection; the states are h11's
(``their_state``: IDLE waiting for a head, SEND_BODY reading a body).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

#: how long a connection closed for being late may take to flush its 408 before it is cut
FLUSH_GRACE_S = 1.0
#: how much longer than the route's own deadline a body may take before the connection is cut
BODY_GRACE_S = 2.0
#: seconds between two log lines about refused or timed-out connections (a flood of them
#: must not flood the log)
LOG_EVERY_S = 60.0


def _problem(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail, "field": None}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _Tally:
    """Counts of what the guard did, logged at most every :data:`LOG_EVERY_S`."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.logged_at = 0.0

    def add(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            log.warning("HTTP connections: %s", ", ".join(
                f"{n} {w}" for w, n in sorted(self.counts.items())))
            self.counts.clear()
            self.logged_at = now


class OncePerInterval(logging.Filter):
    """Lets each distinct warning of a logger through at most once every
    :data:`LOG_EVERY_S` (uvicorn's "Invalid HTTP request received." comes once per bad
    request: a client sending garbage in a loop would otherwise fill the log)."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        key = str(record.msg)
        now = time.monotonic()
        if now - self.last.get(key, -self.every_s) < self.every_s:
            return False
        self.last[key] = now
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a connection cap (see the module's
    docstring). Made for one server by :func:`guarded_protocol`."""

    read_timeout_s: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 512
    tally: ClassVar[_Tally]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: str | None = None
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._lost = False
        self._paused = False  # the transport's send buffer is full: the client does not read

    # -- the phases ------------------------------------------------------------------
    def _current_phase(self) -> str | None:
        """What the connection waits for from its client: a head, a body, or (while a
        response is stuck in a full send buffer) its reading; None while the app works."""
        if self.transport is None or self.transport.is_closing():
            return None
        if self._paused:
            return "write"
        state = self.conn.their_state
        if state is h11.IDLE:
            return "head"
        if state is h11.SEND_BODY:
            return "body"
        return None

    def _follow(self) -> None:
        """Arm the deadline of the phase the connection is now in; a phase that goes on
        keeps the deadline it started with."""
        phase = self._current_phase()
        if phase == self._phase:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        self._since = time.monotonic()
        if phase is not None:
            # a body's route answers 408 itself at read_timeout_s: the cut comes after it
            wait = self.read_timeout_s + (BODY_GRACE_S if phase == "body" else 0.0)
            self._timer = self.loop.call_later(wait, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self._phase != phase or self.transport is None or self.transport.is_closing():
            return
        self.tally.add(f"closed after waiting {self.read_timeout_s:g} s for a request's "
                       f"{phase}" if phase != "write" else "closed for not reading answers")
        if phase == "head" and self.conn.our_state is h11.IDLE:
            self.transport.write(_problem(408, "Request Timeout",
                                          f"the request did not arrive within "
                                          f"{self.read_timeout_s:g} s"))
            self.transport.close()
            self.loop.call_later(FLUSH_GRACE_S, self._cut)
        else:
            self._cut()

    def _cut(self) -> None:
        if not self._lost and self.transport is not None:
            self.transport.abort()

    # -- the cap ---------------------------------------------------------------------
    def _make_room(self) -> bool:
        """Below the cap, or room made by closing the connection that has waited longest
        for its client; False when every other connection is busy with a request."""
        if len(self.connections) <= self.max_connections:
            return True
        waiting = [c for c in self.connections
                   if c is not self and isinstance(c, GuardedH11Protocol)
                   and c._phase in ("head", "body", "write")]
        if not waiting:
            return False
        # idle ones first, then those part-way through a request, each the oldest first
        rank = {"head": 0, "body": 1, "write": 1}
        oldest = min(waiting, key=lambda c: (rank[c._phase or "head"], c._since))
        self.tally.add("closed to make room for a new connection")
        oldest._cut()
        self.connections.discard(oldest)
        return True

    # -- uvicorn's protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._make_room():
            self.tally.add("refused: every connection is busy")
            self.transport.write(_problem(503, "Service Unavailable",
                                          "the server has as many connections as it "
                                          "takes; try again"))
            self.transport.close()
            self.loop.call_later(FLUSH_GRACE_S, self._cut)
            return
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def pause_writing(self) -> None:
        self._paused = True
        super().pause_writing()
        self._follow()

    def resume_writing(self) -> None:
        self._paused = False
        super().resume_writing()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = None
        super().connection_lost(exc)


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class for one server, with its limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"read_timeout_s": float(read_timeout_s),
                 "max_connections": int(max_connections), "tally": _Tally()})
