"""YMIR's scheduler for foundation-model fine-tuning (YMIRSched, the YMIR paper's section 5).

Fine-tuning jobs that share a backbone can help each other: a job started from a
finished sibling's weights reaches its target sooner (**temporal** transfer,
A->B), and two sibling tasks trained as one merged job (one backbone, a head per
task, the batches added) may both reach their targets in less time than apart
(**spatial** transfer, A||B); either can also hurt (negative transfer), so
YMIR estimates the gain first and keeps only combinations predicted to help.
Every round:

1. **temporal** (``ymir``, ``ymir-temporal``): a queued job that never started
   and accepts sharing starts from the finished sibling (same backbone) whose
   weights the rate source predicts help most, when the predicted gain is
   positive (gain = 1 - rate alone / rate from the sibling's weights);
2. **spatial** (``ymir``): the task merger over the first ``window`` queued,
   never-started sharing jobs of a backbone (shortest first): the table-9 model
   of :mod:`apportion.formulations.finetune` (SRTF with per-job GPU limits,
   linear scaling) scored by its merger rule
   (:func:`apportion.solvers.finetune.greedy_modes`), each job one "epoch" of its
   predicted time (alone or from its best source), the pair's spatial gain
   ``1 - T(A||B) / (T_A + T_B)`` from the rate source's merged rate. Pairs it
   merges become one job: the earlier-submitted member leads;
3. **allocation**: elastic SRTF over units (single jobs and merged jobs), shortest
   predicted remaining time first, each given the GPU count of YMIR's set
   {1, 2, 3, 4m} up to its batch-scaled limit (at least 8 samples per GPU; a
   merged job's batches add up, so its limit does too) and the free GPUs that
   finishes it fastest; a running unit keeps its count and placement unless a
   change saves more than a context switch (``switch_s``).

The decision carries the modes for the simulator (and an executor):
``meta["transfer"] = {job: source job}``, ``meta["merged"] = {lead: [members]}``;
members are pending ("trains inside ..."), so the validator sees one allocation
per GPU set. A mode is fixed once its job starts. On an operator's queue the
estimator's rates know no transfer (every gain is 0), so the policy is YMIR's
elastic SRTF there. The ablations: ``ymir-temporal`` (no merging), ``ymir-spatial``
(no temporal transfer) and ``ymir-normal`` (no transfer at all: the elastic SRTF
alone, which separates the modes' gain from elasticity's).

Where the gains come from (``gains``):

* ``rates`` (``ymir`` and its ablations): the rate source's prediction of each mode's
  rate. In a replay that is a measurement of the mode (exact in both information
  modes, since the profiling noise is per job and GPU count); ``gain_noise`` (sigma,
  default 0) perturbs every gain with seeded Gaussian noise to study a predictor's error;
* ``task2vec`` (``ymir-task2vec``): YMIR's Alg. 1 in the replay, with the semantics of
  ``solve-finetune --gains auto`` (:func:`apportion.estimation.finetune.transferability.
  auto_gains`): every task of a backbone the policy has seen is embedded with the
  Task2Vec probe on its samples (``<task_data>/<backbone>@<task>`` or ``<task>``, ``.npz``
  or ``.csv``; ``task_data`` defaults to ``$APPORTION_TASK_DATA``, else
  ``<APPORTION_DATA>/titan-finetune/task-data``), pairs are scored, and the scores map to
  gains calibrated on the gains measured so far (pairs that ran to their end: a transfer
  or a merge YMIR chose), YMIR's default map until two are. Only the *choice* of a mode
  reads the prediction; a running unit's rate is the rate source's, as a scheduler
  observes a running job's speed. A task without samples gets no gains (no transfer,
  no merge); a missing folder is refused by name (exit 2): the shipped data has no task
  samples (the GLUE datasets), so the bundled fine-tuning traces need them supplied.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.decision import Decision, Reason
from apportion.estimation.finetune.gains import Task2VecGains
from apportion.finetune_spec import SPATIAL_SEP, TEMPORAL_SEP, problem_from_lists
from apportion.policies.base import Choice, Packer, build_decision, type_order
from apportion.view import JobView, View

log = logging.getLogger(__name__)

MIN_LOCAL_BSZ = 8  # samples per GPU at least (Titan's / YMIR's batch-scaled limit)


def allowed_counts(limit: int) -> list[int]:
    """YMIR's GPU counts {1, 2, 3, 4m} up to ``limit``."""
    return [g for g in range(1, limit + 1) if g <= 3 or g % 4 == 0]


