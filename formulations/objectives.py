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
* ``jct-aware`` (apportion's): ``min(n_c, 1) * w_j + max(0, n_c - 1) * v_j * u_j``.
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
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from statistics import mean, median
from typing import Any

import networkx as nx
from apportion.formulations.schema import job_node

from apportion.jobs import JobSpec

OBJECTIVES = ("throughput", "normalized", "jct", "fairness", "makespan", "composite", "jct-aware")
DEFAULT_COMPOSITE = {"normalized": 1.0, "jct": 0.5, "fairness": 0.5}
SPEED_UNITS = ("reference", "best", "best-outside-tail")


@dataclass(frozen=True)
class ObjectiveOptions:
    kind: str = "normalized"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COMPOSITE))
    keep_bonus: float = 0.3
    restart_s: float = 60.0
    round_s: float = 300.0
    place_bonus: float = 0.0
    remaining_exponent: float = 1.0
    weight_bounds: tuple[float, float] = (0.25, 4.0)
    # jct-aware: the bounds of the weight on speed beyond the job's reference rate (None:
    # the same weight as on running up to it, ``weight_bounds``)
    speed_bounds: tuple[float, float] | None = None
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

    def __post_init__(self) -> None:
        if self.speed_unit not in SPEED_UNITS:
            raise ValueError(f"unknown speed_unit {self.speed_unit!r}; "
                             f"choose {', '.join(SPEED_UNITS)}")
        if self.speed_scale is not None and not self.speed_scale > 0.0:
            raise ValueError(f"speed_scale must be positive (or None), not {self.speed_scale!r}")
        # the pinned band is checked where it is configured, not first in a round
        if self.tail_pin_top is not None and not 0.0 < self.tail_pin_top < (self.tail_pin
                                                                            or 1.0):
            raise ValueError(f"tail_pin_top ({self.tail_pin_top!r}) must lie in (0, tail_pin) "
                             f"with tail_pin = {self.tail_pin!r}: set a tail_pin_top below "
                             "tail_pin, or None")


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
    if kind == "jct-aware":  # up to the reference rate by the weight, beyond by the speed weight
        cap = js.get("cap")
        if cap is not None and n > cap:
            n = cap + stats["round_excess"] * (n - cap)
        return min(n, 1.0) * js["weight"] + max(0.0, n - 1.0) * js["speed_weight"] * \
            js["speed_unit"]
    raise ValueError(f"unknown objective {kind!r}; choose {', '.join(OBJECTIVES)}")


def objective_of_options(options: Any) -> ObjectiveOptions:
    """The :class:`ObjectiveOptions` a formulation's options carry: every objective field the
    options have, by name (``objective`` is the kind), the rest at the objective's
    defaults. Written once: the cell and the plans formulations declare the knobs their
    users set, and neither copies them by hand."""
    names = {f.name for f in dataclasses.fields(ObjectiveOptions)} - {"kind"}
    given = {n: getattr(options, n) for n in names if hasattr(options, n)}
    return ObjectiveOptions(kind=options.objective, **given)


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


