"""A deterministic discrete-event simulator of a GPU cluster run in scheduling rounds.

Time advances round by round (``interval_s``, default 300 s). At each round
boundary the jobs that have arrived are handed to the policy, which returns a
:class:`apportion.decision.Decision`; the spine's independent validator checks
it (an invalid decision stops the run: a policy bug must not hide in the
numbers); then each job runs until the next boundary at the **ground-truth**
rate of its allocation (:mod:`apportion.experiments.groundtruth`), never at the
rate the policy estimated. A job finishes at the exact instant its last
iteration completes (``start + remaining / rate``), so JCTs carry no
round-granularity error; its GPUs stay idle until the next round, as in
Gavel's and Crius's round-based simulators.

Restart cost: a job whose allocation changes (start after a preemption,
resize, migration, new plan) makes no progress for ``restart_cost_s``
(default 78 s: Morphling section 7.3 measured 78 s per reconfiguration); the
first start costs ``start_cost_s`` (default 0). The ``gavel`` profile follows
Gavel's simulator: 360 s rounds, no restart cost, and a multi-GPU job's rate does not
depend on how its GPUs spread over servers (``consolidated_rates``); the ``pollux`` profile
Pollux's: 60-s rounds, 30 s for every new allocation, the first included.

A truth whose rate moves with a job's progress (``by_progress``: Pollux's statistical
efficiency changes epoch by epoch) is asked with the job's progress every round, and a job
advances to each point where its rate changes (``next_change``) and is rated again there,
within the round; a truth that ``rates_batches`` rates an allocation at the global batch
the policy chose for it (``Allocation.global_batch_size``), else at the job's own. After
each round such a truth says what every job reports of its gradients (``grad_stats``: the
job's ``JobSpec.grad_stats``, as ``apportion run`` fills them from the store).

Run modes (fine-tuning, YMIR): a decision's ``meta`` may say *how* a job starts,
and the ground truth says what that changes. ``meta["transfer"] = {job: source}``
starts a job from a finished job's weights; ``meta["merged"] = {lead: [members]}``
trains the members inside the lead's allocation as one merged job (the
validator still sees one allocation per GPU set: the lead's; the members are
pending). The mode is fixed at a job's first start (:meth:`Simulator._fix_modes`)
and handed to the truth's ``rate`` as keyword arguments (``source=``,
``members=``, trace records) for the rest of the job's life; members finish
when their lead does. Decisions without these keys (every other policy) run
exactly as before.

Everything is seeded: the same trace, policy, cluster and seed give the same
numbers, byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from apportion.experiments.groundtruth import ConsolidatedRates
from apportion.experiments.information import rate_source
from apportion.experiments.lower_bound import bound_summary
from apportion.experiments.pollux_reference import ROUND_RULES
from apportion.experiments.traces import SimJob, Trace

from apportion.cluster import Cluster
from apportion.decision import Allocation, Decision, Reason
from apportion.jobs import JobSpec
from apportion.measured_rates import RateFeedback
from apportion.policies.config import RoundConfig, check_deterministic
from apportion.policies.scheduler import Scheduler
from apportion.round import InvalidDecision
from apportion.view import JobView, View

log = logging.getLogger(__name__)


class SimulationError(RuntimeError):
    """A policy returned a decision the validator rejects, or the run cannot proceed."""


@dataclass(frozen=True)
class SimConfig:
    interval_s: float = 300.0
    restart_cost_s: float = 78.0
    start_cost_s: float = 0.0
    noise_sigma: float = 0.0
    seed: int = 0
    max_sim_s: float | None = None
    stall_rounds: int = 500  # stop when no arrivals remain and nothing progressed this long
    profile: str = "default"
    information: str = "estimated"  # every policy's rate source: oracle | estimated
    estimator: str = "analytic"  # the estimated mode's scaling model (estimation.registry)
    # measured throughput corrects every policy's rates (apportion.measured_rates)
    rate_feedback: bool = True
    # the optimising policies' solver budgets counted in work, not seconds (RoundConfig.
    # deterministic): the replay repeats exactly on any machine under any load
    deterministic: bool = False
    # report a lower bound on the average JCT any schedule could reach on this trace and
    # cluster (experiments.lower_bound; an LP over the trace: off for speed benchmarks)
    jct_bound: bool = True
    # every placement progresses at the consolidated (one-server) rate, as in Gavel's
    # simulator, which never reads its ``*_unconsolidated`` throughputs (gavel profile)
    consolidated_rates: bool = False


PROFILES: dict[str, SimConfig] = {
    "default": SimConfig(),
    "gavel": SimConfig(interval_s=360.0, restart_cost_s=0.0, start_cost_s=0.0, profile="gavel",
                       consolidated_rates=True),
    # YMIR's fine-tuning replays: 60-s rounds; every start and restart costs the measured
    # context switch of RoBERTa-base on V100 (30.4 s, titan-finetune fminfo)
    "ymir": SimConfig(interval_s=60.0, restart_cost_s=30.4, start_cost_s=30.4, profile="ymir"),
    # Pollux's simulator's round rules (experiments/pollux_reference): 60-s rounds; every new
    # allocation of a job, its first included, makes no progress for 30 s
    "pollux": SimConfig(**ROUND_RULES, profile="pollux"),
}


@dataclass(eq=False)
class JobState(JobView):
    """A job inside the simulation: the policy's :class:`JobView` plus what only the
    simulator knows (the true rate of its allocation, when it finishes). Policies
    read the view's fields; only the simulator writes."""

    true_rate: float = 0.0  # true iterations/s of the current allocation (never shown to policies)
    busy_until: float = 0.0
    finish: float | None = None
    dropped: bool = False  # the policy gave up on it (ElasticFlow's admission control)
    # run mode fixed at the first start: keyword arguments of the truth's ``rate``
    # (``source=``: started from a finished job's weights; ``members=``: merged lead)
    mode: dict[str, Any] = field(default_factory=dict)
    members: tuple[str, ...] = ()  # jobs trained inside this one; they finish with it
    merged_into: str | None = None  # the lead this job trains inside

    @property
    def remaining(self) -> float:
        return max(0.0, self.trace.iterations - self.done)


