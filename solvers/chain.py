"""A solver chain under one wall-clock budget.

Backends run in order, each warm-started from the best answer so far (the
model's hint: normally the greedy's first pass). Every answer is offered to an
``accept`` callback (decode + independent validation); the best accepted answer
wins. A backend that raises, times out without a solution, or returns something
the validator rejects is recorded in the attempts and skipped.

The budget is split so the chain answers well when time is short:

* ``auto`` on a large model (past ``LARGE_MODEL_COLUMNS`` columns) starts
  with LP relaxation and rounding (``lp-round``): a near-optimal answer and a
  bound in a small share of the budget (the cell model is a multiple-choice
  knapsack whose relaxation is near-integral); it may use at most
  ``LP_SHARE`` of what is left (all of a remainder under ``LP_ALL_BELOW_S`` on the
  clock: a HiGHS after it could not finish the same relaxation either); then HiGHS's
  branch and bound from that answer with everything left;
* on a model whose meta says ``lp_rounding_final`` (the cell model over GPUs) at a
  tolerance from ``LP_FIRST_GAP`` (the default), an answer of LP rounding ends the
  chain: HiGHS's branch and bound after it bettered the schedules of no held-out
  replay for more than half of a replay's CPU (``chain_rules.lp_rounding_final``);
  HiGHS still runs where LP rounding did not answer;
* on smaller models at a tolerance below ``LP_FIRST_GAP`` (``AUTO_ORDER``)
  ``auto`` starts with HiGHS for at most ``HIGHS_FIRST_SHARE`` of the budget
  (most rounds are proved optimal well inside it), then LP rounding, then
  HiGHS again from the best answer with everything left, and CP-SAT only if
  HiGHS failed. LP rounding *first* there answers within
  ``MIP_REL_GAP`` of the bound just as well, but among near-equal answers it
  picks different ones, and replays showed they schedule worse: Philly day 1
  on the 1,280-GPU cluster, average JCT 3,754 s with LP rounding first vs
  3,241 s with HiGHS first, the same code otherwise (main before: 3,289 s;
  experiments/results/bench/speed.md; measured at the 0.01 % tolerance with
  the objective of that time; see the default below). LP rounding *second* is for the busy
  rounds HiGHS cannot finish: there its branch and bound, given a second or
  two, often has not moved from its greedy start (20-50 % below the LP bound
  on the Philly replay's backlog rounds), while the rounded LP's restricted
  MIP is within about 1 % in a fraction of a second;
* the chain stops as soon as an accepted answer is optimal or within
  ``gap`` of the best bound any backend proved (the LP's, say), so a round
  whose rounded LP is already within the tolerance never waits for a MIP.
  The same ``gap`` is every MIP backend's own tolerance (HiGHS's
  ``mip_rel_gap``). The default ``MIP_REL_GAP`` is ``LP_FIRST_GAP`` (0.1 %, the
  round target issue 16 names): there the rounded LP answers about half of a
  replay's rounds on its own and goes first (``AUTO_TOLERANT_ORDER``). Below
  it (``--mip-gap 1e-4``, say) the rounded LP is rarely final (the
  relaxation's bound is about 0.1 % above the integer optimum even where the
  rounding found that optimum), so HiGHS goes first (``AUTO_ORDER``). The
  14-day Philly replay at 0.1 % used 0.73x the CPU of 0.01 % at an average JCT
  0.17 % lower; the quality tables were re-measured with it
  (experiments/results/bench/speed.md, experiments/results/quality/);
* HiGHS in a chain stops once its incumbent has not improved for
  ``HIGHS_STALL_SHARE`` of its share (at least ``highs.MIN_STALL_S``), and
  CP-SAT runs only if HiGHS failed. In the 14-day replay 15 % of the rounds
  ran HiGHS to the end of the budget, 54 % of the replay's wall; in 60 % of
  them HiGHS never improved on LP rounding's answer.

A **deterministic budget** (``work_s``): each backend is told its share of a work budget
in nominal seconds (``base.WORK_PER_S``) and the chain deducts what each reports using, so
neither the shares nor when HiGHS stops depend on the clock, and a replay repeats exactly
on any machine under any load; ``budget_s`` then is only a safety stop, and an answer it
cut short says so (``extra["time_limited"]``). It runs the backends in this process.

A **session** (:class:`~apportion.solvers.persistent.HighsSession`): a caller that lives
across rounds (a replay's, ``run``'s or ``serve``'s policy, with
``RoundConfig.persistent``) may keep its LP relaxation in HiGHS between rounds, and LP
rounding then re-solves it from the last basis after the round's changes instead of
building it afresh (:mod:`apportion.solvers.persistent`, which says why it is not the
default). It runs the backends in this process; a one-off round and an isolated chain
start afresh.

Isolated backends (:class:`~apportion.solvers.isolation.IsolatedBackend`) run
in one child process for the whole chain (started early by the caller if it
likes, so its imports overlap the round's candidates), which streams each
answer back as soon as it has it and is killed at the deadline: a crash or a
hang costs the answers not yet sent, never the round, and never the budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from apportion.formulations.model import LinearModel
from apportion.solvers.base import BACKEND_CLASSES, Backend, SolveResult, Status, proven_gap
from apportion.solvers.chain_rules import (
    LARGE_MODEL_COLUMNS,
    LP_FIRST_GAP,
    better,
    for_chain,
    share,
    skipped,
    tighter,
    time_share,
)
from apportion.solvers.highs import HighsBackend
from apportion.solvers.isolation import ChainChild, IsolatedBackend, resolve_backend
from apportion.solvers.persistent import HighsSession

log = logging.getLogger(__name__)


def _factory(name: str) -> Callable[[], Backend]:
    def build() -> Backend:
        return resolve_backend(name)
    return build


BACKENDS: dict[str, Callable[[], Backend]] = {n: _factory(n) for n in BACKEND_CLASSES}
# see the module docstring: HiGHS first schedules better; LP rounding rescues the rounds it
# cannot finish; HiGHS again from the best; CP-SAT only if HiGHS failed
AUTO_ORDER = ("highs", "lp-round", "highs", "cp-sat")
# past this many columns an in-process HiGHS runs without presolve. Its presolve is the
# one part of its work that neither the stall rule nor a deterministic budget sees (the
# MIP callbacks start after it), and on the replays' busy rounds it is most of HiGHS's
# time: on the 11 rounds of 8,000-20,000 columns where HiGHS ran after LP rounding in the
# first 150 rounds of `bench sim --days 1` (captured, re-solved with the chain, work budget
# 2 s) the same answers came in 0.3-0.5 s of HiGHS instead of 0.7-3.4 s. Below it presolve
# pays: HiGHS proves or improves more of those rounds with it (3 of 17 rounds of
# 2,000-7,000 columns ran 3-10x longer without it).
PRESOLVE_OFF_COLUMNS = 8000
AUTO_LARGE_ORDER = ("lp-round", "highs")
MIP_REL_GAP = 1e-3  # an answer this close to the best proven bound is final (``--mip-gap``)
AUTO_TOLERANT_ORDER = ("lp-round", "highs", "cp-sat")


def chain_names(name: str, columns: int = 0, gap: float = MIP_REL_GAP,
                first: str | None = None) -> tuple[str, ...]:
    """The backends' names, in order: ``auto`` -> ``AUTO_ORDER`` (``AUTO_LARGE_ORDER`` past
    ``LARGE_MODEL_COLUMNS`` columns, ``AUTO_TOLERANT_ORDER`` from a ``gap`` of
    ``LP_FIRST_GAP``; ``first``, a model's own first backend (``meta["solve_first"]``: the
    plans master's column generation), then HiGHS); a single name -> that backend;
    ``greedy`` -> none."""
    if name == "auto" and first is not None:
        return (first, "highs")
    if name == "auto":
        return (AUTO_LARGE_ORDER if columns > LARGE_MODEL_COLUMNS else
                AUTO_TOLERANT_ORDER if gap >= LP_FIRST_GAP else AUTO_ORDER)
    if name == "greedy":
        return ()
    if name in BACKENDS:
        return (name,)
    raise ValueError(f"unknown backend {name!r}; choose auto, cp-sat, highs, lp-round, "
                     "colgen, scip or greedy")


def backends_for(name: str, isolate: bool = False, columns: int = 0,
                 gap: float = MIP_REL_GAP, first: str | None = None) -> list[Backend]:
    """The chain's backends (their names: :func:`chain_names`).

    ``isolate`` runs the backends in a child process (:mod:`apportion.solvers.isolation`):
    a segfault, abort or hang in a solver then costs only that backend's answer.
    """
    names = chain_names(name, columns, gap, first)
    if not names:
        return []
    if isolate:
        return [IsolatedBackend(n) for n in names]
    if columns > PRESOLVE_OFF_COLUMNS and "highs" in names:
        # in this process HiGHS must stop at its limit: its presolve builds a clique partition
        # of the objective that never looks at the clock (28-84 s on an 85,000-column round
        # given 8 s); without presolve it keeps to the limit. An isolated HiGHS keeps its
        # presolve: its child is killed at the deadline.
        return [HighsBackend(presolve="off") if n == "highs" else BACKENDS[n]() for n in names]
    return [BACKENDS[n]() for n in names]


def _hint_answer(model: LinearModel) -> SolveResult | None:
    """The model's hint as an answer to beat, if it is a complete feasible solution."""
    hint = model.hint
    if not hint or len(hint) < model.num_vars:
        return None
    x = np.zeros(model.num_vars)
    for k, v in hint.items():
        x[k] = v
    if not model.is_feasible(x):
        return None
    return SolveResult("hint", Status.FEASIBLE, objective=model.objective_value(x), x=x)


