"""What apportion's policy remembers of fine-tuning siblings, and what it offers them each round.

Fine-tuning jobs that share a backbone (``JobSpec.backbone``, ``task``, ``accepts_sharing``)
get two options in apportion's own round model (:mod:`apportion.formulations.siblings`):
a **transfer option** (a queued job starts from a finished sibling's weights: its cells'
work cut by the predicted gain) and a **merged cell** (two queued siblings trained as one
job: one column serving both). This module is the policy's side of it: the finished
siblings (whose weights exist), the modes fixed when a job started (a mode holds for the
job's life, as a real run's checkpoint does), and the predicted gains, from the same
information YMIR's policy has (:mod:`apportion.policies.ymir`):

* ``gains="rates"`` (``apportion``): the rate source's rate of each mode (the view's
  ``rate(job, type, gpus, source=..., members=...)``). In a replay that is the truth's
  measured mode in both information modes, exactly what ``ymir`` reads; an operator's
  estimator knows no transfer (every gain 0), so nothing is offered there;
* ``gains="task2vec"`` (``apportion-task2vec``, ``--gains auto``): YMIR's Alg. 1, Task2Vec
  scores of the tasks' samples mapped to gains (:class:`~apportion.estimation.finetune.
  gains.Task2VecGains`, calibrated on the modes that ran to their end). As in
  ``ymir-task2vec``, only the choice of a source or a pair reads the prediction; a cell's
  rate is the rate source's where it knows the mode, else the job's own rate with its
  work cut by the predicted gain (an operator's queue).

Which pairs are offered: per backbone, the ``window`` queued siblings that finish
soonest (YMIR's task merger looks at as many), each pair whose predicted spatial gain on
one GPU, ``1 - T(A||B) / (T_A + T_B)`` (each alone timed with its best transfer), is
positive: the model then decides against every other cell whether merging pays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from apportion.decision import Decision, Reason
from apportion.estimation.finetune.gains import Task2VecGains
from apportion.finetune_spec import SPATIAL_SEP, TEMPORAL_SEP
from apportion.formulations.siblings import SiblingOptions, sibling_meta
from apportion.view import JobView, View

log = logging.getLogger(__name__)

GAINS = ("rates", "task2vec")


class Siblings:
    """A policy's memory of fine-tuning siblings across rounds and the round's options."""

    def __init__(self, gains: str = "rates", window: int = 6, min_gain: float = 0.0,
                 task_data: Any = None, merge: bool = True, transfer: bool = True,
                 wait: bool = True) -> None:
        if gains not in GAINS:
            raise ValueError(f"gains must be one of {', '.join(GAINS)}, not {gains!r}")
        self.gains = gains
        self.window = window
        self.min_gain = min_gain
        self.merge = merge
        self.transfer = transfer
        self.wait = wait
        self.t2v = Task2VecGains(task_data, who="apportion") if gains == "task2vec" else None
        self.records: dict[str, Any] = {}  # job id -> its rate-source key (trace record)
        self.backbone: dict[str, str | None] = {}
        self.task: dict[str, str | None] = {}
        self.finished: dict[str, list[str]] = {}  # backbone -> finished job ids, in order
        self.source: dict[str, str] = {}  # started from a sibling's weights: job -> source
        self.members: dict[str, tuple[str, ...]] = {}  # merged lead -> members
        self.inside: dict[str, str] = {}  # member -> lead
        self.awaiting: dict[str, tuple[str, float]] = {}  # this round: job -> (sibling, eta)
        # task2vec: a mode's gain as the rate source measured it, until its job ends
        self.running_modes: dict[str, tuple[str, str, str, float]] = {}

    # -- memory ----------------------------------------------------------------------------
    def observe(self, view: View) -> None:
        """New jobs' records, finished siblings (their weights exist from now on), and the
        modes of jobs that ended forgotten."""
        for js in view.jobs:
            if js.spec.backbone is not None and js.id not in self.records:
                self.records[js.id] = js.trace if js.trace is not None else js.spec
                self.backbone[js.id] = js.spec.backbone
                self.task[js.id] = js.spec.task
        for js in getattr(view, "finished", None) or ():  # an operator's finished siblings
            if js.id not in self.records:
                self.records[js.id] = js.trace if js.trace is not None else js.spec
                self.backbone[js.id] = js.spec.backbone
                self.task[js.id] = js.spec.task
            bb = js.spec.backbone
            if bb is not None and js.id not in self.finished.get(bb, []):
                self.finished.setdefault(bb, []).append(js.id)
        self.awaiting = {}
        if not self.records:  # no fine-tuning job seen: nothing to remember
            return
        if self.t2v is not None:  # a missing task-data folder is refused by name (exit 2)
            self.t2v.check_folder()
        if self.t2v is not None:
            for jid in view.finished_recent:
                got = self.running_modes.pop(jid, None)
                if got is not None:
                    self.t2v.measured(*got)
        for jid in view.finished_recent:
            bb = self.backbone.get(jid)
            if bb is not None and jid in self.records:
                self.finished.setdefault(bb, []).append(jid)
            self.source.pop(jid, None)
            for m in self.members.pop(jid, ()):
                self.inside.pop(m, None)
            self.inside.pop(jid, None)

    @staticmethod
    def started(js: JobView) -> bool:
        return js.first_start is not None or js.alloc is not None or js.done > 0 \
            or js.spec.iterations_done > 0

    def sharing(self, js: JobView) -> bool:
        """A queued sibling that may still take a mode."""
        return (js.spec.accepts_sharing and js.spec.backbone is not None
                and js.id not in self.inside and js.id not in self.members
                and js.id not in self.source and not self.started(js))

    def relevant(self, view: View) -> bool:
        """Whether this round has anything for siblings (else the round is as it was)."""
        return bool(self.members or self.source) or any(
            js.spec.backbone is not None and js.spec.accepts_sharing for js in view.jobs)

    # -- rates ------------------------------------------------------------------------------
    def _kw(self, jid: str) -> dict[str, Any]:
        if jid in self.members:
            return {"members": tuple(self.records[m] for m in self.members[jid])}
        if jid in self.source:
            return {"source": self.records[self.source[jid]]}
        return {}

    @staticmethod
    def _rate_fn(view: View, js: JobView, **kw: Any) -> Callable[[str, int], float]:
        return lambda t, g: float(view.rate(js, t, g, **kw))

    def _best_type(self, view: View, js: JobView) -> str | None:
        best, rate = None, 0.0
        for t in sorted(view.capacity):
            r = float(view.rate(js, t, 1))
            if r > rate:
                best, rate = t, r
        return best

    def _transfer_gain(self, view: View, js: JobView, src: str, t: str) -> float | None:
        """The predicted gain of ``js`` started from ``src``'s weights (None: none known)."""
        if self.t2v is not None:
            return self.t2v.temporal(self.backbone.get(src), self.task.get(src),
                                     js.spec.task, self._tasks(js.spec.backbone))
        alone = float(view.rate(js, t, 1))
        warm = float(view.rate(js, t, 1, source=self.records[src]))
        if alone <= 0 or warm <= 0:
            return None
        return 1.0 - alone / warm

    def _tasks(self, backbone: str | None) -> frozenset[str]:
        return frozenset(t for jid, t in self.task.items()
                         if t and self.backbone.get(jid) == backbone)

    # -- the round ----------------------------------------------------------------------------
    def options(self, view: View) -> SiblingOptions:
        """The round's options (:class:`~apportion.formulations.siblings.SiblingOptions`)."""
        opts = SiblingOptions()
        by_id = {js.id: js for js in view.jobs}
        for js in view.jobs:
            opts.remaining[js.id] = js.remaining
            opts.batch[js.id] = max(1, js.spec.global_batch_size)
        for jid in list(self.members) + list(self.source):
            started = by_id.get(jid)
            if started is not None:
                opts.modes[jid] = self._rate_fn(view, started, **self._kw(jid))
        opts.members = {lead: tuple(m for m in ms if m in by_id)
                        for lead, ms in self.members.items() if lead in by_id}
        queued = [js for js in view.jobs if self.sharing(js)]
        if not queued:
            return opts
        alone: dict[str, tuple[str, float]] = {}  # job -> (best type, its 1-GPU time as offered)
        for js in queued:
            t = self._best_type(view, js)
            if t is None:
                continue
            r1 = float(view.rate(js, t, 1))
            alone[js.id] = (t, js.remaining / r1 if r1 > 0 else float("inf"))
            if not self.transfer:
                continue
            best, gain = None, self.min_gain
            for src in self.finished.get(js.spec.backbone or "", []):
                g = self._transfer_gain(view, js, src, t)
                if g is not None and g > gain:
                    best, gain = src, g
            if best is None:
                continue
            rate = self._transfer_rate(view, js, best, gain)
            opts.transfers[js.id] = (best, gain, rate)
            r1 = rate(t, 1)
            if r1 > 0:
                alone[js.id] = (t, js.remaining / r1)
        if self.merge:
            opts.merges = self._pairs(view, queued, alone)
        if self.transfer and self.wait:
            opts.waits = self._waits(view, queued, opts)
        self.awaiting = dict(opts.waits)
        return opts

    def _waits(self, view: View, queued: list[JobView], opts: SiblingOptions
               ) -> dict[str, tuple[str, float]]:
        """Queued jobs that finish sooner by waiting for a running sibling's weights than by
        starting now (on their requested GPUs of their best type, in the mode offered
        now): the YMIR paper's temporal mode A->B with B queued behind A."""
        running = [js for js in view.jobs if js.alloc is not None and js.spec.backbone
                   and js.id not in self.inside]
        if not running:
            return {}
        eta: dict[str, float] = {}
        for s in running:
            a = s.alloc
            assert a is not None
            r = float(view.rate(s, a.gpu_type, a.gpus, **self._kw(s.id)))
            if r > 0:
                eta[s.id] = max(0.0, s.remaining / r)
        out: dict[str, tuple[str, float]] = {}
        for js in queued:
            t = self._best_type(view, js)
            if t is None:
                continue
            n = max(1, min(js.spec.requested_gpus, view.capacity.get(t, 0)))
            now_rate = opts.transfers[js.id][2](t, n) if js.id in opts.transfers \
                else float(view.rate(js, t, n))
            if now_rate <= 0:
                continue
            best: tuple[float, str] = (js.remaining / now_rate, "")
            for s in running:
                if s.spec.backbone != js.spec.backbone or s.id not in eta:
                    continue
                if self.t2v is not None:
                    g = self.t2v.temporal(s.spec.backbone, s.spec.task, js.spec.task,
                                          self._tasks(js.spec.backbone))
                    warm = now_rate if g is None or g <= 0 else \
                        float(view.rate(js, t, n)) / max(1e-6, 1.0 - g)
                else:
                    warm = float(view.rate(js, t, n, source=self.records[s.id]))
                if warm <= 0:
                    continue
                done = eta[s.id] + js.remaining / warm
                if done < best[0]:
                    best = (done, s.id)
            if best[1]:
                out[js.id] = (best[1], eta[best[1]])
        return out

    def _transfer_rate(self, view: View, js: JobView, src: str, gain: float
                       ) -> Callable[[str, int], float]:
        """The rate from ``src``'s weights: the rate source's where it knows the mode (it
        differs from the job's own rate), else the own rate with the work cut by ``gain``."""
        kw = {"source": self.records[src]}
        t = self._best_type(view, js)
        if self.t2v is None or (t is not None and float(view.rate(js, t, 1, **kw))
                                != float(view.rate(js, t, 1))):
            return self._rate_fn(view, js, **kw)
        cut = 1.0 / max(1e-6, 1.0 - gain)
        return lambda ty, g: cut * float(view.rate(js, ty, g))

    def _pairs(self, view: View, queued: list[JobView], alone: dict[str, tuple[str, float]]
               ) -> list[tuple[str, str, Callable[[str, int], float]]]:
        by_bb: dict[str, list[JobView]] = {}
        for js in queued:
            if js.id in alone:
                by_bb.setdefault(js.spec.backbone or "", []).append(js)
        out = []
        for bb, group in sorted(by_bb.items()):
            group = sorted(group, key=lambda j: (alone[j.id][1], j.id))[: self.window]
            for i, a in enumerate(group):
                for b in group[i + 1:]:
                    lead, member = sorted((a, b), key=lambda j: (j.spec.submit_time_s, j.id))
                    kw: dict[str, Any] = {"members": (self.records[member.id],)}
                    t = alone[lead.id][0]
                    r1 = float(view.rate(lead, t, 1, **kw))
                    knows = r1 != float(view.rate(lead, t, 1))  # the source rates merging
                    if self.t2v is not None:
                        g = self.t2v.spatial(bb, lead.spec.task, member.spec.task,
                                             self._tasks(lead.spec.backbone))
                    elif knows and r1 > 0:
                        g = 1.0 - (lead.remaining / r1) / (alone[lead.id][1] + alone[member.id][1])
                    else:  # an estimator's rates know no merging: nothing to offer
                        g = None
                    if g is None or g <= self.min_gain:
                        continue
                    rate = self._rate_fn(view, lead, **kw) if knows else \
                        self._predicted_merge(view, lead, member, g)
                    out.append((lead.id, member.id, rate))
        return out

    @staticmethod
    def _predicted_merge(view: View, lead: JobView, member: JobView, gain: float
                         ) -> Callable[[str, int], float]:
        """The merged job's rate (in the lead's iterations) where the rate source knows no
        merging: YMIR's table-9 model, the merged work ``(1 - g)`` of both jobs' work on the
        same GPUs (an epoch of the merged job is both jobs' epochs)."""
        def rate(t: str, n: int) -> float:
            ra, rb = float(view.rate(lead, t, n)), float(view.rate(member, t, n))
            if ra <= 0 or rb <= 0:
                return 0.0
            both = lead.remaining / ra + member.remaining / rb
            return lead.remaining / max(1e-9, (1.0 - gain) * both)
        return rate

    # -- the decision --------------------------------------------------------------------------
    def annotate(self, view: View, decision: Decision, cells: dict[str, dict[str, Any]]) -> None:
        """The decision's ``meta`` (``transfer``, ``merged``) and each member's reason, from
        the chosen cells' attributes (``cells``: job -> its chosen cell's attributes); a job
        started now keeps its mode for the rest of its life."""
        meta = sibling_meta(cells)
        by_id = {js.id: js for js in view.jobs}
        for jid, d in cells.items():
            js = by_id.get(jid)
            if js is None or self.started(js) or jid in self.members or jid in self.source:
                continue
            if d.get("source") is not None:
                self.source[jid] = str(d["source"])
                self._remember(view, js, "temporal", str(d["source"]))
            if d.get("members"):
                self.members[jid] = tuple(d["members"])
                for m in d["members"]:
                    self.inside[m] = jid
                self._remember(view, js, "spatial", str(d["members"][0]))
        for lead, ms in self.members.items():  # every fixed merge, chosen or not this round
            if lead in cells:
                meta["merged"][lead] = list(ms)
        for jid, src in self.source.items():
            if jid in cells:
                meta["transfer"][jid] = src
        decision.meta.update(meta)
        for p in decision.pending:
            inside = self.inside.get(p.job)
            awaits = self.awaiting.get(p.job)
            if inside is None and awaits is not None:
                p.reason, p.stage, p.action, p.can_ever_fit = \
                    Reason.AWAITS_SOURCE, "candidates", None, True
                p.detail = (f"waits for sibling {awaits[0]}'s weights (its end predicted in "
                            f"{awaits[1]:.0f} s): started from them it finishes sooner")
            if inside is not None:
                p.reason, p.stage, p.action = Reason.MERGED, "solve", None
                p.detail = f"trains inside merged job {inside}"
                p.can_ever_fit = True

    def _remember(self, view: View, js: JobView, kind: str, other: str) -> None:
        """Task2Vec's calibration: a starting mode's gain as the rate source measures the
        run, kept until the job ends (then it refits the score-to-gain map)."""
        if self.t2v is None:
            return
        t = self._best_type(view, js)
        if t is None:
            return
        bb = js.spec.backbone or ""
        if kind == "temporal":
            g = self._rate_gain(view, js, other, t)
            if g is not None:
                self.running_modes[js.id] = (bb, "temporal",
                                             f"{self.task.get(other)}{TEMPORAL_SEP}{js.spec.task}",
                                             g)
            return
        om = next((o for o in view.jobs if o.id == other), None)
        if om is None:
            return
        r_a, r_b = float(view.rate(js, t, 1)), float(view.rate(om, t, 1))
        merged = float(view.rate(js, t, 1, members=(self.records[other],)))
        if min(r_a, r_b, merged) > 0:
            alone = js.remaining / r_a + om.remaining / r_b
            self.running_modes[js.id] = (bb, "spatial",
                                         f"{js.spec.task}{SPATIAL_SEP}{om.spec.task}",
                                         1.0 - (js.remaining / merged) / alone)

    def _rate_gain(self, view: View, js: JobView, src: str, t: str) -> float | None:
        alone = float(view.rate(js, t, 1))
        warm = float(view.rate(js, t, 1, source=self.records[src]))
        return None if alone <= 0 or warm <= 0 else 1.0 - alone / warm
