"""Canonical solver status, the result every backend returns, and the class every backend
derives from (:class:`Backend`: what a solver chain asks of a backend, declared once).

A time-limited feasible answer is an answer (``feasible``), not an error: the
canonical statuses follow cvxpy's map for HiGHS. ``fallback`` marks answers
produced by a greedy heuristic because no exact backend answered in time.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import numpy as np

from apportion.formulations.model import LinearModel


class Status(str, Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    FALLBACK = "fallback"
    ERROR = "error"
    #: a backend the chain did not run (an earlier one answered, no budget was left): not a
    #: failure, so an alert on errors does not fire on every round
    SKIPPED = "skipped"

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE, Status.FALLBACK)


@dataclass
class SolveResult:
    """What a backend found: status, solution vector, objective, bound and timing."""

    backend: str
    status: Status
    x: np.ndarray | None = None
    objective: float | None = None
    bound: float | None = None
    wall_s: float = 0.0
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap |bound - objective| / max(1, |objective|), or None."""
        if self.objective is None or self.bound is None:
            return None
        if not (math.isfinite(self.objective) and math.isfinite(self.bound)):
            return None
        return abs(self.bound - self.objective) / max(1.0, abs(self.objective))

    def as_dict(self) -> dict[str, Any]:
        out = {
            "backend": self.backend,
            "status": self.status.value,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            "wall_s": round(self.wall_s, 6),
            "message": self.message,
        }
        # a deterministic budget's accounting (solvers.chain): the work used, and whether
        # the clock (its safety stop) cut the backend short
        for key in ("work_s", "time_limited"):
            if key in self.extra:
                out[key] = self.extra[key]
        return out


def proven_gap(best: SolveResult | None, bound: float | None, sense: str) -> float | None:
    """Relative gap of ``best`` to the tightest bound proved so far (None: no bound): one
    rule for the chain's stop and a backend's own early answer (LP rounding)."""
    if best is None:
        return None
    return objective_gap(best.objective, bound, sense)


def objective_gap(objective: float | None, bound: float | None, sense: str) -> float | None:
    """Relative gap of an answer's ``objective`` to a proven ``bound`` of the same model
    (None: either is missing): the one rule, whichever method found the answer."""
    if objective is None or bound is None:
        return None
    diff = bound - objective if sense == "max" else objective - bound
    return max(0.0, diff) / max(1.0, abs(objective))


# A deterministic budget (``solve_chain(work_s=...)``, ``RoundConfig.deterministic``) counts
# a backend's work, not the clock, so a replay repeats exactly on any machine and under any
# load. HiGHS's unit of work is one of its MIP interrupt callbacks times the model's columns
# (callbacks come at fixed points of its single-threaded search; one costs about as much as
# the model is wide). WORK_PER_S converts a budget in seconds into units: measured on this
# project's 2-core machine over the HiGHS runs of Philly day 1 and day 4 replays (1,300 to
# 70,000 columns), 0.9-2.7e5 units per second, about 2e5 typically. A backend told a
# ``work_s`` reports what it used in ``extra["work_s"]`` (seconds of that nominal rate).
WORK_PER_S = 2.0e5

# Every solver backend by name, once: the chain builds them in-process and the isolation
# layer in a child process, both from this table ("module:Class", imported when used).
BACKEND_CLASSES = {"highs": "apportion.solvers.highs:HighsBackend",
                   "cp-sat": "apportion.solvers.cpsat:CpSatBackend",
                   "lp-round": "apportion.solvers.lpround:LpRoundBackend",
                   "scip": "apportion.solvers.scip:ScipBackend",
                   "colgen": "apportion.solvers.colgen:ColGenBackend"}


class Backend(ABC):
    """A solver backend: consumes a neutral :class:`LinearModel` under a budget.

    Every backend derives from this class, which declares all that a solver chain
    (:mod:`apportion.solvers.chain`, and its isolated child) asks of one, so the chain calls
    a backend's methods and never probes its attributes: its tolerance and stall rule
    (:meth:`join_chain`), an LP kept across rounds (:meth:`keep_relaxation`), and a share
    of a deterministic budget (:attr:`work_s`, for a backend that :attr:`counts_work`).
    Each default is what a backend without that setting does: it keeps its own rule.
    """

    name: str
    #: whether :meth:`solve` counts its work, so that :attr:`work_s` bounds it (CP-SAT's
    #: deterministic time, HiGHS's callbacks); a backend that cannot (SCIP) keeps its share
    #: of the clock under a deterministic budget and is charged its share of the work
    counts_work: ClassVar[bool] = False
    #: its share of a deterministic budget, in nominal seconds (:data:`WORK_PER_S`), set by
    #: a chain that has one (None: the clock bounds it); read only where :attr:`counts_work`
    work_s: float | None = None

    def available(self) -> bool:
        """Whether its solver is installed here."""
        return True

    @abstractmethod
    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        """The model's best answer found within ``time_limit_s`` (or :attr:`work_s`)."""

    def join_chain(self, gap: float, stall_share: float | None) -> None:
        """Take a chain's tolerance (an answer within ``gap`` of the proven bound is final)
        and its stall rule (stop once the incumbent has not improved for ``stall_share`` of
        the time), where the backend has them; by default it has neither (CP-SAT)."""

    def keep_relaxation(self, session: Any) -> None:
        """Solve the LP relaxation in ``session`` (a
        :class:`~apportion.solvers.persistent.HighsSession` kept across rounds; None: build
        it afresh), for a backend that solves one; by default it solves none."""


def empty_model_result(backend: str, model: LinearModel, start: float) -> SolveResult:
    """A model with no variables: nothing to decide, trivially optimal."""
    import time

    return SolveResult(backend, Status.OPTIMAL, np.zeros(0), model.obj_constant,
                       model.obj_constant, time.perf_counter() - start, message="empty model")