@dataclass
class _Unit:
    """What runs: one job, or a merged lead with its members."""

    lead: JobView
    members: tuple[JobView, ...] = ()
    source: JobView | Any = None  # a finished job's record (temporal transfer)
    started: bool = False
    kw: dict[str, Any] = field(default_factory=dict)  # rate-source keywords of the mode

    @property
    def batch(self) -> int:
        return sum(max(1, j.spec.global_batch_size) for j in (self.lead, *self.members))

    @property
    def limit(self) -> int:
        return max(1, self.batch // MIN_LOCAL_BSZ)


class Ymir:
    """YMIR: temporal transfer, spatial merging and elastic SRTF over fine-tuning jobs."""

    def __init__(self, temporal: bool = True, spatial: bool = True, window: int = 6,
                 min_gain: float = 0.0, gain_noise: float = 0.0, switch_s: float = 30.0,
                 efficiency: float = 0.85, name: str | None = None, gains: str = "rates",
                 task_data: str | Path | None = None) -> None:
        if gains not in ("rates", "task2vec"):
            raise ValueError(f"gains must be rates or task2vec, not {gains!r}")
        self.temporal = temporal
        self.spatial = spatial
        self.window = window
        self.min_gain = min_gain
        self.gain_noise = gain_noise
        self.switch_s = switch_s
        self.efficiency = efficiency
        self.gains = gains
        self.task_data = task_data
        self.name = name or {(True, True): "ymir", (True, False): "ymir-temporal",
                             (False, True): "ymir-spatial", (False, False): "ymir-normal"}[
                                 (temporal, spatial)] + ("-task2vec" if gains == "task2vec"
                                                         else "")
        # task2vec: the shared predictor (its gains, calibrated on the modes that ran to their
        # end), and the modes still running
        self._t2v = Task2VecGains(task_data, who=self.name)
        self._running_modes: dict[str, tuple[str, str, str, float]] = {}
        self._records: dict[str, Any] = {}  # job id -> its trace record (the rate source's key)
        self._backbone: dict[str, str | None] = {}
        self._task: dict[str, str | None] = {}
        self._finished: dict[str, list[str]] = {}  # backbone -> finished job ids, in order
        self._fixed: dict[str, tuple[str | None, tuple[str, ...]]] = {}  # started: source, members
        self._inside: dict[str, str] = {}  # member -> lead (fixed groups)
        self._merger_memo: dict[tuple[Any, ...], list[tuple[str, str]]] = {}

    # -- what the rate source predicts ----------------------------------------------------
    def _rate(self, view: View, u: _Unit, gpu_type: str, gpus: int) -> float:
        return view.rate(u.lead, gpu_type, gpus, **u.kw)

    def _best(self, view: View, u: _Unit, free: dict[str, int] | None = None
              ) -> tuple[str | None, int, float]:
        """(type, GPUs, rate) finishing ``u`` fastest within ``free`` (all GPUs if None)."""
        best: tuple[str | None, int, float] = (None, 0, 0.0)
        for t in type_order(view.cluster):
            cap = (view.capacity if free is None else free).get(t, 0)
            for g in allowed_counts(min(u.limit, cap)):
                r = self._rate(view, u, t, g)
                if r > best[2] * (1 + 1e-9):
                    best = (t, g, r)
        return best

    def _noisy(self, view: View, gain: float, *key: str) -> float:
        if self.gain_noise <= 0:
            return gain
        h = hashlib.blake2b("|".join((str(view.seed), *key)).encode(), digest_size=8).digest()
        u1 = (int.from_bytes(h[:4], "big") + 0.5) / 2**32
        u2 = (int.from_bytes(h[4:], "big") + 0.5) / 2**32
        return gain + self.gain_noise * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)

    def _rate_gain(self, view: View, js: JobView, src: str, gpu_type: str) -> float:
        """The rate source's temporal gain of ``js`` started from ``src``'s weights."""
        alone = view.rate(js, gpu_type, 1)
        warm = view.rate(js, gpu_type, 1, source=self._records[src])
        if alone <= 0 or warm <= 0:
            return -1.0
        return 1.0 - alone / warm

    def _gain_from(self, view: View, js: JobView, src: str, gpu_type: str) -> float:
        """Predicted temporal gain of ``js`` started from ``src``'s weights."""
        if self.gains == "task2vec":
            pair = f"{self._task.get(src)}{TEMPORAL_SEP}{js.spec.task}"
            got = self._predictions(view, js.spec.backbone)["temporal"].get(pair)
            return -1.0 if got is None else self._noisy(view, got, "temporal", src, js.id)
        return self._noisy(view, self._rate_gain(view, js, src, gpu_type), "temporal", src,
                           js.id)

    # -- Task2Vec (gains="task2vec"): the shared predictor -----------------------------------
    def _check_task_folder(self) -> Path:
        """The task samples' folder; a missing one is refused by name (exit 2)."""
        return self._t2v.check_folder()

    def _predictions(self, view: View, backbone: str | None) -> dict[str, dict[str, float]]:
        """Task2Vec's gains among the tasks of ``backbone`` seen so far, calibrated on the
        gains measured so far (``--gains auto``: :class:`~apportion.estimation.finetune.
        gains.Task2VecGains`)."""
        tasks = frozenset(t for jid, t in self._task.items()
                          if t and self._backbone.get(jid) == backbone)
        return self._t2v.predictions(backbone, tasks)

    def _measure(self, view: View) -> None:
        """The gains of modes that ran to their end, for the calibration: a transfer's or a
        merge's gain as the rate source measured the run."""
        for jid in view.finished_recent:
            got = self._running_modes.pop(jid, None)
            if got is not None:
                self._t2v.measured(*got)

    # -- the round ------------------------------------------------------------------------
    def decide(self, view: View) -> Decision:
        t0 = time.perf_counter()
        self._observe(view)
        by_id = {js.id: js for js in view.jobs}
        units = self._units(view, by_id)
        chosen, reasons = self._allocate(view, units)
        transfer, merged = {}, {}
        for u in units:
            if u.lead.id not in chosen:
                continue
            src = u.source if isinstance(u.source, str) else None
            if not u.started:  # the mode is fixed by this start
                self._fixed[u.lead.id] = (src, tuple(m.id for m in u.members))
                for m in u.members:
                    self._inside[m.id] = u.lead.id
                if self.gains == "task2vec":
                    self._remember_mode(view, u, src)
            if src is not None:
                transfer[u.lead.id] = src
            if u.members:
                merged[u.lead.id] = [m.id for m in u.members]
        for u in units:
            for m in u.members:
                reasons[m.id] = (Reason.MERGED, f"trains inside merged job {u.lead.id}")
        d = build_decision(view, chosen, self.name, t0, reasons)
        d.meta.update(transfer=transfer, merged=merged)
        return d

    def _remember_mode(self, view: View, u: _Unit, src: str | None) -> None:
        """A mode starting: its gain as the rate source measures the run, kept until the
        unit ends (then it calibrates the Task2Vec map)."""
        js, bb = u.lead, u.lead.spec.backbone or ""
        t = self._best(view, _Unit(js))[0]
        if t is None:
            return
        if src is not None:
            pair = f"{self._task.get(src)}{TEMPORAL_SEP}{js.spec.task}"
            self._running_modes[js.id] = (bb, "temporal", pair,
                                          self._rate_gain(view, js, src, t))
        elif u.members:
            other = u.members[0]
            r_lead, r_other = view.rate(js, t, 1), view.rate(other, t, 1)
            merged = self._rate(view, u, t, 1)
            if min(r_lead, r_other, merged) > 0:
                alone = js.remaining / r_lead + other.remaining / r_other
                pair = f"{js.spec.task}{SPATIAL_SEP}{other.spec.task}"
                self._running_modes[js.id] = (bb, "spatial", pair,
                                              1.0 - (js.remaining / merged) / alone)

    def _observe(self, view: View) -> None:
        for js in view.jobs:
            if js.id not in self._records:
                self._records[js.id] = js.trace
                self._backbone[js.id] = js.spec.backbone
                self._task[js.id] = js.spec.task
        if self.gains == "task2vec":
            if any(js.spec.backbone for js in view.jobs):
                self._check_task_folder()
            self._measure(view)
        for jid in view.finished_recent:
            bb = self._backbone.get(jid)
            if bb is not None and self._records.get(jid) is not None:
                self._finished.setdefault(bb, []).append(jid)
            self._fixed.pop(jid, None)
            self._inside.pop(jid, None)

    @staticmethod
    def _started(js: JobView) -> bool:
        return js.first_start is not None or js.alloc is not None or js.done > 0

    def _sharing(self, js: JobView) -> bool:
        return (js.spec.accepts_sharing and js.spec.backbone is not None
                and js.trace is not None and not self._started(js))

    def _units(self, view: View, by_id: dict[str, JobView]) -> list[_Unit]:
        units: list[_Unit] = []
        free: list[JobView] = []
        for js in view.jobs:
            if js.id in self._inside:
                continue
            fixed = self._fixed.get(js.id)
            if fixed is not None or self._started(js):
                src, members = fixed or (None, ())
                u = _Unit(js, tuple(by_id[m] for m in members if m in by_id), src, True)
                self._mode(u)
                units.append(u)
            else:
                free.append(js)
        plain = {js.id: _Unit(js) for js in free}
        if self.temporal:
            for js in free:
                if self._sharing(js):
                    self._pick_source(view, plain[js.id])
        if self.spatial:
            for a, b in self._merge(view, [plain[js.id] for js in free if self._sharing(js)]):
                lead, other = sorted((a, b), key=lambda j: (j.spec.submit_time_s, j.id))
                plain[lead.id] = _Unit(lead, (other,))
                self._mode(plain[lead.id])
                del plain[other.id]
        units.extend(plain.values())
        return units

    def _mode(self, u: _Unit) -> None:
        u.kw = {}
        if u.members:
            u.kw["members"] = tuple(self._records[m.id] for m in u.members)
        elif isinstance(u.source, str) and u.source in self._records:
            u.kw["source"] = self._records[u.source]

    def _pick_source(self, view: View, u: _Unit) -> None:
        js = u.lead
        gpu_type = self._best(view, u)[0]
        if gpu_type is None:
            return
        best, gain = None, self.min_gain
        for src in self._finished.get(js.spec.backbone or "", []):
            g = self._gain_from(view, js, src, gpu_type)
            if g > gain:
                best, gain = src, g
        if best is not None:
            u.source = best
            self._mode(u)

    def _merge(self, view: View, cands: list[_Unit]) -> list[tuple[JobView, JobView]]:
        """The task merger on each backbone's first ``window`` queued sharing jobs."""
        pairs: list[tuple[JobView, JobView]] = []
        by_bb: dict[str, list[_Unit]] = {}
        for u in cands:
            by_bb.setdefault(u.lead.spec.backbone or "", []).append(u)
        for group in by_bb.values():
            timed = []
            for u in group:
                t, _, r = self._best(view, u)
                if t is not None and r > 0:
                    timed.append((u.lead.remaining / r, u.lead.id, u, t))
            timed.sort(key=lambda x: x[:2])
            window = timed[: self.window]
            if len(window) >= 2:
                pairs.extend(self._merge_window(view, window))
        return pairs

    def _merge_window(self, view: View, window: list[tuple[float, str, _Unit, str]]
                      ) -> list[tuple[JobView, JobView]]:
        from apportion.solvers.finetune import greedy_modes

        gpu_type = window[0][3]
        # the model's cluster: the type's GPUs not held by jobs that already run
        cap = max(1, view.capacity.get(gpu_type, 0) - sum(
            js.alloc.gpus for js in view.jobs if js.alloc is not None
            and js.alloc.gpu_type == gpu_type))
        one = {}  # job -> predicted one-GPU time (alone or from its source)
        for _, jid, u, _t in window:
            r1 = self._rate(view, u, gpu_type, 1)
            one[jid] = u.lead.remaining / r1 if r1 > 0 else math.inf
        spatial: dict[str, float] = {}
        for i, (_, a, ua, _t) in enumerate(window):
            for _, b, ub, _t2 in window[i + 1:]:
                lead, other = sorted((ua.lead, ub.lead), key=lambda j: (j.spec.submit_time_s, j.id))
                m = _Unit(lead, (other,))
                self._mode(m)
                r1 = self._rate(view, m, gpu_type, 1)
                if r1 <= 0 or not math.isfinite(one[a] + one[b]):
                    continue
                if self.gains == "task2vec":
                    pred = self._predictions(view, lead.spec.backbone)["spatial"]
                    ta, tb = self._task.get(a), self._task.get(b)
                    got = pred.get(f"{ta}{SPATIAL_SEP}{tb}", pred.get(f"{tb}{SPATIAL_SEP}{ta}"))
                    if got is None:
                        continue
                    g = self._noisy(view, got, "spatial", a, b)
                else:
                    g = self._noisy(view, 1.0 - (lead.remaining / r1) / (one[a] + one[b]),
                                    "spatial", a, b)
                if g > self.min_gain:
                    spatial[f"{a}||{b}"] = round(min(0.95, g), 6)
        if not spatial:
            return []
        # linear scaling up to each job's efficient count (what the allocation gives it)
        rows = [(jid, 1.0, round(one[jid], 6),
                 max(1, self._count(view, u, gpu_type, cap, efficient=True)[0]))
                for _, jid, u, _t in window]
        key = (tuple(rows), tuple(sorted(spatial.items())), cap)
        if key not in self._merger_memo:
            sched, _ = greedy_modes(problem_from_lists(rows, None, spatial), max(1, cap))
            self._merger_memo[key] = [tuple(u.members) for u in sched.units  # type: ignore[misc]
                                      if u.mode == "spatial"]
        jobs = {jid: u.lead for _, jid, u, _t in window}
        return [(jobs[a], jobs[b]) for a, b in self._merger_memo[key]]

    def _count(self, view: View, u: _Unit, t: str, cap: int, efficient: bool) -> tuple[int, float]:
        """The GPU count of ``u`` on ``t`` within ``cap``: the fastest one, or (``efficient``)
        the largest whose speed-up per GPU over one GPU is at least ``efficiency``."""
        best, rate = 0, 0.0
        r1 = self._rate(view, u, t, 1)
        for g in allowed_counts(min(u.limit, cap)):
            r = self._rate(view, u, t, g)
            if efficient and r1 > 0 and r < self.efficiency * g * r1:
                continue
            if r > rate * (1 + 1e-9):
                best, rate = g, r
        return best, rate

    def _allocate(self, view: View, units: list[_Unit]
                  ) -> tuple[dict[str, Choice], dict[str, tuple[Reason, str]]]:
        """Elastic SRTF: shortest predicted remaining time first. Each unit first gets its
        efficient count (as many jobs as possible run), GPUs left over then go, shortest
        first, to the count that finishes a unit fastest; a running unit keeps its count
        when a change would not pay its context switch."""
        ranked = []
        reasons: dict[str, tuple[Reason, str]] = {}
        for u in units:
            t, g, r = self._best(view, u)
            if t is None or r <= 0:
                reasons[u.lead.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type here")
                continue
            ranked.append((u.lead.remaining / r, u.lead.spec.submit_time_s, u.lead.id, u, t))
        ranked.sort(key=lambda x: x[:3])
        free = dict(view.capacity)
        counts: dict[str, tuple[str, int]] = {}
        for _, _, _, u, t in ranked:  # pass 1: efficient counts, shortest first
            a = u.lead.alloc
            t = a.gpu_type if a is not None and free.get(a.gpu_type, 0) > 0 else t
            if free.get(t, 0) <= 0:
                t = max(free, key=lambda x: (free[x], x))
            g, r = self._count(view, u, t, free.get(t, 0), efficient=True)
            if g > 0:
                counts[u.lead.id] = (t, g)
                free[t] -= g
        for _, _, _, u, _t in ranked:  # pass 2: what is left, to finish units fastest
            if u.lead.id not in counts:
                continue
            t, g0 = counts[u.lead.id]
            if free.get(t, 0) <= 0:
                continue
            g, r = self._count(view, u, t, g0 + free[t], efficient=False)
            a = u.lead.alloc
            if a is not None and a.gpu_type == t and g0 <= a.gpus < g:
                rem = u.lead.remaining
                keep = self._rate(view, u, t, a.gpus)
                if keep > 0 and rem / keep <= rem / r + self.switch_s:
                    g = a.gpus  # growing further would not pay its switch
            if g > g0:
                counts[u.lead.id] = (t, g)
                free[t] -= g - g0
        pk = Packer(view.cluster)
        chosen: dict[str, Choice] = {}
        order = sorted(ranked, key=lambda x: x[3].lead.alloc is None)  # keepers place first
        for _, _, _, u, _t in order:
            if u.lead.id not in counts:
                continue
            t, g = counts[u.lead.id]
            a = u.lead.alloc
            prefer = a.placement if a is not None and (a.gpu_type, a.gpus) == (t, g) else None
            p = pk.place(t, g, prefer=prefer)
            if p is not None:
                chosen[u.lead.id] = Choice(t, g, p, self._rate(view, u, t, g))
        return chosen, reasons
