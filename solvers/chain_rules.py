"""The solver chain's rules, shared by the chain in this process (:mod:`.chain`) and the
chain in an isolated child (:mod:`.isolation`): how much of the budget each backend gets,
which backend is skipped, how a backend runs inside a chain, which answer is better and
which bound is tighter.
"""

from __future__ import annotations

from collections.abc import Sequence

from apportion.solvers.base import Backend, SolveResult

# HiGHS in a chain stops once this share of its time passed without a better answer
HIGHS_STALL_SHARE: float | None = 0.25
LP_SHARE = 0.5  # at most this share of what is left goes to the LP relaxation
HIGHS_FIRST_SHARE = 0.3  # HiGHS before LP rounding: enough for the rounds it proves at once


def share(names: Sequence[str], i: int, left: float) -> float:
    """The time backend ``names[i]`` may use of ``left`` seconds: the LP relaxation a share
    only, and HiGHS before LP rounding a share (the rest goes to rounding and HiGHS again)."""
    if i == len(names) - 1:
        return left
    if names[i] == "lp-round":
        return LP_SHARE * left
    if names[i] == "highs" and "lp-round" in names[i + 1:]:
        return HIGHS_FIRST_SHARE * left
    return left


#: below this many seconds left, LP rounding may use them all (on the clock): a HiGHS
#: after it must solve the same relaxation at its root before it can do better than its
#: start, so in what an unfinished LP leaves it returns that start and no bound. A loaded
#: machine's 1,000-job round at a 2-s budget had 0.056 s left; the LP needs 0.06 s.
LP_ALL_BELOW_S = 0.5


def time_share(names: Sequence[str], i: int, left: float) -> float:
    """:func:`share` of ``left`` seconds on the clock: all of a short remainder to LP
    rounding (``LP_ALL_BELOW_S``). A work budget keeps :func:`share`'s split."""
    if names[i] == "lp-round" and left < LP_ALL_BELOW_S:
        return left
    return share(names, i, left)


#: past this many columns CP-SAT rarely beats its hint in seconds: ``auto`` runs LP rounding,
#: then HiGHS (``chain.AUTO_LARGE_ORDER``), and a restricted MIP this large goes unpresolved
LARGE_MODEL_COLUMNS = 20000

#: from this tolerance on, ``auto`` tries LP rounding first (``chain.AUTO_TOLERANT_ORDER``),
#: and on a model that says so its answer ends the chain (``lp_rounding_final``)
LP_FIRST_GAP = 1e-3


def lp_rounding_final(answered: set[str], gap: float, model_final: bool) -> bool:
    """Whether an answer of LP rounding (among the backends that ``answered`` so far) ends
    the chain: on a model whose meta says ``lp_rounding_final`` (the cell model: its
    relaxation is near-integral), at a tolerance from ``LP_FIRST_GAP``, HiGHS's branch and
    bound is not started after it (nor CP-SAT).

    Measured on deterministic Philly replays (experiments/results/bench/speed.md): on six
    one-day windows no earlier choice used, the chain without it took 0.45x the CPU at an
    average JCT -0.01 % (standard deviation 0.15 %); the 14-day replay 0.26x at +0.31 %;
    the quality tables' cell rows within their intervals (-0.2 % to +0.5 %). The branch
    and bound bettered LP rounding's answer in 33 of 143 rounds of the densest day, by
    0.04-3.4 % of the objective, late in its run, and no stopping rule kept those answers
    while saving its time. A tolerance below ``LP_FIRST_GAP`` (``--mip-gap 1e-4``) asks for
    HiGHS's proof and gets it, and so does any other model (a researcher's, the plans
    formulation's CPU and memory rows), where the rounded relaxation may be far from the
    optimum."""
    return model_final and gap >= LP_FIRST_GAP and "lp-round" in answered


def skipped(names: Sequence[str], i: int, answered: set[str], gap: float = LP_FIRST_GAP,
            model_final: bool = False) -> str | None:
    """Why backend ``names[i]`` does not run (None: it runs): nothing after an LP rounding
    that answered where that ends the chain (:func:`lp_rounding_final`); CP-SAT only if
    HiGHS failed, since a HiGHS that answered and stopped (its incumbent stalled) would
    otherwise hand CP-SAT the rest of a budget CP-SAT rarely uses better on these models."""
    if names[i] in ("highs", "cp-sat") and lp_rounding_final(answered, gap, model_final):
        return "skipped: LP rounding answered"
    if names[i] == "cp-sat" and "highs" in answered:
        return "skipped: HiGHS answered"
    return None


def for_chain(backend: Backend, gap: float) -> Backend:
    """``backend`` as the chain runs it: the chain's tolerance as its own (a MIP backend
    that has one), and HiGHS stopping once its incumbent stalls (``HIGHS_STALL_SHARE``)."""
    backend.join_chain(gap, HIGHS_STALL_SHARE)
    return backend


def better(a: SolveResult, b: SolveResult | None, sense: str) -> bool:
    if b is None or b.objective is None:
        return True
    assert a.objective is not None
    return a.objective > b.objective + 1e-9 if sense == "max" else a.objective < b.objective - 1e-9


def tighter(bound: float | None, res: SolveResult, sense: str) -> float | None:
    """The tighter of ``bound`` and what ``res`` proved: a bound counts with an answer, or
    where it is an LP relaxation's optimum (``extra["relaxation"]``: LP rounding whose
    rounding failed still proved it)."""
    if res.bound is None or (res.x is None and not res.extra.get("relaxation")):
        return bound
    if bound is None:
        return res.bound
    return min(bound, res.bound) if sense == "max" else max(bound, res.bound)