@dataclass
class SimResult:
    jobs: pd.DataFrame
    timeline: pd.DataFrame
    rounds: pd.DataFrame
    summary: dict[str, Any]


def _spec(j: SimJob) -> JobSpec:
    ft = j.finetune
    return JobSpec(id=j.job_id, model=j.model or j.job_type, global_batch_size=max(1, j.batch),
                   iterations=max(1, int(round(j.iterations))), requested_gpus=j.gpus,
                   requested_gpu_type=j.gpu_type, submit_time_s=j.submit_s, tenant=j.tenant,
                   guaranteed=j.guaranteed, deadline_s=j.deadline_s,
                   priority_weight=float(j.priority_weight),
                   backbone=ft.backbone if ft else None, task=ft.task if ft else None,
                   accepts_sharing=bool(ft and ft.accepts_sharing), batch_range=j.batch_range,
                   max_gpus=j.max_gpus, elastic=j.elastic)


@dataclass
class _Replay:
    """A replay's state between its rounds: what the loop and the pipeline's hooks share."""

    states: dict[str, JobState] = field(default_factory=dict)
    active: list[JobState] = field(default_factory=list)
    done: list[JobState] = field(default_factory=list)
    dropped: list[JobState] = field(default_factory=list)
    too_large: list[str] = field(default_factory=list)
    no_fit_memory: list[str] = field(default_factory=list)  # no plan fits any GPU's memory
    timeline: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    t: float = 0.0  # this round's time
    round: int = 0
    decided_from: float = 0.0  # when this round's pipeline started (perf_counter)


