"""Independent checker for fine-tuning mode/allocation answers (the `solve-finetune` output).

Written from the problem definition alone — it imports nothing from the
formulation — so a bug in the MILP, its decoder or the greedy cannot certify
itself. It re-derives each unit's work from the task file and the chosen modes,
integrates the schedule's segments in exact fractions, and checks:

* every task has exactly one mode; temporal predecessors exist, run unmerged and
  have a positive listed gain; spatial partners point at each other;
* segments start at 0, are contiguous, allocations are integers within each
  unit's GPU limit (merged: the sum of both members' limits) and the capacity;
* a temporal unit gets no GPU before its predecessor completes; no unit gets a
  GPU after it completes; each unit completes its work exactly;
* the allocation changes only at times where some unit completes;
* the reported per-task ``jct`` and ``total_jct`` equal the recomputed ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from apportion.finetune_spec import FinetuneProblem

log = logging.getLogger(__name__)

_TOL = Fraction(1, 10**7)


@dataclass
class FinetuneValidation:
    """Outcome: ``ok``, the violations found, and the recomputed JCTs."""

    ok: bool
    errors: list[str] = field(default_factory=list)
    jct: dict[str, Fraction] = field(default_factory=dict)

    @property
    def total_jct(self) -> Fraction:
        return sum(self.jct.values(), Fraction(0))


def _num(entry: dict[str, Any], key: str) -> Fraction:
    exact = entry.get(f"{key}_exact")
    if exact is not None:
        return Fraction(str(exact))
    return Fraction(repr(float(entry[key])))


def _close(a: Fraction, b: Fraction, exact: bool) -> bool:
    if exact:
        return a == b
    return abs(a - b) <= _TOL * max(1, abs(b))


Unit = frozenset[str]


@dataclass
class _Units:
    """The units the chosen modes make (a task, or two merged ones): each task's unit, and
    each unit's required work, GPU limit and temporal predecessor (a task)."""

    member_of: dict[str, Unit] = field(default_factory=dict)
    need: dict[Unit, Fraction] = field(default_factory=dict)
    limit: dict[Unit, int] = field(default_factory=dict)
    pred: dict[Unit, str] = field(default_factory=dict)


def validate_finetune_answer(
    problem: FinetuneProblem, capacity: int, answer: dict[str, Any]
) -> FinetuneValidation:
    """Check an answer dict (``tasks``, ``schedule``, ``total_jct``) against the problem."""
    errs: list[str] = []
    tasks = {t.id: t for t in problem.tasks}
    modes = answer.get("tasks", {})
    if set(modes) != set(tasks):
        errs.append(f"tasks answered {sorted(modes)} != tasks given {sorted(tasks)}")
        return FinetuneValidation(False, errs)
    units = _units_of(problem, modes, errs)
    if errs:
        return FinetuneValidation(False, errs)
    done, finished = _integrate(answer.get("schedule", []), units, capacity, errs)
    for key, req in units.need.items():
        if req == 0 and key not in finished:
            finished[key] = Fraction(0)
        if key not in finished:
            errs.append(f"unit {sorted(key)} does not complete ({done[key]} of {req} work)")
    jct = {tid: finished[key] for tid, key in units.member_of.items() if key in finished}
    _check_reported_jcts(answer, modes, jct, len(tasks), errs)
    if errs:
        log.warning("finetune answer rejected: %s", "; ".join(errs[:3]))
    return FinetuneValidation(not errs, errs, jct)


def _units_of(problem: FinetuneProblem, modes: dict[str, Any], errs: list[str]) -> _Units:
    """The units the answer's modes make, re-derived from the task file (never from the
    answer's own numbers); each mode that is not allowed appends its error."""
    tasks = {t.id: t for t in problem.tasks}
    u = _Units()
    for tid, info in modes.items():
        mode = info.get("mode")
        t = tasks[tid]
        if mode == "normal":
            key = frozenset((tid,))
            u.need[key], u.limit[key] = t.work, t.max_gpus
        elif mode == "temporal":
            a = info.get("after")
            g = problem.temporal.get((a, tid))
            if a not in tasks or g is None or g <= 0:
                errs.append(f"{tid}: temporal after {a!r} has no positive gain")
                continue
            if modes[a].get("mode") == "spatial":
                errs.append(f"{tid}: predecessor {a} is merged")
            key = frozenset((tid,))
            u.need[key], u.limit[key], u.pred[key] = (1 - g) * t.work, t.max_gpus, a
        elif mode == "spatial":
            b = info.get("with")
            g = problem.spatial.get(frozenset((tid, b)))
            if b not in tasks or b == tid or g is None or g <= 0:
                errs.append(f"{tid}: spatial with {b!r} has no positive gain")
                continue
            if modes[b].get("mode") != "spatial" or modes[b].get("with") != tid:
                errs.append(f"{tid}: partner {b} is not merged with it")
                continue
            tb = tasks[b]
            key = frozenset((tid, b))
            u.need[key] = (1 - g) * max(t.epochs, tb.epochs) * (t.epoch_time_1gpu + tb.epoch_time_1gpu)
            u.limit[key] = t.max_gpus + tb.max_gpus
        else:
            errs.append(f"{tid}: unknown mode {mode!r}")
            continue
        u.member_of[tid] = key
    return u


