"""Solve YMIR's mode + GPU choice: exact MILP under a budget, greedy SRTF + merger fallback.

Method. Up to ``EXACT_MAX_TASKS`` tasks the MILP of
:mod:`apportion.formulations.finetune` is solved with SCIP under the time budget,
warm-started from the greedy answer; its decoded plan is re-run in exact
fractions. Beyond that size, or when SCIP returns nothing, the greedy answers:

* **SRTF** for a fixed set of units: at time 0 and at every completion, eligible
  units (temporal ones only once their predecessor has completed) are sorted by
  remaining time at their GPU limit and given GPUs up to that limit in that order;
* **merger rule** for the modes: starting from all-normal, repeatedly apply the
  single change (merge a positive-gain pair, or start a task from a sibling's
  weights) that lowers the SRTF total JCT most, until no change helps — the
  paper's task merger, which merges only when the merged JCT beats the separate
  ones against the whole queue.

Every answer goes through the independent validator before it is returned.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from apportion.formulations.finetune import (
    NORMAL,
    SPATIAL,
    TEMPORAL,
    PhasePlan,
    PlanError,
    Schedule,
    Unit,
    build_finetune_model,
    candidate_units,
    plan_hint,
    simulate_plan,
)
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.finetune_validator import validate_finetune_answer
from apportion.solvers.scip import ScipBackend

from apportion.finetune_spec import (
    SPATIAL_SEP,
    TEMPORAL_SEP,
    FinetuneProblem,
    load_finetune_problem,
)

log = logging.getLogger(__name__)

#: Largest task count the exact MILP is attempted on (time-limited beyond ~5 tasks).
#: U x n x (G+1) binaries (U candidate units, n tasks, G = GPU limit). Measured with SCIP
#: on random instances (30 % of pairs related, capacity 4): 4 tasks 0.5-1 s, 5 tasks
#: 7-23 s, 6 tasks 38 s to proven optimality (HiGHS: 0.5-1 s, 8-31 s, 42 s); past the
#: budget the incumbent vs greedy decides.
EXACT_MAX_TASKS = 6


# --------------------------------------------------------------------------- greedy
def srtf_plan(units: list[Unit], capacity: int) -> PhasePlan:
    """SRTF over a fixed unit set; reallocates only at completions."""
    owner = {m: u.key for u in units for m in u.members}
    remaining = {u.key: u.work for u in units}
    done: set[str] = set()
    order: list[str] = []
    allocs: list[dict[str, int]] = []
    while len(done) < len(units):
        eligible = [u for u in units if u.key not in done
                    and (u.pred is None or owner[u.pred] in done)]
        if not eligible:
            raise ValueError("temporal predecessors form a cycle")
        eligible.sort(key=lambda u: (remaining[u.key] / min(u.max_gpus, capacity), u.key))
        free = capacity
        alloc: dict[str, int] = {}
        for u in eligible:
            a = min(u.max_gpus, free)
            if a > 0:
                alloc[u.key] = a
                free -= a
        zero = [u.key for u in eligible if remaining[u.key] == 0]
        if zero:
            for key in sorted(zero):
                order.append(key)
                allocs.append({})
                done.add(key)
            continue
        times = {k: remaining[k] / a for k, a in alloc.items()}
        tmin = min(times.values())
        finishers = sorted(k for k, t in times.items() if t == tmin)
        for k, a in alloc.items():
            remaining[k] -= a * tmin
        order.append(finishers[0])
        allocs.append(alloc)
        for k in finishers[1:]:
            order.append(k)
            allocs.append({})
        done.update(finishers)
    return PhasePlan(list(units), order, allocs)


def greedy_modes(problem: FinetuneProblem, capacity: int,
                 candidates: list[Unit] | None = None) -> tuple[Schedule, PhasePlan]:
    """The merger rule: best-improvement local search over modes, scored by SRTF."""
    candidates = candidates if candidates is not None else candidate_units(problem)
    singles = {u.key: u for u in candidates if u.mode == NORMAL}
    current: dict[str, Unit] = {t: singles[t] for t in problem.ids}  # task -> unit

    def score(assign: dict[str, Unit]) -> tuple[Fraction, PhasePlan, Schedule]:
        units = list({u.key: u for u in assign.values()}.values())
        plan = srtf_plan(units, capacity)
        sched = simulate_plan(plan, capacity)
        return sched.total_jct, plan, sched

    best, best_plan, best_sched = score(current)
    while True:
        move: tuple[Fraction, dict[str, Unit], PhasePlan, Schedule] | None = None
        for u in candidates:
            if u.mode == NORMAL:
                continue
            if any(current[m].mode != NORMAL for m in u.members):
                continue
            preds_of = {v.pred for v in current.values() if v.pred is not None}
            if u.mode == SPATIAL and any(m in preds_of for m in u.members):
                continue
            if u.mode == TEMPORAL:
                if current[u.pred].mode == SPATIAL:
                    continue
                if _cycle(current, u):
                    continue
            trial = dict(current)
            for m in u.members:
                trial[m] = u
            total, plan, sched = score(trial)
            if total < best and (move is None or total < move[0]):
                move = (total, trial, plan, sched)
        if move is None:
            break
        best, current, best_plan, best_sched = move
    best_sched.meta["method"] = "greedy"
    return best_sched, best_plan


def _cycle(current: dict[str, Unit], u: Unit) -> bool:
    """Would making ``u.members[0]`` start after ``u.pred`` close a temporal cycle?"""
    seen: set[str] = set()
    cur: str | None = u.pred
    while cur is not None and cur not in seen:
        if cur == u.members[0]:
            return True
        seen.add(cur)
        cur = current[cur].pred
    return False


# --------------------------------------------------------------------------- exact
@dataclass
class FinetuneAnswer:
    """The chosen schedule, how it was found, and the solver's report."""

    schedule: Schedule
    status: Status
    method: str
    greedy_total: Fraction
    solve: SolveResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def solve_exact(problem: FinetuneProblem, capacity: int, time_budget_s: float,
                warm: PhasePlan | None = None,
                node_limit: int | None = None) -> tuple[Schedule | None, SolveResult]:
    """Solve the MILP with SCIP; returns the exactly re-simulated schedule (or None).

    Not HiGHS: on this model (big-M rows tie continuous phase lengths to one-hot GPU
    counts) HiGHS 1.14 proved wrong optima with its presolve (table 9, one GPU: 50
    where 40 runs) and without (three tasks: 88/5 where 33/2 runs); SCIP matched the
    exhaustive search of the tests on every instance of the sweeps that found those."""
    model = build_finetune_model(problem, capacity)
    if warm is not None:
        try:
            model.set_hint(plan_hint(model, warm, capacity))
        except (PlanError, KeyError, IndexError) as exc:  # a bad hint must not cost the answer
            log.debug("warm start dropped: %r", exc)
    log.info("finetune MILP: %s", model.summary())
    res = ScipBackend(mip_rel_gap=1e-9, node_limit=node_limit).solve(model, time_budget_s)
    if not res.status.has_solution or res.x is None or model.decode is None:
        return None, res
    plan = model.decode(res.x)
    try:
        sched = simulate_plan(plan, capacity)
    except PlanError as exc:  # never act on a decode that does not run; greedy answers
        log.error("MILP plan does not run: %s", exc)
        return None, res
    sched.meta["method"] = "milp-scip"
    return sched, res


