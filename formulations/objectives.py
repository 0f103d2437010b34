r"""Objectives as options, not forks: every formulation's cell ``value`` comes from here.

For a cell c of job j with estimated throughput ``thr_c`` (samples/s), normalised
throughput ``n_c = thr_c / ref_j``, remaining time at the reference ``rem_j`` and wait
``w_j``, the term ``term_c`` of each kind:

* ``throughput``: thr_c / S (raw cluster throughput, Crius's; S keeps coefficients near 1);
* ``normalized``: n_c (Morphling's);
* ``jct``: n_c * mean(rem) / rem_j (a weighted-JCT proxy: SRTF's rule as weights);
* ``fairness``: n_c * rho_j / mean(rho), rho_j the finish-time fairness of Themis;
* ``makespan``: n_c * rem_j / mean(rem) (longest remaining work first);
* ``composite``: a weighted sum of the above;
* ``jct-aware`` (the preset of that name, apportion's default before the one in seconds):
  ``min(n_c, 1) * w_j + max(0, n_c - 1) * v_j * u_j``.
  ``w_j = clip((median(soon) / soon_j) ** alpha, w_min, w_max)`` (``soon_j``: the job's
  remaining time on its fastest cell; ``alpha`` = ``remaining_exponent``) orders *who
  runs* as SRTF does, tempered and bounded so long jobs are never starved; ``v_j`` is the
  same ratio clipped narrowly (``speed_bounds``) and weighs *speed beyond the reference
  rate*, so a short arrival is not worth many times a long running job's fast type;
  ``u_j`` (``speed_unit``) counts that speed in shares of the job's own best cell (a share
  of the job's JCT per round) rather than in multiples of a slow reference.
  Jobs likely to set the tail keep the top speed weight: the ``tail_share`` of a round's
  jobs with the largest projected JCT, and those at or above the ``1 - tail_quantile``
  quantile of every job the policy has ranked (its memory ``seen``: a day's p99 is its
  few longest jobs, not a round's); a running job between the ``1 - tail_pin`` and ``1 -
  tail_pin_top`` quantiles is never moved to a slower cell while it can keep its own.
  ``round_excess`` credits a job at most the work it has left this round (``n_c`` capped at
  ``rem_j / round_s``): a job that ends within the round is not worth a long job's fast
  type for the whole round.
* ``seconds`` (apportion's default, preset ``apportion``, with ``finish_credit="wait"``,
  ``speed_bounds`` and ``amortize_s``): the JCT seconds a job saves by running on the cell
  this round, in rounds:
  ``s_c = min(thr_c / thr_best_j, soon_j / round_s)`` (the round's work on c counted in
  seconds of the job's remaining time on its fastest cell, at most what it has left),
  ``thr_best_j`` and ``soon_j`` read over the job's cells within its reach (the job
  vertex's ``reach_gpus``: the request's scales, ``2N``), so an elastic job's scale-up
  beyond it (:mod:`apportion.formulations.counts`) saves more than a round per round, in
  proportion to its speed, and the cells within the reach are valued as before it was
  offered (a busy round, which offers no scale-up, is unchanged by it),
  weighed by the one fairness exponent, ``term_c = w_j * s_c`` (``w_j`` as above, its
  bounds ``weight_bounds``; ``alpha`` = 0 is every second alike, 1 SRTF's rule). With
  ``speed_bounds`` the seconds beyond the reference rate's share ``1 / n_best_j`` (with
  ``speed_from="slowest"``, beyond its slowest cell's share) take the narrower speed
  weight ``v_j`` instead: who runs at all is the fairness exponent's question, how fast a
  running job goes is each job's own seconds (a long job moved to a slow type loses it
  for its whole remaining time, which one round's fairness weight does not see). A move
  nets its restart: ``restart_s`` of the new cell's work lost (over one round, or over
  ``amortize_s``). The reference throughput drops out: no normalisation to choose. Speed
  beyond the remaining time counts at ``round_excess`` (0 when None); with
  ``finish_credit="wait"`` a job that can end within the round is credited what starting
  it now saves, the round it would otherwise wait as well: ``1 + R - R / s`` rounds for
  ``R = soon_j / round_s <= s = thr_c / thr_best_j`` (a whole round on its best cell,
  however few seconds of work it has left). The other knobs
  (bonuses, tail, pin) are the further terms :data:`PRESETS` ``"seconds"`` leaves out.

Every kind may add a per-placed-job term ``place_bonus`` (Sia's ILP has it: one more job
runs before a placed one scales up). Then ``value_c = term_c + place_bonus + bonus_c +
keep_bonus [c is the running cell] - reconfig_c``, ``bonus_c`` holding the queue bonus
and any SLA or deadline priority the formulation set, and a move's restart costs the
share of its gain the restart takes, ``reconfig_c = term_c * min(1, restart_s /
horizon_j)``, ``horizon_j`` the time the move pays off: one round (Crius's rule) or, with
``amortize_s``, the job's remaining time capped at ``amortize_s`` and at least one round;
``restart_horizon="cell"`` measures it on the new cell (the move's exact break-even).

Why each term and value, and what was measured for each, on which traces and seeds:
``experiments/results/quality/README.md`` (the current objective and tables) and
``HISTORY.md`` beside it (the experiments that chose them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from statistics import mean, median
from typing import Any

import networkx as nx
from apportion.formulations.schema import job_node

from apportion.jobs import JobSpec

OBJECTIVES = ("throughput", "normalized", "jct", "fairness", "makespan", "composite", "jct-aware",
              "seconds")
DEFAULT_COMPOSITE = {"normalized": 1.0, "jct": 0.5, "fairness": 0.5}
SPEED_UNITS = ("reference", "best", "best-outside-tail")
SPEED_FROM = ("reference", "slowest")
#: seconds: what a job that can end within the round is credited (``finish_credit``)
FINISH_CREDITS = ("progress", "wait")


class FromRound(float):
    """A round figure (``round_s``, ``restart_s``) the user did not set: it reads as the
    figure a round without its own uses (:data:`ROUND_S`, :data:`RESTART_S`: 300 s and 60 s,
    what a one-off ``solve-round`` has always charged), and a driver's round replaces it with
    its own (:meth:`ObjectiveOptions.for_round`: the view's interval and restart cost). A
    plain number is the user's and wins; None asks for the round's figure explicitly."""

    def __repr__(self) -> str:
        return f"FromRound({float(self)!r})"


#: the round length and restart cost of a round that gives none (a one-off ``solve-round``
#: with no history): the figures every objective used before they were read from the round
ROUND_S = FromRound(300.0)
RESTART_S = FromRound(60.0)


def from_round(value: float | None) -> bool:
    """Whether a round figure is the round's to set (None or a :class:`FromRound`)."""
    return value is None or isinstance(value, FromRound)


def _figure(value: float | None, default: FromRound) -> float:
    return float(default if value is None else value)


@dataclass(frozen=True)
class ObjectiveOptions:
    """One objective, in one place: every knob of a cell's ``value`` (see the module
    docstring). ``ObjectiveOptions()`` is Crius's (``preset("crius")``); the candidate and
    plan options carry one (``CandidateOptions.objective``, apportion's preset;
    ``PlanOptions.objective``). ``round_s`` and ``restart_s`` are the round's own figures
    unless set (:class:`FromRound`): a driver fills them from its view each round."""

    kind: str = "normalized"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COMPOSITE),
                                         hash=False)
    keep_bonus: float = 0.3
    restart_s: float | None = RESTART_S
    round_s: float | None = ROUND_S
    place_bonus: float = 0.0
    remaining_exponent: float = 1.0
    weight_bounds: tuple[float, float] = (0.25, 4.0)
    # jct-aware: the bounds of the weight on speed beyond the job's reference rate (None:
    # the same weight as on running up to it, ``weight_bounds``)
    speed_bounds: tuple[float, float] | None = None
    # seconds: where speed beyond "running at all" starts (SPEED_FROM): the job's
    # ``reference`` rate, or its ``slowest`` candidate (every difference between the job's
    # cells is then speed, at the speed weight; the fairness weight orders only who runs)
    speed_from: str = "reference"
    # seconds: what a job that can end within the round saves by running on the cell:
    # ``progress`` the time it has left (its work, capped); ``wait`` the round it would
    # otherwise wait as well, ``1 + R - R / s`` rounds (R its time left in rounds, s the
    # cell's share of its best speed): a job with seconds of work left saves a whole round
    # by starting now, not its few seconds (FINISH_CREDITS)
    finish_credit: str = "progress"
    amortize_s: float | None = None  # spread a restart over this long (None: one round)
    # the time a move pays off, against which its restart is charged: ``reference`` the
    # job's remaining time at its reference throughput, at least one round; ``cell`` its
    # remaining time on the cell it moves to, no floor (a move's true break-even)
    restart_horizon: str = "reference"
    # jct-aware: the share of jobs, those with the largest projected JCT, whose speed
    # weight is the top of its bounds (None: none)
    tail_share: float | None = None
    # a running job within this share of the tail's boundary stays in it (hysteresis)
    tail_margin: float = 0.0
    # jct-aware: a job is credited at most the work it has left this round (n_c capped at
    # rem_j / round_s); speed beyond that, which only ends it sooner within the round, at
    # this share (None: no cap)
    round_excess: float | None = None
    # jct-aware: a job is also in the tail when its projected JCT is at least the (1 - q)
    # quantile of every job the policy has seen (None: the round's tail only)
    tail_quantile: float | None = None
    # jct-aware: a running job whose projected JCT is at least the (1 - q) quantile of the
    # policy's memory is pinned: a cell slower than its current one is worth no speed to
    # it, so it is demoted only where it would otherwise not run (None: none)
    tail_pin: float | None = None
    # jct-aware: a running job at or above the (1 - q) quantile of the memory is past the
    # pin: far beyond the p99, holding it lowers no p99 and costs the average (None: none)
    tail_pin_top: float | None = None
    # jct-aware: the unit of speed beyond the reference rate (SPEED_UNITS: ``reference``
    # multiples of it, ``best`` shares of the job's fastest cell for every job,
    # ``best-outside-tail`` for every job but the tail's) and the scale of a share (None:
    # the median over the round's jobs of their fastest cell's multiple of the reference)
    speed_unit: str = "reference"
    speed_scale: float | None = None
    # the reference a cell's throughput is normalised by (NORMALIZATIONS; see
    # :func:`reference_throughput`), read where the candidates are built
    normalize: str = "requested"
    # the queue bonus: ``queue_weight * min(1, wait / starvation_s)`` (long-waiting jobs rise)
    queue_weight: float = 0.25
    starvation_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.kind!r}; choose {', '.join(OBJECTIVES)}")
        if self.speed_unit not in SPEED_UNITS:
            raise ValueError(f"unknown speed_unit {self.speed_unit!r}; "
                             f"choose {', '.join(SPEED_UNITS)}")
        if self.speed_from not in SPEED_FROM:
            raise ValueError(f"unknown speed_from {self.speed_from!r}; "
                             f"choose {', '.join(SPEED_FROM)}")
        if self.finish_credit not in FINISH_CREDITS:
            raise ValueError(f"unknown finish_credit {self.finish_credit!r}; "
                             f"choose {', '.join(FINISH_CREDITS)}")
        if self.speed_scale is not None and not self.speed_scale > 0.0:
            raise ValueError(f"speed_scale must be positive (or None), not {self.speed_scale!r}")
        for name in ("round_s", "restart_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= (0.0 if name == "restart_s"
                                                                  else 1e-9)):
                raise ValueError(f"{name} must be a finite number "
                                 f"{'>= 0' if name == 'restart_s' else '> 0'} (or None: the "
                                 f"round's), not {v!r}")
        # the pinned band is checked where it is configured, not first in a round
        if self.tail_pin_top is not None and not 0.0 < self.tail_pin_top < (self.tail_pin
                                                                            or 1.0):
            raise ValueError(f"tail_pin_top ({self.tail_pin_top!r}) must lie in (0, tail_pin) "
                             f"with tail_pin = {self.tail_pin!r}: set a tail_pin_top below "
                             "tail_pin, or None")

    def __eq__(self, other: object) -> bool:
        # ``CandidateOptions.objective`` was the kind's name before it held these options:
        # code that compares it with a name (``opts.objective == "jct-aware"``) still works
        if other is self:
            return True
        if isinstance(other, str):
            return self.kind == other
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.__dict__ == other.__dict__  # (every field; the candidate cache compares)

    @property
    def round_s_value(self) -> float:
        """The round length the objective charges (the round's, else :data:`ROUND_S`)."""
        return _figure(self.round_s, ROUND_S)

    @property
    def restart_s_value(self) -> float:
        """The restart cost the objective charges (the round's, else :data:`RESTART_S`)."""
        return _figure(self.restart_s, RESTART_S)

    def for_round(self, round_s: float | None, restart_s: float | None) -> ObjectiveOptions:
        """These options in a round of ``round_s`` seconds whose restarts cost ``restart_s``
        (a driver's view): each figure the user did not set is the round's (still marked
        :class:`FromRound`, so the next round sets it again); a figure the user set is kept.
        A None figure leaves the option as it is."""
        change: dict[str, float] = {}
        if round_s is not None and from_round(self.round_s) and self.round_s != round_s:
            change["round_s"] = FromRound(round_s)
        if restart_s is not None and from_round(self.restart_s) and self.restart_s != restart_s:
            change["restart_s"] = FromRound(restart_s)
        return dataclasses.replace(self, **change) if change else self

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ObjectiveOptions:
        """A named objective (:data:`PRESETS`): ``crius`` (Crius's normalised throughput, its
        one-round restart charge and keep bonus, Gavel's normalisation, no JCT weights),
        ``sia-like`` (Sia's ILP objective as these knobs give it: normalised throughput over
        the job's least efficient option, one unit per placed job, a move charged its
        restart over one round, no keep bonus; no goodput, as apportion never changes a
        job's batch), ``apportion`` (apportion's default: ``CandidateOptions()``'s, the JCT
        seconds saved), ``jct-aware`` (the tuned default before it) or ``seconds`` (the one
        quantity alone);
        ``overrides`` over it. Every preset takes its round length and restart cost from
        the round."""
        if name not in PRESETS:
            raise ValueError(f"unknown objective preset {name!r}; choose {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)


#: the objective as one quantity (kind ``seconds``): the JCT seconds each job saves on
#: a cell this round, net of a move's restart seconds, weighed by one fairness exponent
#: (0.5, apportion's); no bonus, no tail, no pin, weights unbounded in practice
#: ([1e-3, 1e3]: a ratio of remaining times past a million). What each further term of
#: ``apportion`` adds to it, by leave-one-out on rows not used to choose it:
#: experiments/results/quality/ablation.md
_SECONDS = ObjectiveOptions(
    kind="seconds", keep_bonus=0.0, place_bonus=0.0, queue_weight=0.0, remaining_exponent=0.5,
    weight_bounds=(1e-3, 1e3), speed_bounds=None, amortize_s=None, normalize="requested")

#: the named objectives (:meth:`ObjectiveOptions.preset`; ``--objective-preset``)
PRESETS: dict[str, ObjectiveOptions] = {
    "crius": ObjectiveOptions(),
    "sia-like": ObjectiveOptions(kind="normalized", normalize="least-efficient",
                                 place_bonus=1.0, keep_bonus=0.0, amortize_s=None),
    # apportion's default (CandidateOptions'): the objective as one quantity, the JCT seconds
    # each job saves on a cell this round (kind ``seconds``, a job that can end within the
    # round credited the round it would otherwise wait: ``finish_credit="wait"``), net of a
    # move's restart, weighed by one fairness exponent (0.5), with the two further terms the
    # quality rows need: a move's restart set against the time it pays off, up to 1,800 s,
    # not one round (a long job displaced to a slow type moves back: crius-pai), and speed
    # beyond the reference rate's share at the narrower weight [0.7, 1.4] (a short job's
    # scale-up is worth at most twice a long job's: Morphling's rows, Philly day 3). What
    # each term adds, on rows not used to choose it, and every quality row against the
    # tuned objective before it: experiments/results/quality/ablation.md
    "apportion": dataclasses.replace(_SECONDS, finish_credit="wait", amortize_s=1800.0,
                                     speed_bounds=(0.7, 1.4)),
    # apportion's default until the objective in seconds: JCT-weighted normalised
    # throughput with the stack of further terms tuned on the quality rows (each knob's
    # value and the experiment that chose it: experiments/results/quality/HISTORY.md)
    "jct-aware": ObjectiveOptions(
        kind="jct-aware", keep_bonus=0.2, place_bonus=1.0, remaining_exponent=0.5,
        weight_bounds=(0.25, 4.0), speed_bounds=(0.7, 1.4), normalize="least-efficient",
        amortize_s=1800.0, restart_horizon="reference", tail_share=0.1, tail_margin=0.0,
        round_excess=0.25, tail_quantile=0.02, tail_pin=0.015, tail_pin_top=0.0075,
        speed_unit="best-outside-tail", speed_scale=None),
    "seconds": _SECONDS,
}

#: the knobs of the cells formulation alone: the plans formulation takes the rest of a
#: candidate objective (``PlanOptions.like``) but these at Crius's values (its tail's extra
#: speed is GPUs a waiting job lacks on Morphling's queue-bound workloads:
#: experiments/results/quality/HISTORY.md)
CELLS_ONLY = ("tail_share", "tail_margin", "round_excess", "tail_quantile", "tail_pin",
              "tail_pin_top")


#: the kinds that weigh jobs by their remaining time (the fairness exponent, the tail, the pin)
WEIGHTED = ("jct-aware", "seconds")


def _terms(kind: str, d: dict, js: dict, stats: dict[str, float]) -> float:
    n = float(d["normalized"])
    if kind == "normalized":
        return n
    if kind == "throughput":
        return float(d["est_throughput"]) / stats["ref_mean"]
    if kind == "jct":
        return n * stats["rem_mean"] / js["rem"]
    if kind == "fairness":
        return n * js["rho"] / stats["rho_mean"]
    if kind == "makespan":
        return n * js["rem"] / stats["rem_mean"]
    if kind == "seconds":  # rounds of JCT saved: the cell's share of the job's best speed
        saved = n / js["n_best"]
        cap = js["soon_rounds"]
        if saved > cap:  # the job can end within the round
            if stats["finish_wait"]:  # ... and saves the round it would wait as well
                saved = 1.0 + cap - cap / saved
            else:
                saved = cap + stats["round_excess"] * (saved - cap)
        # running at all (up to the reference rate) by the fairness weight, speed beyond it
        # by the speed weight (the same one unless ``speed_bounds`` narrows it)
        first = min(saved, js["n_floor"] / js["n_best"])
        return first * js["weight"] + (saved - first) * js["speed_weight"]
    if kind == "jct-aware":  # up to the reference rate by the weight, beyond by the speed weight
        cap = js.get("cap")
        if cap is not None and n > cap:
            n = cap + stats["round_excess"] * (n - cap)
        return min(n, 1.0) * js["weight"] + max(0.0, n - 1.0) * js["speed_weight"] * \
            js["speed_unit"]
    raise ValueError(f"unknown objective {kind!r}; choose {', '.join(OBJECTIVES)}")


def _scale_up_term(n: float, js: dict, stats: dict[str, float]) -> float:
    """``seconds``: the term of an elastic scale-up cell (beyond the job's reach, faster
    than its best within it, ``s = n / n_best > 1``): the best cell's term plus, at the
    job's speed weight, the rounds a round on it saves over the best cell,
    ``min(ln s, R (1 - 1 / s))`` (``R`` the job's remaining time on the best cell, in
    rounds).

    Held for the rest of its life, a cell ``s`` times faster saves ``s - 1`` rounds per
    round of its own (its remaining time is ``1 / s`` of the best cell's); between two
    scale-ups ``a`` and ``b`` that is ``s_b / s_a - 1``, so the values of a job's cells
    must differ by about the logarithm of their speeds' ratio, not by their difference (a
    term linear in ``s`` valued the step from 16 to 32 GPUs of a job requesting 2 at
    ``(r32 - r16) / r4`` rounds, more than two waiting jobs' whole round each: it kept
    them queued on an idle cluster). A job that can end within ``R < ln s`` rounds saves
    at most what it has left, ``R (1 - 1 / s)``: the finish credit's rule
    (``finish_credit="wait"``) for a job ending within the round."""
    best = _terms("seconds", {"normalized": js["n_best"]}, js, stats)
    s = n / js["n_best"]
    gain = min(math.log(s), js["soon_rounds"] * (1.0 - 1.0 / s))
    return best + gain * js["speed_weight"]


def objective_of_options(options: Any) -> ObjectiveOptions:
    """The :class:`ObjectiveOptions` a formulation's options carry: their nested ``objective``
    (:class:`CandidateOptions`, :class:`PlanOptions`), or, for options that keep the knobs
    flat (a researcher's own), every objective field they have by name (``objective`` the
    kind), the rest at the objective's defaults."""
    nested = getattr(options, "objective", None)
    if isinstance(nested, ObjectiveOptions):
        return nested
    names = {f.name for f in dataclasses.fields(ObjectiveOptions)} - {"kind"}
    given = {n: getattr(options, n) for n in names if hasattr(options, n)}
    return ObjectiveOptions(kind=nested if nested is not None else "normalized", **given)


#: the keywords an options class nesting an objective (:func:`nested_objective`) accepts for
#: it: the kind as ``objective``, every other knob by its own name
OBJECTIVE_KNOBS = tuple(f.name for f in dataclasses.fields(ObjectiveOptions) if f.name != "kind")


def nested_objective(default: Callable[[], ObjectiveOptions]) -> Callable[[type], type]:
    """A frozen options dataclass whose field ``objective`` holds its :class:`ObjectiveOptions`
    (``default()`` where none is given), and whose constructor still takes every knob flat,
    as before the nesting: ``objective`` may be the kind's name (over ``default()``'s other
    knobs) and each knob of :data:`OBJECTIVE_KNOBS` a keyword of its own, over the nested
    objective; each knob also reads as an attribute (``opts.keep_bonus``).
    ``dataclasses.replace(opts, keep_bonus=...)`` changes the nested objective."""
    def wrap(cls: type) -> type:
        own = [f for f in dataclasses.fields(cls) if f.name != "objective"]

        def __init__(self: Any, *, objective: ObjectiveOptions | str | None = None,  # noqa: N807
                     **kw: Any) -> None:
            knobs = {k: kw.pop(k) for k in list(kw) if k in OBJECTIVE_KNOBS}
            if objective is None:
                base = default()
            elif isinstance(objective, str):
                base = dataclasses.replace(default(), kind=objective)
            elif isinstance(objective, ObjectiveOptions):
                base = objective
            else:
                raise TypeError(f"objective must be an ObjectiveOptions or a kind's name "
                                f"({', '.join(OBJECTIVES)}), not {objective!r}")
            nested = dataclasses.replace(base, **knobs) if knobs else base
            for f in own:
                if f.name in kw:
                    value = kw.pop(f.name)
                elif f.default is not dataclasses.MISSING:
                    value = f.default
                else:
                    value = f.default_factory()  # type: ignore[misc]
                object.__setattr__(self, f.name, value)
            if kw:
                raise TypeError(f"{cls.__name__}() got unexpected keyword argument(s) "
                                f"{', '.join(sorted(kw))}")
            object.__setattr__(self, "objective", nested)
            post = getattr(self, "__post_init__", None)
            if post is not None:
                post()

        def updated(self: Any, **kw: Any) -> Any:
            """These options with ``kw`` over them, objective knobs over the nested objective
            (a kind's name as ``objective`` changes the kind and keeps the other knobs; an
            :class:`ObjectiveOptions` replaces it): ``dataclasses.replace`` with a kind's
            name starts from the default objective instead."""
            nested = self.objective
            given = kw.pop("objective", None)
            if isinstance(given, str):
                nested = dataclasses.replace(nested, kind=given)
            elif given is not None:
                nested = given
            knobs = {k: kw.pop(k) for k in list(kw) if k in OBJECTIVE_KNOBS}
            return dataclasses.replace(self, objective=dataclasses.replace(nested, **knobs),
                                       **kw)

        cls.__init__ = __init__  # type: ignore[misc]
        cls.updated = updated  # type: ignore[attr-defined]
        for name in OBJECTIVE_KNOBS:
            if name not in cls.__dict__:
                setattr(cls, name, property(lambda self, n=name: getattr(self.objective, n),
                                            doc=f"the nested objective's ``{name}``"))
        cls.OBJECTIVE_KEYWORDS = ("objective", *OBJECTIVE_KNOBS)  # type: ignore[attr-defined]
        return cls
    return wrap


def options_dict(options: Any) -> dict[str, Any]:
    """A formulation's options as one flat dict (what a candidate graph records): its own
    fields, the nested objective's knobs by name and its kind as ``objective``."""
    out = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    nested = out.get("objective")
    if isinstance(nested, ObjectiveOptions):
        out["objective"] = nested.kind
        for f in dataclasses.fields(nested):
            if f.name != "kind":
                v = getattr(nested, f.name)
                out[f.name] = float(v) if isinstance(v, FromRound) else (
                    dict(v) if f.name == "weights" else v)
    return out


RESTART_HORIZONS = ("reference", "cell")
NORMALIZATIONS = ("requested", "slowest", "best", "least-efficient")


def reference_throughput(normalize: str, requested_gpus: int, requested_type: str | None,
                         options: list[tuple[str, int, float]]) -> tuple[float, str]:
    """A job's reference throughput ``ref_j`` (``n_c = thr_c / ref_j``) and its basis.

    ``options`` are the job's candidates as (GPU type, GPU count, throughput). One
    definition for every formulation (cells and plans):

    * ``requested``: its requested N GPUs of its requested type (Gavel's; the best type
      when none is requested, the best candidate when no N-GPU candidate exists);
    * ``slowest``: N GPUs of its slowest type (Sia's: independent of a requested type
      that may be arbitrary);
    * ``best``: N GPUs of its fastest type;
    * ``least-efficient``: N x the throughput per GPU of its least efficient (type,
      count), Sia's base: jobs whose slow options waste GPUs rate their efficient ones
      higher.
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"unknown normalize {normalize!r}; choose {', '.join(NORMALIZATIONS)}")
    if not options:
        raise ValueError("a reference throughput needs at least one candidate")
    best: dict[tuple[str, int], float] = {}  # each (type, count)'s best plan
    for t, n, thr in options:
        best[t, n] = max(best.get((t, n), 0.0), thr)
    if normalize == "least-efficient":
        per_gpu = min(thr / n for (_, n), thr in best.items())
        return per_gpu * requested_gpus, f"{requested_gpus} x least efficient GPU"
    at_n = {t: thr for (t, n), thr in best.items() if n == requested_gpus}
    if normalize != "requested" and at_n:
        pick = min if normalize == "slowest" else max
        return pick(at_n.values()), f"{requested_gpus} x {normalize} type"
    if requested_type and requested_type in at_n:
        return at_n[requested_type], f"{requested_gpus} x {requested_type}"
    if at_n:
        return max(at_n.values()), f"{requested_gpus} x best type"
    return max(best.values()), "best candidate"


def jct_weights(rem: dict[str, float], exponent: float,
                bounds: tuple[float, float]) -> dict[str, float]:
    """``clip((median(rem) / rem_j) ** exponent, *bounds)`` per job (1 for a lone job)."""
    if not rem:
        return {}
    mid = median(rem.values())
    lo, hi = bounds
    return {j: min(hi, max(lo, (mid / r) ** exponent)) for j, r in rem.items()}


def tail_jobs(projected: Mapping[str, float], share: float | None, margin: float = 0.0,
              running: Collection[str] = ()) -> set[str]:
    """The ceil(share x n) jobs with the largest projected JCT (ties by id; none for None),
    and every job of ``running`` whose projected JCT is at least (1 - ``margin``) times
    the smallest of theirs (the boundary)."""
    if not share or not projected:
        return set()
    if not 0.0 < share <= 1.0:
        raise ValueError(f"tail_share must lie in (0, 1], not {share!r}")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"tail_margin must lie in [0, 1), not {margin!r}")
    k = math.ceil(share * len(projected))
    top = sorted(projected, key=lambda j: (-projected[j], j))[:k]
    floor = (1.0 - margin) * projected[top[-1]]
    return set(top) | {j for j in running if j in projected and projected[j] >= floor}


def trace_tail(projected: Mapping[str, float], quantile: float | None,
               seen: MutableMapping[str, float] | None = None) -> set[str]:
    """The jobs whose projected JCT is at least the (1 - ``quantile``) quantile of every
    job in ``seen`` (updated first with ``projected``: a policy's memory of the jobs it
    has ranked, each with its latest projection); none for None."""
    if not quantile or not projected:
        return set()
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"tail_quantile must lie in (0, 1], not {quantile!r}")
    memory = {} if seen is None else seen
    memory.update(projected)
    values = sorted(memory.values())
    pos = (1.0 - quantile) * (len(values) - 1)  # linear interpolation (numpy's default)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    floor = min(values[hi], values[lo] + (pos - lo) * (values[hi] - values[lo]))
    return {j for j, v in projected.items() if v >= floor}


def speed_units(per_job: Mapping[str, Mapping[str, float]], fastest: Mapping[str, float],
                opt: ObjectiveOptions, tail: Collection[str] = ()) -> dict[str, float]:
    """Each job's factor on its speed beyond the reference rate (``speed_unit``; 1 for
    ``reference`` and for the tail under ``best-outside-tail``): ``s / n_best_j``, so a
    share of its fastest cell's speed, a share of its round in JCT seconds, counts the
    same for every job."""
    if opt.speed_unit == "reference":
        return {}
    best = {j: fastest[j] / v["ref"] for j, v in per_job.items() if fastest.get(j)}
    if not best:
        return {}
    scale = opt.speed_scale if opt.speed_scale is not None else median(best.values())
    keep = set(tail) if opt.speed_unit == "best-outside-tail" else set()
    return {j: scale / v for j, v in best.items() if j not in keep}


def _job_figures(g: nx.DiGraph, jobs: list[JobSpec], now_s: float
                 ) -> dict[str, dict[str, float]]:
    """Per job with a reference throughput: its remaining and isolated seconds there, its
    finish-time fairness so far, the reference and whether it runs."""
    per_job: dict[str, dict[str, float]] = {}
    for job in jobs:
        jd = g.nodes.get(job_node(job.id))
        if jd is None or not jd.get("ref_throughput"):
            continue
        ref = float(jd["ref_throughput"])
        rem = max(60.0, job.remaining_iterations * job.global_batch_size / ref)
        iso = max(60.0, job.iterations * job.global_batch_size / ref)
        per_job[job.id] = {"rem": rem, "rho": (max(0.0, now_s - job.submit_time_s) + rem) / iso,
                           "ref": ref, "running": 1.0 if job.running else 0.0}
    return per_job


@dataclass
class _Throughputs:
    """Each job's best candidate throughput within its reach (``fastest``; its best
    scale-up where it has only those), beyond it (``beyond``, its elastic scale-up), its
    slowest, its normalised throughput where it runs (``current``) and its reach."""

    fastest: dict[str, float]
    beyond: dict[str, float]
    slowest: dict[str, float]
    current: dict[str, float]
    reach: dict[str, Any]


def _throughputs(g: nx.DiGraph, per_job: dict[str, dict[str, float]]) -> _Throughputs:
    t = _Throughputs({}, {}, {}, {}, {j: g.nodes[job_node(j)].get("reach_gpus")
                                      for j in per_job})
    for _, d in g.nodes(data=True):
        if d.get("kind") == "cell" and d["job"] in per_job:
            j, thr = d["job"], float(d["est_throughput"])
            top = t.reach[j]
            if top is None or int(d["gpus"]) <= top:
                t.fastest[j] = max(t.fastest.get(j, 0.0), thr)
            else:
                t.beyond[j] = max(t.beyond.get(j, 0.0), thr)
            t.slowest[j] = min(t.slowest.get(j, math.inf), thr)
            if d.get("current"):
                t.current[j] = float(d["normalized"])
    for j, thr in t.beyond.items():  # a job whose only cells are scale-ups: its best of them
        t.fastest.setdefault(j, thr)
    return t


def _record_objective(g: nx.DiGraph, opt: ObjectiveOptions, round_s: float,
                      restart_s: float) -> None:
    """The objective's settings on the graph (what a decision's explanation reads)."""
    g.graph["objective"] = {"kind": opt.kind, "weights": dict(opt.weights),
                            "keep_bonus": opt.keep_bonus, "restart_s": restart_s,
                            "round_s": round_s, "place_bonus": opt.place_bonus,
                            # where the two figures came from: the round's (or, with no
                            # round, ROUND_S / RESTART_S) or the user's
                            "round_s_from": "round" if from_round(opt.round_s) else "user",
                            "restart_s_from": "round" if from_round(opt.restart_s) else "user",
                            "remaining_exponent": opt.remaining_exponent,
                            "weight_bounds": list(opt.weight_bounds),
                            "speed_bounds": None if opt.speed_bounds is None
                            else list(opt.speed_bounds),
                            "amortize_s": opt.amortize_s,
                            "restart_horizon": opt.restart_horizon,
                            "tail_share": opt.tail_share,
                            "tail_margin": opt.tail_margin,
                            "round_excess": opt.round_excess,
                            "tail_quantile": opt.tail_quantile,
                            "tail_pin": opt.tail_pin,
                            "tail_pin_top": opt.tail_pin_top,
                            "speed_unit": opt.speed_unit,
                            "speed_from": opt.speed_from,
                            "finish_credit": opt.finish_credit,
                            "speed_scale": opt.speed_scale}


def _check_kind(opt: ObjectiveOptions) -> None:
    if opt.kind not in OBJECTIVES:
        raise ValueError(f"unknown objective {opt.kind!r}; choose {', '.join(OBJECTIVES)}")
    if opt.restart_horizon not in RESTART_HORIZONS:
        raise ValueError(f"unknown restart_horizon {opt.restart_horizon!r}; "
                         f"choose {', '.join(RESTART_HORIZONS)}")


def apply_objective(g: nx.DiGraph, jobs: list[JobSpec], now_s: float,
                    options: ObjectiveOptions | None = None,
                    seen: MutableMapping[str, float] | None = None) -> None:
    """(Re)compute every cell's ``value`` in place from its terms, bonus and reconfig cost.

    ``seen`` is the calling policy's memory for ``tail_quantile`` (see the module
    docstring), updated in place; None: this round's jobs only."""
    opt = options or ObjectiveOptions()
    _check_kind(opt)
    round_s, restart_s = opt.round_s_value, opt.restart_s_value
    per_job = _job_figures(g, jobs, now_s)
    if not per_job:
        return
    thr = _throughputs(g, per_job)
    fastest = thr.fastest
    # jct-aware ranks by the shortest remaining time a job can have (on its fastest cell):
    # a job that is slow where it asked to run but fast elsewhere is a short job
    soonest = {j: max(60.0, per_job[j]["rem"] * per_job[j]["ref"] / fastest[j]) if fastest.get(j)
               else per_job[j]["rem"] for j in per_job}
    weights = jct_weights(soonest, opt.remaining_exponent, opt.weight_bounds)
    speed = weights if opt.speed_bounds is None else \
        jct_weights(soonest, opt.remaining_exponent, opt.speed_bounds)
    projected = {j.id: max(0.0, now_s - j.submit_time_s) + soonest[j.id] for j in jobs
                 if j.id in per_job}
    tail = tail_jobs(projected, opt.tail_share, opt.tail_margin,
                     [j for j, v in per_job.items() if v["running"]]) \
        | trace_tail(projected, opt.tail_quantile, seen) if opt.kind in WEIGHTED else set()
    pinned = trace_tail(projected, opt.tail_pin, seen) if opt.kind in WEIGHTED else set()
    if pinned and opt.tail_pin_top:  # the band that sets the p99, not the jobs beyond it
        pinned -= trace_tail(projected, opt.tail_pin_top, seen)
    top = (opt.speed_bounds or opt.weight_bounds)[1]
    speed = {j: top if j in tail else v for j, v in speed.items()}
    for j, v in per_job.items():
        if opt.round_excess is not None:
            v["cap"] = v["rem"] / round_s
        v["weight"] = weights[j]
        v["speed_weight"] = speed[j]
        jd = g.nodes[job_node(j)]  # recorded on the job vertex (explains a decision)
        jd["jct_weight"] = weights[j] if opt.kind in WEIGHTED else 1.0
        jd["speed_weight"] = speed[j] if opt.kind in WEIGHTED else 1.0
        jd["soonest_s"] = soonest[j]
        v["n_best"] = fastest[j] / v["ref"] if fastest.get(j) else 1.0
        v["n_floor"] = thr.slowest[j] / v["ref"] if opt.speed_from == "slowest" and \
            thr.slowest.get(j) else 1.0
        v["soon_rounds"] = soonest[j] / round_s
        jd["projected_jct_s"] = projected[j]
        jd["tail"] = j in tail
        jd["pinned"] = j in pinned and bool(v["running"])
    units = speed_units(per_job, fastest, opt, tail) if opt.kind == "jct-aware" else {}
    for j, v in per_job.items():
        v["speed_unit"] = units.get(j, 1.0)
        g.nodes[job_node(j)]["speed_unit"] = v["speed_unit"]
    _record_objective(g, opt, round_s, restart_s)
    _cell_values(g, opt, per_job, thr, pinned, round_s, restart_s)