def _unit_of(label: str) -> Unit | None:
    """The unit a schedule's label names: ``a||b`` merged, ``a->b`` b after a, ``a``."""
    if "||" in label:
        return frozenset(p.strip() for p in label.split("||"))
    if "->" in label:
        return frozenset((label.split("->", 1)[1].strip(),))
    return frozenset((label,))


def _segment_alloc(i: int, seg: dict[str, Any], units: _Units, capacity: int,
                   errs: list[str]) -> dict[Unit, int]:
    """Segment ``i``'s GPUs per unit, each within its unit's limit and all within the
    capacity (a violation appends its error)."""
    alloc: dict[Unit, int] = {}
    for label, gpus in seg.get("gpus", {}).items():
        key = _unit_of(str(label))
        if key not in units.need:
            errs.append(f"segment {i}: unit {label!r} is not a chosen unit")
            continue
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            errs.append(f"segment {i}: {label} gets non-integer GPUs {gpus!r}")
            continue
        if gpus > min(units.limit[key], capacity):
            errs.append(f"segment {i}: {label} gets {gpus} > limit {min(units.limit[key], capacity)}")
        if gpus:
            alloc[key] = alloc.get(key, 0) + gpus
    if sum(alloc.values()) > capacity:
        errs.append(f"segment {i}: {sum(alloc.values())} GPUs > capacity {capacity}")
    return alloc


def _integrate(segs: list[dict[str, Any]], units: _Units, capacity: int,
               errs: list[str]) -> tuple[dict[Unit, Fraction], dict[Unit, Fraction]]:
    """Each unit's work done and completion time, integrating the segments in exact
    fractions, with the schedule's violations (gaps, changes with no completion, a unit
    running after it completed or before its predecessor did) appended."""
    need, pred, member_of = units.need, units.pred, units.member_of
    exact = all("start_exact" in s and "end_exact" in s for s in segs)
    done = {k: Fraction(0) for k in need}
    finished: dict[Unit, Fraction] = {}
    now = Fraction(0)
    prev: dict[Unit, int] | None = None
    for i, seg in enumerate(segs):
        start, end = _num(seg, "start"), _num(seg, "end")
        if not _close(start, now, exact):
            errs.append(f"segment {i}: starts at {start}, previous ended at {now}")
        if end <= start:
            errs.append(f"segment {i}: empty or reversed")
            continue
        alloc = _segment_alloc(i, seg, units, capacity, errs)
        if prev is not None and alloc != prev:
            ended_here = [k for k, t in finished.items() if _close(t, start, exact)]
            if not ended_here:
                errs.append(f"segment {i}: allocation changes at {start} with no completion")
        for key, gpus in alloc.items():
            if key in finished and finished[key] < end - (0 if exact else _TOL):
                errs.append(f"segment {i}: {sorted(key)} runs after completing")
            p = pred.get(key)
            if p is not None:
                pt = finished.get(member_of[p])
                if pt is None or pt > start + (0 if exact else _TOL):
                    errs.append(f"segment {i}: {sorted(key)} runs before {p} completes")
        for key, gpus in alloc.items():
            if key in finished:
                continue
            rate = Fraction(gpus)
            if done[key] + rate * (end - start) >= need[key] - (0 if exact else _TOL * need[key]):
                finished[key] = start + (need[key] - done[key]) / rate
                done[key] = need[key]
            else:
                done[key] += rate * (end - start)
        prev = alloc
        now = end
    return done, finished


def _check_reported_jcts(answer: dict[str, Any], modes: dict[str, Any],
                         jct: dict[str, Fraction], n_tasks: int, errs: list[str]) -> None:
    """The answer's per-task ``jct`` and its ``total_jct`` against the recomputed ones."""
    for tid, info in modes.items():
        if tid not in jct:
            continue
        reported = _num(info, "jct") if "jct" in info else None
        if reported is None or not _close(reported, jct[tid], "jct_exact" in info):
            errs.append(f"{tid}: reported jct {reported} != recomputed {jct[tid]}")
    if "total_jct" in answer and len(jct) == n_tasks:
        total = sum(jct.values(), Fraction(0))
        if not _close(_num(answer, "total_jct"), total, "total_jct_exact" in answer):
            errs.append(f"total_jct {answer['total_jct']} != recomputed {total}")