def solve_finetune(problem: FinetuneProblem, capacity: int, time_budget_s: float = 10.0,
                   node_limit: int | None = None) -> FinetuneAnswer:
    """Greedy first (always available), then the exact MILP when the size allows;
    ``node_limit`` bounds SCIP's work (its status then repeats on any machine, the time
    budget a safety stop)."""
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    t0 = time.perf_counter()
    greedy, gplan = greedy_modes(problem, capacity)
    answer = FinetuneAnswer(greedy, Status.FALLBACK, "greedy", greedy.total_jct)
    n = len(problem.tasks)
    if n > EXACT_MAX_TASKS:
        answer.extra["reason"] = f"{n} tasks > exact limit {EXACT_MAX_TASKS}"
        return answer
    budget = max(0.05, time_budget_s - (time.perf_counter() - t0))
    sched, res = solve_exact(problem, capacity, budget, warm=gplan, node_limit=node_limit)
    answer.solve = res
    if sched is None:
        answer.extra["reason"] = f"MILP gave no solution ({res.status.value}: {res.message})"
        return answer
    answer.extra["milp_total"] = sched.total_jct
    if sched.total_jct <= greedy.total_jct:
        check = validate_finetune_answer(problem, capacity, to_output(sched, capacity))
        if check.ok:
            answer.schedule, answer.method = sched, "milp-scip"
            answer.status = Status.OPTIMAL if res.status is Status.OPTIMAL else Status.FEASIBLE
            return answer
        log.error("MILP answer failed validation: %s", check.errors[:3])
        answer.extra["reason"] = "MILP answer failed validation"
        return answer
    # time-limited MILP worse than greedy: keep greedy, report feasible-not-optimal
    answer.status = Status.FEASIBLE
    answer.extra["reason"] = "MILP incumbent worse than greedy"
    return answer


