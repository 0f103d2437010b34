"""One log line per round of ``apportion run`` and ``apportion serve``.

A service's operator follows its rounds in its log, without ``-v``: each round the loop
solved gets one line on the ``apportion.rounds`` logger (which ``run`` and ``serve``
make speak at the default level, :func:`apportion.console.service_logs`), saying the
backend that answered and its status, the jobs placed and left waiting, the gap, the
solver's and the whole pass's wall time, and the launches the executor reported. With
``--log-format json`` the same figures are the line's fields. A pass with nothing to
schedule writes nothing at that level (DEBUG says so).
"""

from __future__ import annotations

import logging
import math
from typing import Any

LOGGER = "apportion.rounds"
log = logging.getLogger(LOGGER)

LAUNCHES = frozenset({"start", "resize", "migrate", "restart"})
FAILURES = frozenset({"failed", "error", "refused"})


def round_fields(tick: Any) -> dict[str, Any] | None:
    """The figures of one pass (a :class:`~apportion.runtime.loop.RoundTick`), or None for
    a pass that solved nothing."""
    decision = tick.decision
    if decision is None:
        return None
    r = decision.report
    gap = float(r.gap) if r.gap is not None and math.isfinite(float(r.gap)) else None
    events = list(getattr(tick, "events", []) or [])
    return {"round": int(tick.index), "backend": str(r.backend), "status": str(r.status),
            "placed": len(decision.allocations), "pending": len(decision.pending),
            "gap": gap, "objective": r.objective, "solver_wall_s": round(float(r.wall_s), 6),
            "wall_s": round(float(tick.duration_s), 6), "fallback": bool(r.fallback),
            "launches": sum(e.action in LAUNCHES for e in events),
            "launch_failures": sum(e.action in FAILURES for e in events)}


def log_round(tick: Any) -> None:
    """The loop's ``on_round`` hook for a round's log line."""
    f = round_fields(tick)
    if f is None:
        log.debug("pass %s: nothing to schedule", getattr(tick, "index", "?"))
        return
    gap = "n/a" if f["gap"] is None else f"{f['gap']:.2%}"
    log.info("round %d: %s %s, %d placed, %d pending, gap %s, solver %.3f s, wall %.3f s%s%s",
             f["round"], f["backend"], f["status"], f["placed"], f["pending"], gap,
             f["solver_wall_s"], f["wall_s"], f", {f['launches']} launches" if f["launches"]
             else "", f", {f['launch_failures']} launches failed" if f["launch_failures"]
             else "", extra={"fields": {"event": "round", **f}})
