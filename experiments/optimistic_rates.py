"""Each job's most optimistic ways to run: what the lower bound on the average JCT
(:mod:`apportion.experiments.lower_bound`) lets a job do, so that no policy can beat it.

An *option* of a job is ``(GPU type, GPUs charged, rate)``: while it runs so, the job
progresses at ``rate`` of its own iterations per second with ``GPUs charged`` GPUs of the
type held on its account. The bound is valid only if every way any policy could run a job
in the simulator is dominated by a mix of the job's options (no more time, no more
GPU-time of any type, no less progress). So the options are, per GPU type the cluster has:

* **every GPU count** from 1 to the type's capacity, not only powers of two: a rate
  interpolated between two measured counts is concave in the count, so a count between two
  powers of two can do more per GPU than any mix of them. Each at the ground truth's best
  placement and plan (``truth.rate`` with neither given, as every truth answers), or, where
  the truth offers ``optimistic_rate(job, gpu_type, gpus)``, at what it says the best choice
  ``rate`` does not take could give there (a truth whose jobs choose their batch size, the
  goodput of Pollux's model, answers with the best batch and statistical efficiency any
  point of the job's training could reach). Jobs get no scale limit the simulator does not
  enforce: a policy may give a job any count (the validator checks only the cluster's
  capacity), so the count at which the truth's rate stops gaining is the job's useful
  scale, and a larger one is dominated by it (more GPUs, no more progress).
* **fine-tuning run modes** (jobs with ``finetune`` information, on a truth whose ``rate``
  takes ``source=`` and ``members=``, the simulator's modes): started from another job's
  weights (transfer; every other job of the trace is offered as the source, so the work
  cut credited is the largest any finished sibling could give, whether or not one finished
  in time), the lead of a pair merged with any other job, or a pair's member (a member
  finishes when its lead does: its rate is its own iterations over the lead's merged
  duration, the shortest lead of that kind taken). A merged pair's GPUs are charged half to
  each job, so the pair's two jobs together hold what the pair holds.
* of these, per type, a **concave envelope** from the origin (holding nothing, doing
  nothing) to the fastest option, on or above every option (:func:`upper_envelope`, a few
  vertices): any option under it is a mix of its two neighbouring vertices, in the same
  time with no more GPUs and no less progress, and any option beyond the fastest is
  dominated by the fastest. A time-indexed LP offering only the vertices is a relaxation
  of every schedule.

Rates are asked once per *kind* of job (everything a truth reads: type, model, batch,
request, plan, fine-tuning task), not per job: a day of Philly has thousands of jobs of a
few dozen kinds, and Crius's cluster 320 GPUs of each type to scan.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the fields of a job a truth may read to rate it (its identity and timing excluded)
KIND_FIELDS = ("job_type", "model", "batch", "gpus", "gpu_type", "plan", "finetune")


@dataclass(frozen=True)
class Option:
    """One way a job may run: ``rate`` of its iterations per second while ``gpus`` GPUs of
    ``gpu_type`` are charged to it; ``mode`` says how (``alone``, ``transfer``,
    ``lead`` or ``member`` of a merged pair)."""

    gpu_type: str
    gpus: float
    rate: float
    mode: str = "alone"


#: the fine-tuning modes, by when they can first run: a transfer once its source finished, a
#: merged pair once both jobs arrived
TRANSFER = "transfer"
MERGE = "merge"
MODE_GROUP = {"alone": "alone", "transfer": TRANSFER, "lead": MERGE, "member": MERGE}


@dataclass(frozen=True)
class JobOptions:
    """A job's options: ``options`` the envelope's vertices over every mode and type;
    ``by_modes`` the envelope of the modes in each set (``alone`` always among them:
    before a job's transfer or merge could run, only those of the others do);
    ``partners`` (partner job, mode, fastest rate with it) for its fine-tuning modes."""

    options: tuple[Option, ...]
    by_modes: dict[frozenset[str], tuple[Option, ...]] = field(default_factory=dict)
    partners: tuple[tuple[str, str, float], ...] = ()

    @property
    def best_rate(self) -> float:
        return max((o.rate for o in self.options), default=0.0)

    @property
    def best_per_gpu(self) -> float:
        return max((o.rate / o.gpus for o in self.options if o.gpus > 0), default=0.0)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(o.gpu_type for o in self.options)

    def alone_rate(self) -> float:
        """The fastest rate of the job alone (no transfer, no merge)."""
        return max((o.rate for o in self.by_modes.get(frozenset({"alone"}), ())),
                   default=0.0)


def kind(job: Any) -> tuple[Any, ...]:
    """What a truth reads of ``job`` (see the module's doc): jobs of one kind run alike."""
    return tuple(getattr(job, f, None) for f in KIND_FIELDS)


def upper_envelope(x: np.ndarray, y: np.ndarray, most: int) -> list[tuple[float, float]]:
    """The vertices ``(GPUs, rate)`` of a concave envelope from the origin that lies on or
    above every point ``(x_i, y_i)`` (its options: holding ``x_i`` GPUs for rate ``y_i``)
    and reaches the fastest rate, in at most ``most`` vertices. Any option is then a mix of
    two neighbouring vertices with no more GPUs and no less progress, or, beyond the last,
    dominated by it (the module's doc).

    The exact upper hull from the origin to the fastest point where it has at most ``most``
    vertices; otherwise ``most`` of its edges, each extended to its line (every one above
    every point: a concave hull lies under each of its edges' lines), and the flat line at
    the fastest rate: their lower envelope is concave, above every point, and its vertices
    are where consecutive lines cross, a little above the hull, never below it. Kept: the
    first edge (from the origin: the most progress per GPU stays exact), the last (to the
    fastest), and edges spread geometrically between, as a rate's gains slow geometrically
    with the GPU count."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if not ok.any():
        return []
    x, y = x[ok], y[ok]
    order = np.lexsort((-y, x))  # by count, the fastest first within a count
    x, y = x[order], y[order]
    # only records (faster than every smaller count) can be hull vertices
    prev = np.concatenate([[0.0], np.maximum.accumulate(y)[:-1]])
    rec = y > prev
    hx, hy = x[rec], y[rec]
    top = float(hy[-1])
    per_gpu = float((y / x).max())
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for px, py in zip(hx.tolist(), hy.tolist(), strict=True):
        while len(hull) >= 2:  # drop the last vertex on or under the chord to (px, py)
            (ox, oy), (ax, ay) = hull[-2], hull[-1]
            if (ax - ox) * (py - oy) - (ay - oy) * (px - ox) >= 0:
                hull.pop()
            else:
                break
        hull.append((px, py))
    edges = [(by - ay) / (bx - ax) for (ax, ay), (bx, by) in itertools.pairwise(hull)]
    if len(edges) > most:
        keep = np.unique(np.round(np.geomspace(1, len(edges), most)).astype(int)) - 1
        edges = [edges[i] for i in keep]
    slopes = [per_gpu] + [sl for sl in edges[1:] if 0.0 < sl < per_gpu] + [0.0]
    lines: list[tuple[float, float]] = []
    for sl in slopes:
        if lines and sl >= lines[-1][0]:
            continue  # not falling (rounding): the line before already bounds it
        b = 0.0 if sl == per_gpu else (top if sl == 0.0 else float((y - sl * x).max()))
        while len(lines) >= 2:  # the last line is nowhere lowest: drop it
            (s1, b1), (s2, b2) = lines[-2], lines[-1]
            if (b - b1) / (s1 - sl) <= (b2 - b1) / (s1 - s2):
                lines.pop()
            else:
                break
        lines.append((float(sl), b))
    out: list[tuple[float, float]] = []
    for (s1, b1), (s2, b2) in itertools.pairwise(lines):
        xv = (b2 - b1) / (s1 - s2)
        yv = s1 * xv + b1
        if out and xv <= out[-1][0] * (1 + 1e-9):
            # two crossings at one count (up to rounding): one vertex, left and high, so
            # the envelope stays on or above both
            out[-1] = (min(out[-1][0], xv), max(out[-1][1], yv))
        else:
            out.append((xv, yv))
    return out


def _accepts_modes(truth: Any) -> bool:
    try:
        params = inspect.signature(truth.rate).parameters
    except (TypeError, ValueError):
        return False
    return ("source" in params and "members" in params) or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class OptimisticRates:
    """The options of a trace's jobs on a cluster under a truth (the module's doc)."""

    def __init__(self, truth: Any, capacity: dict[str, int]) -> None:
        self.truth = truth
        self.capacity = {t: int(c) for t, c in capacity.items() if c > 0}
        self._alone: dict[tuple[Any, ...], dict[str, list[float]]] = {}
        self._best = getattr(truth, "optimistic_rate", None)
        self._modes = _accepts_modes(truth)

    def _rate(self, job: Any, gpu_type: str, gpus: int, **mode: Any) -> float:
        try:
            if mode:
                r = self.truth.rate(job, gpu_type, gpus, **mode)
            elif self._best is not None:
                r = self._best(job, gpu_type, gpus)
            else:
                r = self.truth.rate(job, gpu_type, gpus)
        except TypeError:
            if not mode:
                raise
            self._modes = False  # a truth with no run modes after all
            return 0.0
        r = float(r)
        return r if math.isfinite(r) and r > 0 else 0.0

    def alone(self, job: Any) -> dict[str, list[float]]:
        """Per type, the rate at 1 .. capacity GPUs (index g - 1), once per kind."""
        k = kind(job)
        got = self._alone.get(k)
        if got is None:
            got = {t: [self._rate(job, t, g) for g in range(1, cap + 1)]
                   for t, cap in sorted(self.capacity.items())}
            self._alone[k] = got
        return got

    def options(self, jobs: Sequence[Any], most: int = 8) -> list[JobOptions]:
        """Every job's options, in ``jobs``' order, at most ``most`` a type and mode set
        (:func:`upper_envelope`)."""
        finetune = [j for j in jobs if getattr(j, "finetune", None) is not None]
        pairs, partners = (self._pair_options(finetune) if self._modes and len(finetune) > 1
                           else ({}, {}))
        out = []
        alike: dict[tuple[Any, ...], JobOptions] = {}  # jobs of a kind without pair options
        for j in jobs:
            mine = pairs.get(j.job_id, [])
            if not mine and kind(j) in alike:
                out.append(alike[kind(j)])
                continue
            alone = self.alone(j)
            groups = {"alone"} | {MODE_GROUP[o.mode] for o in mine}
            by_modes = {}
            for extra in ((), (TRANSFER,), (MERGE,), (TRANSFER, MERGE)):
                if not set(extra) <= groups:
                    continue
                sel = frozenset({"alone", *extra})
                label = "+".join(sorted(sel))
                opts: list[Option] = []
                for t in sorted(self.capacity):
                    more = [o for o in mine if o.gpu_type == t and MODE_GROUP[o.mode] in sel]
                    x = np.concatenate([np.arange(1.0, len(alone[t]) + 1),
                                        [o.gpus for o in more]])
                    y = np.concatenate([alone[t], [o.rate for o in more]])
                    opts += [Option(t, gx, gy, label) for gx, gy in upper_envelope(x, y, most)]
                by_modes[sel] = tuple(opts)
            full = by_modes[frozenset(groups)]
            out.append(JobOptions(full, by_modes, tuple(partners.get(j.job_id, ()))))
            if not mine:
                alike[kind(j)] = out[-1]
        return out

    def _pair_options(self, jobs: Sequence[Any]
                      ) -> tuple[dict[str, list[Option]], dict[str, list[tuple[str, str, float]]]]:
        """Transfer and merged options of fine-tuning jobs (the module's doc): per job, the
        best rate of each mode at each count over every partner, and per partner the
        fastest rate of each mode with it."""
        kinds: dict[tuple[Any, ...], list[Any]] = {}
        for j in jobs:
            kinds.setdefault(kind(j), []).append(j)
        reps = {k: js[0] for k, js in kinds.items()}
        # (my kind, partner kind) -> mode -> (type, count) -> rate; a member's rate in its
        # lead's iterations per second (the lead's merged rate)
        table: dict[tuple[Any, ...], dict[str, dict[tuple[str, int], float]]] = {}
        for k, me in reps.items():
            for k2, other in reps.items():
                if k2 == k:
                    if len(kinds[k]) < 2:
                        continue  # no other job of its own kind
                    other = kinds[k][1]
                if other.finetune.backbone != me.finetune.backbone:
                    continue
                got: dict[str, dict[tuple[str, int], float]] = {
                    "transfer": {}, "lead": {}, "member": {}}
                for t, cap in sorted(self.capacity.items()):
                    for g in range(1, cap + 1):
                        for mode, r in (("transfer", self._rate(me, t, g, source=other)),
                                        ("lead", self._rate(me, t, g, members=(other,))),
                                        ("member", self._rate(other, t, g, members=(me,)))):
                            if r > 0:
                                got[mode][(t, g)] = r
                        if not self._modes:
                            return {}, {}
                table[(k, k2)] = got
        options: dict[str, list[Option]] = {}
        partners: dict[str, list[tuple[str, str, float]]] = {}
        for j in jobs:
            k = kind(j)
            best: dict[tuple[str, int, str], float] = {}
            mine: list[tuple[str, str, float]] = []
            for k2, others in kinds.items():
                pair = table.get((k, k2))
                if pair is None:
                    continue
                fastest = {mode: max(rates.values()) for mode, rates in pair.items() if rates}
                others = [p for p in others if p.job_id != j.job_id]
                if not others:
                    continue
                # a member is done when its lead is: its iterations over the lead's merged
                # duration (the shortest lead of that kind for the options)
                own = float(j.iterations)
                for p in others:
                    for mode, r in fastest.items():
                        mine.append((p.job_id, mode, r * (own / max(1e-12, float(
                            p.iterations)) if mode == "member" else 1.0)))
                shortest = min(float(p.iterations) for p in others)
                for mode, rates in pair.items():
                    scale = own / max(1e-12, shortest) if mode == "member" else 1.0
                    for (t, g), r in rates.items():
                        key = (t, g, mode)
                        if r * scale > best.get(key, 0.0):
                            best[key] = r * scale
            # a merged pair's GPUs are charged half to each of its jobs
            options[j.job_id] = [Option(t, g / 2 if mode != "transfer" else g, r, mode)
                                 for (t, g, mode), r in best.items()]
            partners[j.job_id] = mine
        return options, partners