def _in_process(model: LinearModel, backends: Sequence[Backend], deadline: float,
                gap: float = MIP_REL_GAP, work_s: float | None = None,
                session: HighsSession | None = None) -> Iterator[SolveResult]:
    """Each backend in turn in this process, with its share of what is left (of the work
    budget ``work_s`` when there is one, else of the time to ``deadline``); a backend
    that solves an LP relaxation (LP rounding) solves it in ``session`` when there is one."""
    names = [b.name for b in backends]
    answered: set[str] = set()
    rounding_final = bool(model.meta.get("lp_rounding_final"))
    for i, be in enumerate(backends):
        for_chain(be, gap)
        be.keep_relaxation(session)
        left = deadline - time.perf_counter()
        why = "no budget left" if left <= 0.01 else skipped(names, i, answered, gap,
                                                                 rounding_final)
        if work_s is not None and not why:
            why = "no work budget left" if work_s <= 0.01 else None
            if be.counts_work:
                be.work_s = share(names, i, work_s)
        if why:
            yield SolveResult(be.name, Status.SKIPPED, message=why)
            continue
        if not be.available():
            yield SolveResult(be.name, Status.ERROR, message="backend not installed")
            continue
        try:
            # with a work budget the clock is a safety stop, but a backend that cannot
            # count its work (SCIP) keeps its share of the time
            counted = work_s is not None and be.counts_work
            res = be.solve(model, left if counted else time_share(names, i, left))
        except Exception as exc:  # a crash in one backend must not take the round down
            log.warning("backend %s raised %r", be.name, exc)
            res = SolveResult(be.name, Status.ERROR, message=f"raised {exc!r}")
        if work_s is not None:
            # a backend that cannot count its work (SCIP) is charged its share
            work_s -= float(res.extra.get("work_s", share(names, i, work_s)))
        if res.x is not None and res.status.has_solution:
            answered.add(be.name)
        yield res