def apply_objective(g: nx.DiGraph, jobs: list[JobSpec], now_s: float,
                    options: ObjectiveOptions | None = None,
                    seen: MutableMapping[str, float] | None = None) -> None:
    """(Re)compute every cell's ``value`` in place from its terms, bonus and reconfig cost.

    ``seen`` is the calling policy's memory for ``tail_quantile`` (see the module
    docstring), updated in place; None: this round's jobs only."""
    opt = options or ObjectiveOptions()
    if opt.kind not in OBJECTIVES:
        raise ValueError(f"unknown objective {opt.kind!r}; choose {', '.join(OBJECTIVES)}")
    if opt.restart_horizon not in RESTART_HORIZONS:
        raise ValueError(f"unknown restart_horizon {opt.restart_horizon!r}; "
                         f"choose {', '.join(RESTART_HORIZONS)}")
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
    if not per_job:
        return
    fastest: dict[str, float] = {}  # each job's best candidate throughput
    current: dict[str, float] = {}  # each running job's normalised throughput where it runs
    for _, d in g.nodes(data=True):
        if d.get("kind") == "cell" and d["job"] in per_job:
            fastest[d["job"]] = max(fastest.get(d["job"], 0.0), float(d["est_throughput"]))
            if d.get("current"):
                current[d["job"]] = float(d["normalized"])
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
        | trace_tail(projected, opt.tail_quantile, seen) if opt.kind == "jct-aware" else set()
    pinned = trace_tail(projected, opt.tail_pin, seen) if opt.kind == "jct-aware" else set()
    if pinned and opt.tail_pin_top:  # the band that sets the p99, not the jobs beyond it
        pinned -= trace_tail(projected, opt.tail_pin_top, seen)
    top = (opt.speed_bounds or opt.weight_bounds)[1]
    speed = {j: top if j in tail else v for j, v in speed.items()}
    for j, v in per_job.items():
        if opt.round_excess is not None:
            v["cap"] = v["rem"] / opt.round_s
        v["weight"] = weights[j]
        v["speed_weight"] = speed[j]
        jd = g.nodes[job_node(j)]  # recorded on the job vertex (explains a decision)
        jd["jct_weight"] = weights[j] if opt.kind == "jct-aware" else 1.0
        jd["speed_weight"] = speed[j] if opt.kind == "jct-aware" else 1.0
        jd["soonest_s"] = soonest[j]
        jd["projected_jct_s"] = projected[j]
        jd["tail"] = j in tail
        jd["pinned"] = j in pinned and bool(v["running"])
    units = speed_units(per_job, fastest, opt, tail) if opt.kind == "jct-aware" else {}
    for j, v in per_job.items():
        v["speed_unit"] = units.get(j, 1.0)
        g.nodes[job_node(j)]["speed_unit"] = v["speed_unit"]
    stats = {"rem_mean": mean(v["rem"] for v in per_job.values()),
             "rho_mean": mean(v["rho"] for v in per_job.values()),
             "ref_mean": mean(v["ref"] for v in per_job.values()),
             "round_excess": opt.round_excess or 0.0}
    cap = opt.round_s if opt.amortize_s is None else max(opt.round_s, opt.amortize_s)

    def lost(rem: float, normalized: float) -> float:
        """The share of the gain a move gives up: its restart over the time it pays off."""
        if opt.restart_horizon == "cell":  # remaining time on the new cell: rem_j / n_c
            horizon = min(cap, rem / normalized) if normalized > 0 else 0.0
        else:
            horizon = opt.round_s if opt.amortize_s is None else min(cap, max(opt.round_s, rem))
        return min(1.0, opt.restart_s / horizon) if horizon > 0 else 1.0

    g.graph["objective"] = {"kind": opt.kind, "weights": dict(opt.weights),
                            "keep_bonus": opt.keep_bonus, "restart_s": opt.restart_s,
                            "round_s": opt.round_s, "place_bonus": opt.place_bonus,
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
                            "speed_scale": opt.speed_scale}
    for cn, d in g.nodes(data=True):
        if d.get("kind") != "cell" or d["job"] not in per_job:
            continue
        js = per_job[d["job"]]
        if opt.kind == "composite":
            term = sum(w * _terms(k, d, js, stats) for k, w in opt.weights.items())
        else:
            term = _terms(opt.kind, d, js, stats)
        value = term + opt.place_bonus + float(d.get("bonus", 0.0))
        if d.get("current"):  # jct-aware: stickiness in the job's own units (its speed weight)
            value += opt.keep_bonus * (js["speed_weight"] if opt.kind == "jct-aware" else 1.0)
        elif js["running"]:  # a running job that moves loses its restart
            n_c = float(d["normalized"])
            if d["job"] in pinned and n_c < current.get(d["job"], 0.0):
                value -= term  # a pinned tail job demoted gains nothing beyond running
            else:
                value -= term * lost(js["rem"], n_c)
        d["term"] = term
        d["value"] = value
