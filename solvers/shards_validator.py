"""Independent checker for shard-unit schedules.

Written against the problem's raw data only (runtimes, speeds, memories, the
buffer fraction), never through the formulation's helpers, so a bug in a
formulation or a decoder cannot hide itself. Every schedule any test or command
produces passes through :func:`check_schedule`.

Checks: each unit of each model scheduled exactly once on a known device; its
length equals runtime / speed; nothing starts before 0; chains in order (unit j
starts no earlier than unit j-1 ends); at most one unit per device at a time;
each unit's memory within the device's budget after the double-buffer reserve.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

from apportion.shards_spec import Placement, ShardProblem

log = logging.getLogger(__name__)


class InvalidSchedule(ValueError):
    """A schedule broke at least one rule; ``violations`` lists them all."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = violations
        more = f" (+{len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__("; ".join(violations[:5]) + more)


def _tol(scale: float, rel: float) -> float:
    return rel * max(1.0, scale)


def validate_schedule(problem: ShardProblem, schedule: Sequence[Placement],
                      rel_tol: float = 1e-7) -> list[str]:
    """Every rule the schedule breaks, as readable strings (empty when valid)."""
    bad: list[str] = []
    horizon = max((pl.end for pl in schedule), default=0.0)
    tol = _tol(horizon, rel_tol)
    seen: dict[tuple[int, int], Placement] = {}
    for pl in schedule:
        key = (pl.model, pl.unit)
        if not (0 <= pl.model < len(problem.models)) or not (
                0 <= pl.unit < len(problem.models[pl.model].runtimes)):
            bad.append(f"unknown unit {key}")
            continue
        if key in seen:
            bad.append(f"unit {key} scheduled twice")
            continue
        seen[key] = pl
        if not 0 <= pl.device < len(problem.devices):
            bad.append(f"unit {key} on unknown device {pl.device}")
            continue
        dev = problem.devices[pl.device]
        want = problem.models[pl.model].runtimes[pl.unit] / dev.speed
        if abs((pl.end - pl.start) - want) > tol:
            bad.append(f"unit {key} lasts {pl.end - pl.start:.9g}s on {dev.name}, needs {want:.9g}s")
        if pl.start < -tol:
            bad.append(f"unit {key} starts at {pl.start:.9g} < 0")
        mem = problem.models[pl.model].memory
        need = mem[pl.unit] if mem else 0.0
        budget = dev.memory * (1.0 - problem.buffer_fraction)
        if need > budget:
            bad.append(f"unit {key} needs {need:g} B; {dev.name} allows {budget:g} B after the "
                       f"{problem.buffer_fraction:.0%} double-buffer reserve")
    for i, m in enumerate(problem.models):
        for j in range(len(m.runtimes)):
            if (i, j) not in seen:
                bad.append(f"unit {(i, j)} of model {m.name} not scheduled")
            elif j and (i, j - 1) in seen and seen[i, j].start < seen[i, j - 1].end - tol:
                bad.append(f"model {m.name}: unit {j} starts at {seen[i, j].start:.9g} before "
                           f"unit {j - 1} ends at {seen[i, j - 1].end:.9g}")
    by_dev: dict[int, list[Placement]] = {}
    for pl in seen.values():
        by_dev.setdefault(pl.device, []).append(pl)
    for p, pls in by_dev.items():
        pls.sort(key=lambda q: (q.start, q.end))
        for a, b in itertools.pairwise(pls):
            if b.start < a.end - tol:
                bad.append(f"device {problem.devices[p].name}: units {(a.model, a.unit)} "
                           f"[{a.start:.9g}, {a.end:.9g}) and {(b.model, b.unit)} "
                           f"[{b.start:.9g}, {b.end:.9g}) overlap")
    return bad


def check_schedule(problem: ShardProblem, schedule: Sequence[Placement],
                   rel_tol: float = 1e-7) -> None:
    """Raise :class:`InvalidSchedule` unless the schedule obeys every rule."""
    bad = validate_schedule(problem, schedule, rel_tol)
    if bad:
        log.error("invalid shard schedule: %s", bad[0])
        raise InvalidSchedule(bad)


def placements_from_output(problem: ShardProblem, output: dict[str, Any]) -> list[Placement]:
    """Read the ``schedule`` of a solve-shards output dict back into placements, by name,
    so the command's JSON itself can be validated."""
    models = {m.name: i for i, m in enumerate(problem.models)}
    devices = {d.name: p for p, d in enumerate(problem.devices)}
    return [Placement(models.get(e["model"], -1), int(e["unit"]), devices.get(e["device"], -1),
                      float(e["start"]), float(e["end"])) for e in output["schedule"]]
