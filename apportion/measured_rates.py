"""Throughput measured at runtime, shared with every policy through the view.

Between two rounds in which a job held the same allocation without a restart, its
progress over the time between them (the view's iterations done) is its measured rate
there. Where that is off from the view's rate source by more than ``deadband`` (a factor;
the profiles' noise is about 10 %), the job's rate on that GPU type and count is the
source's times the measured factor from then on (``JobView.rate_factor``, applied by
:meth:`View.rate`). Every policy reads rates through the view, so every policy gets the
same correction — as Sia and Gavel refine their throughput estimates online, and as
apportion's formulations did alone before (experiments/results/quality/HISTORY.md).

Why: in ``estimated`` mode a count that was not profiled is predicted from the nearest
profile, and one such prediction had a job run at a seventh of its estimate for 7 hours
(Philly day 1; experiments/results/quality/HISTORY.md). In ``oracle`` mode the
measurement is the source's rate and nothing changes.

The driver owns one :class:`RateFeedback` per run and calls :meth:`RateFeedback.observe`
on each round's view before the policy decides. A job run in a special mode (started from
another job's weights, or training merged siblings) is not measured: its rate is not the
plain rate the source gives.
"""

from __future__ import annotations

from typing import Any

from apportion.view import View


class RateFeedback:
    """Measures every running job's rate between rounds and keeps the correction factors
    in its ``JobView.rate_factor`` (the driver's bookkeeping, shown to every policy)."""

    deadband = 1.25
    min_window_s = 60.0

    def __init__(self) -> None:
        # job -> (time, iterations done, allocation key, restarts) at the last round
        self._last: dict[str, tuple[float, float, tuple[Any, ...], int]] = {}

    def observe(self, view: View) -> list[tuple[str, str, int]]:
        """Measure every running job's rate since the last round it held the same
        allocation; returns the (job, GPU type, count) whose factor changed."""
        changed = []
        alive = set()
        for js in view.jobs:
            alive.add(js.id)
            a = js.alloc
            if a is None or getattr(js, "mode", None):
                self._last.pop(js.id, None)
                continue
            batch = a.global_batch_size  # a batch the policy chose: the source's there
            key = (a.gpu_type, a.gpus, tuple(sorted(a.placement.items())), batch)
            prev = self._last.get(js.id)
            self._last[js.id] = (view.now, float(js.done), key, js.restarts)
            if prev is None or prev[2] != key or prev[3] != js.restarts \
                    or view.now - prev[0] < self.min_window_s or js.stalled:
                continue
            measured = (float(js.done) - prev[1]) / (view.now - prev[0])
            source = float(view.rates.rate(js, a.gpu_type, a.gpus, dict(a.placement),
                                           js.plan_code,  # the plan it ran (Morphling's)
                                           **({} if batch is None else {"batch": batch})))
            if measured <= 0 or source <= 0:
                continue  # no progress is the stall feedback's (``JobView.stalled_on``)
            f = measured / source
            old = js.rate_factor.get((a.gpu_type, a.gpus))
            if old is None and 1 / self.deadband <= f <= self.deadband:
                continue
            f = round(f, 3)
            if f != old:
                js.rate_factor[a.gpu_type, a.gpus] = f
                changed.append((js.id, a.gpu_type, a.gpus))
        for jid in [j for j in self._last if j not in alive]:  # jobs gone
            del self._last[jid]
        return changed