def solve_chain(model: LinearModel, backends: Sequence[Backend], budget_s: float,
                accept: Callable[[SolveResult], bool] | None = None,
                gap: float = MIP_REL_GAP, child: Any = None,
                meanwhile: Callable[[], Any] | None = None, work_s: float | None = None,
                session: HighsSession | None = None
                ) -> tuple[SolveResult | None, list[SolveResult]]:
    """(best accepted result or None, every attempt in order).

    ``session``: an LP kept alive across rounds by the caller (a replay's or ``run``'s
    policy: :mod:`apportion.solvers.persistent`), for the backends that solve a relaxation;
    None: every LP is built afresh (a one-off round). In-process backends only: an
    isolated child starts from nothing each round.

    ``work_s``: a deterministic budget (see the module docstring); ``budget_s`` is then a
    safety stop only. Isolated backends cannot take one (their child runs on the clock).

    ``child``: a started :class:`~apportion.solvers.isolation.ChainChild` to run
    isolated backends in (one is started here if the backends are isolated and none is
    given); it is closed before returning. ``meanwhile`` runs once the chain is under way:
    while an isolated child solves, or before in-process backends start.
    """

    start = time.perf_counter()
    deadline = start + budget_s
    best: SolveResult | None = None
    floor = _hint_answer(model)  # the hint (the greedy's answer): replaced only by a better one
    bound: float | None = None
    attempts: list[SolveResult] = []
    isolated = [b for b in backends if isinstance(b, IsolatedBackend)]
    if work_s is not None and isolated:
        raise ValueError("a deterministic budget runs the backends in this process: "
                         "isolated backends cannot take one")
    if isolated and len(isolated) == len(backends):
        child = child or ChainChild(grace_s=isolated[0].grace_s)
        stream: Iterator[SolveResult] = child.run(model, [b.inner for b in isolated], deadline, gap)
    else:
        if child is not None:
            child.close()
            child = None
        stream = _in_process(model, backends, deadline, gap, work_s, session)
    try:
        if meanwhile is not None:
            meanwhile()
        for res in stream:
            attempts.append(res)
            if res.x is None or not res.status.has_solution:
                continue
            if accept is not None and not accept(res):
                res.message += " (rejected by the validator)"
                res.status = Status.ERROR
                continue
            bound = tighter(bound, res, model.sense)
            # a proof of an answer as good as the best so far is the better report
            proof = res.status is Status.OPTIMAL and best is not None and \
                not better(best, res, model.sense)
            if better(res, best, model.sense) or proof:
                best = res
                if floor is None or better(res, floor, model.sense):
                    floor = None  # the next backend starts from the best
                    model.set_hint(np.asarray(res.x, float))
            g = proven_gap(best, bound, model.sense)
            if res.status is Status.OPTIMAL or (g is not None and g <= gap):
                break
    finally:
        if child is not None:
            child.close()
    return best, attempts