# --------------------------------------------------------------------------- output
def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def to_output(sched: Schedule, capacity: int) -> dict[str, Any]:
    """The contract dict: mode and ``jct`` per task, ``total_jct``, plus the schedule."""
    tasks: dict[str, Any] = {}
    starts: dict[str, Fraction] = {}
    for s, _e, alloc in sched.segments:
        for k in alloc:
            starts.setdefault(k, s)
    for u in sched.units:
        for m in u.members:
            entry: dict[str, Any] = {"mode": u.mode, "unit": u.key}
            if u.mode == TEMPORAL:
                entry["after"] = u.pred
            if u.mode == SPATIAL:
                entry["with"] = next(x for x in u.members if x != m)
            entry["gain"] = float(u.gain)
            entry["start"] = float(starts.get(u.key, sched.completion[u.key]))
            entry["jct"] = float(sched.jct[m])
            entry["jct_exact"] = _fmt(sched.jct[m])
            tasks[m] = entry
    return {
        "capacity": capacity,
        "tasks": tasks,
        "total_jct": float(sched.total_jct),
        "total_jct_exact": _fmt(sched.total_jct),
        "schedule": [
            {"start": float(s), "end": float(e), "start_exact": _fmt(s), "end_exact": _fmt(e),
             "gpus": dict(sorted(a.items()))}
            for s, e, a in sched.segments
        ],
    }


def answer_output(problem: FinetuneProblem, answer: FinetuneAnswer, capacity: int) -> dict[str, Any]:
    """Validated output dict with the solver report attached."""
    out = to_output(answer.schedule, capacity)
    check = validate_finetune_answer(problem, capacity, out)
    if not check.ok:
        raise RuntimeError(f"finetune answer failed validation: {check.errors}")
    out["status"] = answer.status.value
    out["method"] = answer.method
    out["greedy_total_jct"] = float(answer.greedy_total)
    out["exact_max_tasks"] = EXACT_MAX_TASKS
    out["validated"] = True
    if answer.solve is not None:
        out["solver"] = answer.solve.as_dict()
    if "milp_total" in answer.extra:
        out["milp_total_jct"] = float(answer.extra["milp_total"])
    if "reason" in answer.extra:
        out["note"] = answer.extra["reason"]
    return out


#: Largest epochs, one-GPU epoch time and their product (GPU-time of a task) accepted:
#: the answer is exact (fractions) but its floats, the MILP and the greedy are not, and
#: 1e300 epochs overflowed float conversion. 1e9 s is about 31 years.
MAX_EPOCHS = 1e6
MAX_EPOCH_TIME = 1e9
MAX_TASK_WORK = 1e12
MAX_CAPACITY = 1_000_000


def check_magnitudes(problem: FinetuneProblem, source: str) -> None:
    """Refuse numbers whose sizes no solver here can use, naming the field."""
    from apportion.errors import InputError

    for i, t in enumerate(problem.tasks):
        if t.epochs > MAX_EPOCHS:
            raise InputError(source, f"tasks[{i}].epochs", f"{float(t.epochs):g} is more than "
                             f"{MAX_EPOCHS:g} epochs")
        if t.epoch_time_1gpu > MAX_EPOCH_TIME:
            raise InputError(source, f"tasks[{i}].epoch_time_1gpu", f"{float(t.epoch_time_1gpu):g}"
                             f" is more than {MAX_EPOCH_TIME:g}")
        if t.epochs * t.epoch_time_1gpu > MAX_TASK_WORK:
            raise InputError(source, f"tasks[{i}].epochs", f"epochs x epoch_time_1gpu = "
                             f"{float(t.epochs * t.epoch_time_1gpu):g} is more than "
                             f"{MAX_TASK_WORK:g} GPU-time units")