def _never_fit(decision: Decision) -> list[str]:
    """The jobs no plan fits in any GPU's memory (they can never run here)."""
    return sorted(p.job for p in decision.pending
                  if not p.can_ever_fit and p.reason is Reason.NO_FIT_MEMORY)


def _dropped(decision: Decision) -> set[str]:
    """The jobs a round leaves for good: refused by admission (they can never fit), no plan
    fitting any GPU's memory, or dropped by the policy (ElasticFlow's admission control)."""
    return {p.job for p in decision.pending if (p.stage == "admit" and not p.can_ever_fit)
            or (p.action is not None and p.action.value == "drop")} | set(_never_fit(decision))


def _not_run(attempt: dict[str, Any]) -> bool:
    """A chain attempt that never ran: skipped, or no budget was left for it."""
    msg = str(attempt.get("message", ""))
    return msg.startswith(("skipped", "no budget left"))


def _same(a: Allocation, b: Allocation | None, code_a: str | None, code_b: str | None) -> bool:
    return (b is not None and a.gpu_type == b.gpu_type and a.gpus == b.gpus
            and a.placement == b.placement and a.plan == b.plan and code_a == code_b)


class Simulator:
    """Replay ``trace`` on ``cluster`` under ``policy``; progress from ``truth``."""

    def __init__(self, cluster: Cluster, trace: Trace, policy: Any, truth: Any,
                 config: SimConfig | None = None,
                 progress: Callable[[float, int, int], None] | None = None) -> None:
        self.cluster = cluster
        self.trace = trace
        self.policy = policy
        self.cfg = config or SimConfig()
        self.truth = ConsolidatedRates(truth) if self.cfg.consolidated_rates else truth
        # a truth whose rate moves with the job's progress (Pollux's: efficiency by epoch) is
        # asked with it every round and advances jobs epoch by epoch (:meth:`_run_epochs`)
        self.by_progress = bool(getattr(truth, "by_progress", False))
        self.rates_batches = bool(getattr(truth, "rates_batches", False))
        if self.cfg.deterministic:
            deterministic_policy(policy)
        # the round's pipeline with the policy the caller built, and this replay's hooks
        self.scheduler = Scheduler(policy=policy, apply=self._take_effect)
        self._replay = _Replay()
        self.view = rate_source(self.cfg.information, self.truth, cluster, self.cfg.seed,
                                self.cfg.noise_sigma, self.cfg.estimator)
        self.progress = progress
        self.types = cluster.gpu_types
        self.cap = cluster.capacity_by_type()

    # -- the loop ------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg = self.cfg
        arrivals = deque(sorted(self.trace.jobs, key=lambda j: (j.submit_s, j.job_id)))
        rp = self._replay = _Replay()
        if not arrivals:
            return self._result(rp.done, [], rp.timeline, rp.rounds, 0.0, 0.0)
        iv = cfg.interval_s
        t0 = float(np.floor(arrivals[0].submit_s / iv) * iv)
        t = t0
        r = 0
        stall = 0
        finished_recent: list[str] = []
        total_gpus = self.cluster.total_gpus
        wall0 = time.perf_counter()
        feedback = RateFeedback() if cfg.rate_feedback else None
        while True:
            arrived: list[str] = []
            while arrivals and arrivals[0].submit_s <= t:
                j = arrivals.popleft()
                js = JobState(_spec(j), trace=j)
                rp.states[j.job_id] = js
                rp.active.append(js)
                arrived.append(j.job_id)
            if not rp.active:
                if not arrivals:
                    break
                if cfg.max_sim_s is not None and t - t0 >= cfg.max_sim_s:
                    break
                t = float(np.ceil(arrivals[0].submit_s / iv) * iv)
                continue
            if cfg.max_sim_s is not None and t - t0 >= cfg.max_sim_s:
                break
            state = View(t, self.cluster, list(rp.active), self.view, r, iv, cfg.seed,
                         cfg.information, list(finished_recent), arrived, dict(self.cap),
                         needs_catalog=False, restart_s=cfg.restart_cost_s)
            if feedback is not None:  # what each running job was measured to do
                feedback.observe(state)
            rp.t, rp.round, rp.decided_from = t, r, time.perf_counter()
            try:  # the one round pipeline: admit, decide, validate (an invalid one raises),
                # then this replay's commit (its log of rounds) and apply (the decision
                # takes effect in the simulated cluster) hooks
                self.scheduler.decide(state, self._commit)
            except InvalidDecision as exc:
                raise SimulationError(f"round {r} at t={t:.0f}: {exc}") from None
            progressed, finished_recent = self._advance(rp.active, t, t + iv, rp.timeline)
            if self.by_progress and hasattr(self.truth, "grad_stats"):
                self._report_stats(rp.active)
            for jid in finished_recent:
                js = rp.states[jid]
                rp.done.append(js)
            if finished_recent:
                fin = set(finished_recent)
                rp.active = [js for js in rp.active if js.id not in fin]
            stall = 0 if (progressed or arrivals) else stall + 1
            if stall >= cfg.stall_rounds:
                log.warning("%s: nothing progressed for %d rounds; stopping with %d jobs unfinished",
                            getattr(self.policy, "name", "policy"), stall, len(rp.active))
                break
            t += iv
            r += 1
            if self.progress is not None:
                self.progress(t - t0, len(rp.done), len(self.trace.jobs))
        unfinished = rp.dropped + rp.active + [JobState(_spec(j), trace=j) for j in arrivals]
        if rp.too_large:
            log.warning("%d jobs ask for more GPUs than the cluster has (%d); refused: %s",
                        len(rp.too_large), total_gpus, ", ".join(rp.too_large[:5]))
        res = self._result(rp.done, unfinished, rp.timeline, rp.rounds, t0,
                           time.perf_counter() - wall0)
        if rp.no_fit_memory:
            log.warning("%d jobs fit no GPU's memory with any plan; refused: %s",
                        len(rp.no_fit_memory), ", ".join(rp.no_fit_memory[:5]))
        res.summary["refused_larger_than_cluster"] = len(rp.too_large)
        res.summary["refused_no_fit_memory"] = len(rp.no_fit_memory)
        res.summary["trace_notes"] = list(getattr(self.trace, "notes", []) or [])
        return res

    # -- the pipeline's hooks -----------------------------------------------------------
    def _commit(self, decision: Decision) -> None:
        """The commit hook: the round in the replay's log (``rounds.csv``), as decided."""
        rp = self._replay
        policy_s = time.perf_counter() - rp.decided_from
        gone = _dropped(decision)
        rep = decision.report
        ran = [a for a in rep.attempts if not _not_run(a)]
        rp.rounds.append({
            "round": rp.round, "t": rp.t,
            "active": len(rp.active) - (sum(1 for js in rp.active if js.id in gone)
                                        if gone else 0),
            "policy_s": policy_s, "solver_s": rep.wall_s, "backend": rep.backend,
            "status": rep.status, "fallback": bool(rep.fallback), "objective": rep.objective,
            "bound": rep.bound, "gap": rep.gap, "placed": len(decision.allocations),
            # the chain as it ran (where a replay's solver time goes)
            "chain": "+".join(str(a.get("backend")) for a in ran),
            "chain_s": "+".join(f"{float(a.get('wall_s') or 0.0):.3f}" for a in ran),
            "stalled": any("stopped:" in str(a.get("message", "")) for a in ran),
            "time_limited": any(bool(a.get("time_limited")) for a in ran),
            # a deterministic budget's work (nominal seconds, solvers.base):
            # what a replay is timed by when the clock is only a safety stop
            "work_s": sum(float(a.get("work_s") or 0.0) for a in ran)})

    def _take_effect(self, decision: Decision) -> None:
        """The apply hook: the decision takes effect in the simulated cluster (each job's
        allocation and true rate); what admission refuses for good (a job larger than the
        cluster: the pipeline's typed reason, as every driver gives it) and what the policy
        drops never runs: dropped, counted."""
        rp = self._replay
        self._apply(decision, rp.active, rp.states, rp.t)
        rp.too_large += sorted(p.job for p in decision.pending if p.stage == "admit"
                               and p.reason is Reason.TOO_LARGE)
        rp.no_fit_memory += _never_fit(decision)  # dropped and counted, never a stall
        dropped_now = _dropped(decision)
        if dropped_now:
            for js in rp.active:
                if js.id in dropped_now:
                    js.dropped = True
                    js.alloc, js.true_rate = None, 0.0
            rp.dropped.extend(js for js in rp.active if js.id in dropped_now)
            rp.active = [js for js in rp.active if js.id not in dropped_now]

    # -- applying a decision -----------------------------------------------------------
    def _apply(self, decision: Decision, active: list[JobState], states: dict[str, JobState],
               now: float) -> None:
        codes: dict[str, str] = decision.meta.get("plan_codes", {}) if decision.meta else {}
        by_job = {a.job: a for a in decision.allocations}
        self._fix_modes(decision, states, now)
        for js in active:
            a = by_job.get(js.id)
            if a is None:
                if js.alloc is not None:
                    js.preemptions += 1
                js.alloc, js.true_rate, js.plan_code = None, 0.0, None
                continue
            code = codes.get(js.id)
            if not _same(a, js.alloc, code, js.plan_code):
                first = js.first_start is None
                js.busy_until = now + (self.cfg.start_cost_s if first else self.cfg.restart_cost_s)
                if first:
                    js.first_start = now
                else:
                    js.restarts += 1
            js.alloc, js.plan_code = a, code
            js.true_rate = self._true_rate(js, a, code)
            js.est_rate = (float(a.est_throughput) / max(1, js.trace.batch) if a.est_throughput
                           else 0.0)

    def _true_rate(self, js: JobState, a: Allocation, code: str | None) -> float:
        """The truth's rate of ``js`` on ``a``: with its run mode, and where the truth reads
        them, its progress and the batch the allocation chose."""
        if not self.by_progress and not self.rates_batches:
            return float(self.truth.rate(js.trace, a.gpu_type, a.gpus, a.placement, code,
                                         **js.mode))
        kw = dict(js.mode)
        if self.by_progress:
            kw["progress"] = js.done
        if self.rates_batches and a.global_batch_size is not None:
            kw["batch"] = int(a.global_batch_size)
        return float(self.truth.rate(js.trace, a.gpu_type, a.gpus, a.placement, code, **kw))

    def _run_epochs(self, js: JobState, start: float, t1: float) -> float | None:
        """Advance ``js`` from ``start`` toward ``t1`` at its true rate, asking the truth
        again wherever the rate changes (an epoch's end, :meth:`PolluxTruth.next_change`);
        the instant it finishes, or None when the round ends first."""
        now, total = start, js.trace.iterations
        for _ in range(100_000):  # a job has far fewer epochs than this
            rate = js.true_rate
            if rate <= 0:
                return None
            stop = min(float(self.truth.next_change(js.trace, js.done)), total)
            if stop <= js.done:  # nothing left before the change: run to the end
                stop = total
            need = (stop - js.done) / rate
            if now + need > t1:
                js.done += rate * (t1 - now)
                return None
            now += need
            js.done = stop
            if stop >= total:
                return now
            assert js.alloc is not None
            js.true_rate = self._true_rate(js, js.alloc, js.plan_code)
        raise SimulationError(f"{js.id}: its rate changed too often in one round")

    def _report_stats(self, active: list[JobState]) -> None:
        """What each job reports of its gradients after a round (Pollux's jobs measure them
        at the batch they run): its spec's ``grad_stats``, as ``run`` fills them from the
        store, so a policy sees them change epoch by epoch."""
        for js in active:
            a = js.alloc
            stats = self.truth.grad_stats(
                js.trace, js.done, a.global_batch_size if a is not None else None)
            if stats != js.spec.grad_stats:
                js.spec = replace(js.spec, grad_stats=stats)

    def _fix_modes(self, decision: Decision, states: dict[str, JobState], now: float) -> None:
        """The run mode a decision's ``meta`` asks for, fixed at each job's first start
        (``transfer``: a finished source job; ``merged``: unstarted members, trained in
        the lead's allocation). A decision that allocates a merged member on its own,
        names an unfinished source or merges a started job is a policy bug."""
        meta = decision.meta or {}
        transfer: dict[str, str] = meta.get("transfer") or {}
        merged: dict[str, list[str]] = meta.get("merged") or {}
        allocated = {a.job for a in decision.allocations}
        for a in decision.allocations:
            js = states[a.job]
            if js.merged_into is not None:
                raise SimulationError(f"{a.job} trains inside {js.merged_into}; it cannot be "
                                      "allocated on its own")
            if js.first_start is not None:
                continue  # the mode is fixed at the first start
            members = tuple(merged.get(a.job, ()))
            src = transfer.get(a.job)
            for m in members:
                ms = states.get(m)
                if (ms is None or ms.first_start is not None or ms.finish is not None
                        or ms.dropped or m in allocated or ms.members or ms.merged_into
                        or m == a.job):
                    raise SimulationError(f"{a.job} cannot merge {m}: members must be other "
                                          "queued jobs that never started")
            if src is not None:
                ss = states.get(src)
                if ss is None or ss.finish is None or ss.finish > now:
                    raise SimulationError(f"{a.job} starts from {src}'s weights, which has "
                                          "not finished")
                js.mode["source"] = ss.trace
            if members:
                js.mode["members"] = tuple(states[m].trace for m in members)
                js.members = members
                for m in members:
                    states[m].merged_into = a.job
                    states[m].first_start = now

    # -- advancing time -----------------------------------------------------------------
    def _advance(self, active: list[JobState], t0: float, t1: float,
                 timeline: list[dict[str, Any]]) -> tuple[bool, list[str]]:
        busy = dict.fromkeys(self.types, 0.0)
        useful = dict.fromkeys(self.types, 0.0)
        samples = 0.0
        iters_norm = 0.0
        finished: list[str] = []
        progressed = False
        running = 0
        by_id = {js.id: js for js in active}
        for js in active:
            a = js.alloc
            js.stalled = False
            if a is None:
                continue
            running += 1
            start = min(max(t0, js.busy_until), t1)
            end = t1
            rate = js.true_rate
            if rate > 0 and start < t1 and self.by_progress:  # epoch by epoch
                before = js.done
                done_at = self._run_epochs(js, start, t1)
                if done_at is not None:
                    end = done_at
                    js.done = js.trace.iterations
                    js.finish = end
                    finished.append(js.id)
                progressed = True
                samples += (js.done - before) * max(1, js.trace.batch)
                iters_norm += (end - start)
                useful[a.gpu_type] += a.gpus * (end - start)
            elif rate > 0 and start < t1:
                need = js.remaining / rate
                if start + need <= t1:
                    end = start + need
                    js.done = js.trace.iterations
                    js.finish = end
                    finished.append(js.id)
                    for m in js.members:  # merged jobs reach their targets together
                        ms = by_id.get(m)
                        if ms is not None:
                            ms.done, ms.finish = ms.trace.iterations, end
                            finished.append(m)
                else:
                    js.done += rate * (t1 - start)
                progressed = True
                samples += rate * max(1, js.trace.batch) * (end - start)
                iters_norm += (end - start)
                useful[a.gpu_type] += a.gpus * (end - start)
            elif rate <= 0:  # observable: the job held GPUs and reported no progress
                js.stalled_rounds += 1
                js.stalled = True
                js.stalled_on.add((a.gpu_type, a.gpus))
            held = end - t0
            busy[a.gpu_type] += a.gpus * held
            js.gpu_seconds += a.gpus * held
            js.run_seconds += held
            js.rounds_run += 1
            js.time_on_type[a.gpu_type] = js.time_on_type.get(a.gpu_type, 0.0) + held
        dt = t1 - t0
        row: dict[str, Any] = {"t": t0, "queued": len(active) - running, "running": running,
                               "throughput_samples_s": samples / dt, "finished": len(finished)}
        for g in self.types:
            row[f"busy_{g}"] = busy[g] / dt
            row[f"util_{g}"] = busy[g] / (dt * self.cap[g]) if self.cap[g] else 0.0
            row[f"useful_{g}"] = useful[g] / dt
        timeline.append(row)
        for js in active:
            if js.finish is not None and js.alloc is not None:
                js.alloc = None
            elif js.stalled and js.alloc is not None:
                # no progress (out of memory, say): the job fails and goes back to the queue,
                # as a crashed job does on a real cluster; every policy then sees rate 0
                # there (``JobView.stalled_on``) and places it again elsewhere
                js.alloc, js.true_rate, js.plan_code = None, 0.0, None
        return progressed, finished

    # -- results ----------------------------------------------------------------------
    def _result(self, done: list[JobState], unfinished: list[JobState],
                timeline: list[dict[str, Any]], rounds: list[dict[str, Any]], t0: float,
                wall_s: float) -> SimResult:
        from apportion.experiments.metrics import job_frame, summarize

        jobs = job_frame(done, unfinished, self.truth)
        tl = pd.DataFrame(timeline)
        rd = pd.DataFrame(rounds)
        end = float(timeline[-1]["t"]) + self.cfg.interval_s if timeline else None  # replay's end
        # a guaranteed job waits for the next round and pays its first start: no policy can
        # avoid either, so neither breaks its SLA
        summary = summarize(jobs, tl, rd, self.cluster, t0, end_s=end,
                            sla_slack_s=self.cfg.interval_s + self.cfg.start_cost_s)
        summary.update({
            "policy": getattr(self.policy, "name", type(self.policy).__name__),
            "trace": self.trace.name, "cluster": self.cluster.name, "profile": self.cfg.profile,
            "seed": self.cfg.seed, "interval_s": self.cfg.interval_s,
            "restart_cost_s": self.cfg.restart_cost_s, "noise_sigma": self.cfg.noise_sigma,
            "information": self.cfg.information, "estimator": self.cfg.estimator,
            "deterministic": self.cfg.deterministic,
            # rounds whose solver reached its clock (a deterministic replay's safety stop):
            # where there are any, a second replay may differ
            "rounds_time_limited": int(rd["time_limited"].sum()) if "time_limited" in rd else 0,
            "rates": getattr(self.view, "name", type(self.view).__name__),
            "truth": getattr(self.truth, "name", type(self.truth).__name__),
            "interpolated_configs": len(getattr(self.truth, "interpolated", ())),
            "sim_wall_s": round(wall_s, 3),
        })
        if self.cfg.jct_bound:  # jobs wait for a round tick: the bound knows the grid
            summary.update(bound_summary(self.trace.jobs, self.truth, self.cluster, summary,
                                         end, self.cfg.start_cost_s, self.cfg.interval_s))
        return SimResult(jobs, tl, rd, summary)


def deterministic_policy(policy: Any) -> None:
    """Give ``policy``'s solver a deterministic budget where it has a round config (the
    optimising policies); the heuristics are deterministic already, and the baselines
    with an ILP of their own (Sia's) solve it to optimality well inside their limit."""
    cfg = getattr(policy, "cfg", None)
    if isinstance(cfg, RoundConfig):
        check_deterministic(cfg)
        cfg.deterministic = True


def simulate(cluster: Cluster, trace: Trace, policy: Any, truth: Any,
             config: SimConfig | None = None, **overrides: Any) -> SimResult:
    """One run; ``overrides`` replace fields of ``config``."""
    cfg = replace(config or SimConfig(), **overrides) if overrides else (config or SimConfig())
    return Simulator(cluster, trace, policy, truth, cfg).run()