def _cell_values(g: nx.DiGraph, opt: ObjectiveOptions, per_job: dict[str, dict[str, float]],
                 thr: _Throughputs, pinned: set[str], round_s: float, restart_s: float) -> None:
    """Each cell's ``term`` and ``value``: its objective term, the bonuses, and a running
    job's restart where the cell moves it."""
    stats = {"rem_mean": mean(v["rem"] for v in per_job.values()),
             "rho_mean": mean(v["rho"] for v in per_job.values()),
             "ref_mean": mean(v["ref"] for v in per_job.values()),
             "round_excess": opt.round_excess or 0.0,
             "finish_wait": opt.finish_credit == "wait"}
    cap = round_s if opt.amortize_s is None else max(round_s, opt.amortize_s)

    def lost(rem: float, normalized: float) -> float:
        """The share of the gain a move gives up: its restart over the time it pays off."""
        if opt.restart_horizon == "cell":  # remaining time on the new cell: rem_j / n_c
            horizon = min(cap, rem / normalized) if normalized > 0 else 0.0
        else:
            horizon = round_s if opt.amortize_s is None else min(cap, max(round_s, rem))
        return min(1.0, restart_s / horizon) if horizon > 0 else 1.0

    for cn, d in g.nodes(data=True):
        if d.get("kind") != "cell" or d["job"] not in per_job:
            continue
        js = per_job[d["job"]]
        top = thr.reach[d["job"]]
        if opt.kind == "composite":
            term = sum(w * _terms(k, d, js, stats) for k, w in opt.weights.items())
        elif opt.kind == "seconds" and top is not None and int(d["gpus"]) > top \
                and float(d["normalized"]) > js["n_best"]:
            term = _scale_up_term(float(d["normalized"]), js, stats)
        else:
            term = _terms(opt.kind, d, js, stats)
        value = term + opt.place_bonus + float(d.get("bonus", 0.0))
        if d.get("current"):  # jct-aware: stickiness in the job's own units (its speed weight)
            value += opt.keep_bonus * (js["speed_weight"] if opt.kind in WEIGHTED else 1.0)
        elif js["running"]:  # a running job that moves loses its restart
            n_c = float(d["normalized"])
            if d["job"] in pinned and n_c < thr.current.get(d["job"], 0.0):
                value -= term  # a pinned tail job demoted gains nothing beyond running
            else:
                value -= term * lost(js["rem"], n_c)
        d["term"] = term
        d["value"] = value