GAINS_SOURCES = ("file", "auto")


def with_auto_gains(problem: FinetuneProblem, probe_kw: dict[str, Any] | None = None
                    ) -> tuple[FinetuneProblem, dict[str, Any]]:
    """The problem with Task2Vec-predicted gains added (``--gains auto``).

    Gains the file gives are measurements: they are kept as they are and calibrate the
    score-to-gain map; every other pair of tasks with ``data`` gets the predicted gain
    when positive (negative combinations are filtered, as YMIR does). Returns the new
    problem and the report for the output's ``gains_auto``."""
    from apportion.estimation.finetune.transferability import auto_gains

    measured: dict[str, dict[str, float]] = {
        "temporal": {f"{a}{TEMPORAL_SEP}{b}": float(g) for (a, b), g in problem.temporal.items()},
        "spatial": {SPATIAL_SEP.join(sorted(p, key=problem.ids.index)): float(g)
                    for p, g in problem.spatial.items()}}
    rows = [(t.id, problem.data_path(t), f"tasks[{i}].data") for i, t in enumerate(problem.tasks)]
    auto = auto_gains(rows, measured, probe_kw)
    temporal = dict(problem.temporal)
    spatial = dict(problem.spatial)
    added: dict[str, dict[str, float]] = {"temporal": {}, "spatial": {}}
    for key, g in auto.temporal.items():
        a, b = key.split(TEMPORAL_SEP)
        if (a, b) not in temporal:
            temporal[(a, b)] = Fraction(str(g))
            added["temporal"][key] = g
    for key, g in auto.spatial.items():
        pair = frozenset(key.split(SPATIAL_SEP))
        if pair not in spatial:
            spatial[pair] = Fraction(str(g))
            added["spatial"][key] = g
    report = auto.report()
    report["added"] = added
    report["kept_from_file"] = measured
    return FinetuneProblem(problem.tasks, temporal, spatial, problem.source), report


def solve_finetune_file(tasks_path: str, capacity: int, time_budget_s: float = 10.0,
                        gains: str = "file") -> dict:
    """`apportion solve-finetune`: read and validate the task file, solve, validate, answer.

    ``gains="auto"`` adds the gains the Task2Vec probe predicts from each task's
    ``data`` (:func:`with_auto_gains`); the output then holds ``gains`` (every gain the
    solver used) and ``gains_auto`` (how they were obtained, and which tasks had none)."""
    from apportion.errors import InputError

    if gains not in GAINS_SOURCES:
        raise InputError("--gains", "gains", f"{gains!r} is not one of {', '.join(GAINS_SOURCES)}")
    problem = load_finetune_problem(tasks_path)
    check_magnitudes(problem, str(tasks_path))
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not \
            1 <= capacity <= MAX_CAPACITY:
        raise InputError("--capacity", "capacity", f"must be an integer in 1..{MAX_CAPACITY}")
    if not (isinstance(time_budget_s, (int, float)) and math.isfinite(time_budget_s)
            and time_budget_s > 0):
        raise InputError("--time-budget", "time_budget", f"must be a positive number of "
                         f"seconds, got {time_budget_s!r}")
    report = None
    if gains == "auto":
        problem, report = with_auto_gains(problem)
    answer = solve_finetune(problem, capacity, time_budget_s)
    out = answer_output(problem, answer, capacity)
    if report is not None:
        out["gains"] = {
            "temporal": {f"{a}{TEMPORAL_SEP}{b}": float(g) for (a, b), g in problem.temporal.items()},
            "spatial": {SPATIAL_SEP.join(sorted(p, key=problem.ids.index)): float(g)
                        for p, g in problem.spatial.items()}}
        out["gains_auto"] = report
    return out
