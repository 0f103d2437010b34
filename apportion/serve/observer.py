"""What the loop tells the server: each pass (readiness, metrics, the round's log line) and
when to stop.

The loop calls :meth:`LoopObserver.on_round` on its own thread after every pass; the
server's threads read :meth:`readiness`. A float assigned in one statement is all they
share, so no lock is needed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from apportion.runtime.round_log import log_round
from apportion.serve.metrics import ServeMetrics


@dataclass
class LoopObserver:
    """Readiness: the loop finished a pass within ``2 * interval_s`` plus the solver's
    budget (a round may spend its whole budget before the next pass begins; without
    it a slow solve on a short interval would flap the probe)."""

    interval_s: float
    time_budget_s: float
    metrics: ServeMetrics
    stop: threading.Event = field(default_factory=threading.Event)
    last_pass_at: float | None = None  # wall clock
    passes: int = 0

    @property
    def limit_s(self) -> float:
        return 2.0 * self.interval_s + self.time_budget_s

    def on_round(self, tick: Any) -> None:
        log_round(tick)
        self.metrics.observe(tick)
        self.passes += 1
        self.last_pass_at = tick.finished_at

    def should_stop(self) -> bool:
        """True once the server has stopped by itself: a loop nobody can reach must not
        go on scheduling unseen."""
        return self.stop.is_set()

    def last_pass_age(self, now: float | None = None) -> float | None:
        at = self.last_pass_at
        return None if at is None else max(0.0, (time.time() if now is None else now) - at)

    def loop_ready(self, now: float | None = None) -> bool:
        age = self.last_pass_age(now)
        return age is not None and age <= self.limit_s
