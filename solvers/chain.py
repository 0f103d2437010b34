"""A solver chain under one wall-clock budget.

Backends run in order, each with the budget that is left, all warm-started
from the model's hint (normally the greedy answer). Every answer is offered to
an ``accept`` callback (decode + independent validation); the best accepted
answer wins. A backend that raises, times out without a solution, or returns
something the validator rejects is recorded in the attempts and skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from apportion.formulations.model import LinearModel
from apportion.solvers.base import BACKEND_CLASSES, Backend, SolveResult, Status

log = logging.getLogger(__name__)

def _factory(name: str) -> Callable[[], Backend]:
    def build() -> Backend:
        from apportion.solvers.isolation import resolve_backend

        return resolve_backend(name)
    return build


BACKENDS: dict[str, Callable[[], Backend]] = {n: _factory(n) for n in BACKEND_CLASSES}
AUTO_ORDER = ("highs", "cp-sat")
# past this many columns CP-SAT rarely beats its hint in seconds, while the LP relaxation
# is near-integral: answer from it first, then let HiGHS improve from that hint
LARGE_MODEL_COLUMNS = 20000
AUTO_LARGE_ORDER = ("lp-round", "highs")


def backends_for(name: str, isolate: bool = False, columns: int = 0) -> list[Backend]:
    """``auto`` -> HiGHS then CP-SAT (LP rounding then HiGHS for models past
    ``LARGE_MODEL_COLUMNS`` columns); a single name -> that backend; ``greedy`` -> none.

    ``isolate`` runs each backend in a child process (:mod:`apportion.solvers.isolation`):
    a segfault, abort or hang in a solver then costs only that backend's answer.
    """
    if name == "auto":
        names: tuple[str, ...] = AUTO_LARGE_ORDER if columns > LARGE_MODEL_COLUMNS else AUTO_ORDER
    elif name == "greedy":
        return []
    elif name in BACKENDS:
        names = (name,)
    else:
        raise ValueError(f"unknown backend {name!r}; choose auto, cp-sat, highs or greedy")
    if isolate:
        from apportion.solvers.isolation import IsolatedBackend

        return [IsolatedBackend(n) for n in names]
    return [BACKENDS[n]() for n in names]


def _better(a: SolveResult, b: SolveResult | None, sense: str) -> bool:
    if b is None or b.objective is None:
        return True
    assert a.objective is not None
    return a.objective > b.objective + 1e-9 if sense == "max" else a.objective < b.objective - 1e-9


def solve_chain(model: LinearModel, backends: Sequence[Backend], budget_s: float,
                accept: Callable[[SolveResult], bool] | None = None
                ) -> tuple[SolveResult | None, list[SolveResult]]:
    """(best accepted result or None, every attempt in order)."""
    start = time.perf_counter()
    best: SolveResult | None = None
    attempts: list[SolveResult] = []
    for be in backends:
        left = budget_s - (time.perf_counter() - start)
        if left <= 0.01:
            attempts.append(SolveResult(be.name, Status.ERROR, message="no budget left"))
            continue
        if not be.available():
            attempts.append(SolveResult(be.name, Status.ERROR, message="backend not installed"))
            continue
        try:
            res = be.solve(model, left)
        except Exception as exc:  # a crash in one backend must not take the round down
            log.warning("backend %s raised %r", be.name, exc)
            res = SolveResult(be.name, Status.ERROR, message=f"raised {exc!r}")
        attempts.append(res)
        if res.x is None or not res.status.has_solution:
            continue
        if accept is not None and not accept(res):
            res.message += " (rejected by the validator)"
            res.status = Status.ERROR
            continue
        if _better(res, best, model.sense):
            best = res
            model.set_hint(dict(enumerate(res.x)))  # the next backend starts from the best so far
        if res.status is Status.OPTIMAL:
            break
    return best, attempts
