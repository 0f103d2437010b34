"""The round, written once, in order: admit -> candidates -> formulate -> solve -> decode
-> validate -> commit -> apply.

Every driver makes its rounds here: ``solve-round`` (with or without a state
store), ``apportion run``, the simulator and ``compare``. A round takes a
:class:`~apportion.view.View` and a policy and returns a :class:`RoundResult`;
nothing here mutates the inputs, and nothing here knows any policy.

* **admit** (:mod:`apportion.admission`): jobs that can never be planned get a
  typed pending reason at stage ``admit``;
* **candidates, formulate, solve, decode**: a :class:`StagedPolicy` (apportion's
  formulations) exposes each stage and they run here in order; a baseline is one
  ``decide(view)`` call in place of the four;
* **validate**: the independent validator checks every decision not already
  checked when it was accepted; an invalid decision is never used (a staged
  policy falls back to its heuristic, a baseline's bug raises);
* **commit** and **apply**: hooks the caller passes (the state store's
  transaction; an executor or the simulator).

The library entry point, ``run_round(cluster, jobs, now, config)``, builds the
policy a config names and lives with the policies (:mod:`apportion.policies`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from apportion.admission import admit
from apportion.assembly import left_out
from apportion.blas_threads import one_blas_thread
from apportion.decision import Decision, Reason
from apportion.jobs import JobSpec
from apportion.validator import InvalidDecision, validate
from apportion.view import JobView, Policy, View

log = logging.getLogger(__name__)

STAGES = ("admit", "candidates", "formulate", "solve", "decode", "validate", "commit", "apply")
__all__ = ["InvalidDecision", "RoundResult", "STAGES", "StagedPolicy", "run_pipeline"]


@runtime_checkable
class StagedPolicy(Protocol):
    """A policy whose middle stages the pipeline runs one by one (apportion's formulations).

    ``shortcut`` may answer without solving (a replay's quiet round); ``candidates``
    returns the round's candidate graph, ``formulate`` its model and heuristic answer,
    ``solve`` the solver chain's answers (each validated as accepted), ``decode`` the
    decision (``meta["validated"]`` when already checked); ``fallback`` answers from the
    heuristic when the validator refuses; ``problem`` is the ``--dump-problem`` JSON of a
    graph ``candidates`` made."""

    name: str

    def shortcut(self, view: View) -> Decision | None: ...

    def candidates(self, view: View) -> Any: ...

    def formulate(self, view: View, graph: Any) -> Any: ...

    def solve(self, view: View, graph: Any, formulated: Any) -> Any: ...

    def decode(self, view: View, graph: Any, formulated: Any, solved: Any) -> Decision: ...

    def fallback(self, view: View, graph: Any, reason: str) -> Decision: ...

    def problem(self, graph: Any) -> dict[str, Any]: ...


@dataclass
class RoundResult:
    """A round's decision, its candidate graph and per-stage seconds; ``problem`` (the
    ``--dump-problem`` JSON) is made from the graph when first read, so a replay that
    never reads it never pays for it."""

    decision: Decision
    graph: Any
    _problem: dict[str, Any] | None = field(default=None, repr=False)
    timing: dict[str, float] = field(default_factory=dict)  # seconds per stage, commit included
    dump: Callable[[Any], dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def problem(self) -> dict[str, Any]:
        if self._problem is None:
            assert self.graph is not None and self.dump is not None
            self._problem = self.dump(self.graph)
        return self._problem


def run_pipeline(view: View, policy: Policy | StagedPolicy,
                 commit: Callable[[Decision], Any] | None = None,
                 apply: Callable[[Decision], Any] | None = None) -> RoundResult:
    """One round of ``policy`` on ``view`` through every stage, in order. The deciding
    stages run with one BLAS thread (:mod:`apportion.blas_threads`: a round's vectors are
    too short to share); the hooks run outside that limit, so neither a store's commit nor
    an executor's launches (a forked worker would inherit the limit) nor the simulator's
    advance are held to it."""
    timing: dict[str, float] = {}

    def lap(stage: str, since: float) -> float:
        now = time.perf_counter()
        timing[stage] = round(timing.get(stage, 0.0) + now - since, 6)
        return now

    with one_blas_thread():
        result, t = _stages(view, policy, timing, lap)
    if commit is not None:
        commit(result.decision)
        t = lap("commit", t)
    if apply is not None:
        apply(result.decision)
        lap("apply", t)
    return result


def _stages(view: View, policy: Policy | StagedPolicy, timing: dict[str, float],
            lap: Callable[[str, float], float]) -> tuple[RoundResult, float]:
    """admit -> candidates -> formulate -> solve -> decode -> validate: the decided round
    (its ``timing`` the stages' seconds, which the hooks' are added to) and the instant its
    last stage ended."""
    t0 = time.perf_counter()
    adm = admit(view.cluster, [js.spec for js in view.jobs], catalog=view.needs_catalog,
                rated=_rated_by(view))
    ok = {j.id: j for j in adm.admitted}
    # a job whose nodes are gone no longer runs anywhere: it is planned as queued
    sub = replace(view, jobs=[replace(js, spec=ok[js.id], alloc=None) if js.id in adm.requeued
                              else js for js in view.jobs if js.id in ok])
    t = lap("admit", t0)
    graph: Any = None
    problem: dict[str, Any] | None = None
    staged = policy if isinstance(policy, StagedPolicy) else None
    decision = staged.shortcut(sub) if staged is not None else None
    if decision is None and staged is not None:
        graph = staged.candidates(sub)
        t = lap("candidates", t)
        form = staged.formulate(sub, graph)
        t = lap("formulate", t)
        solved = staged.solve(sub, graph, form)
        t = lap("solve", t)
        decision = staged.decode(sub, graph, form, solved)
        t = lap("decode", t)
    elif decision is None:
        decision = policy.decide(sub)  # type: ignore[union-attr]
        t = lap("decide", t)
    if view.plan_filter is not None:  # the executor's workers run only some plans
        _refuse_plans(decision, sub, view.plan_filter)
    decision.pending.extend(adm.refused)
    specs = [js.spec for js in sub.jobs]
    if not decision.meta.get("validated"):
        check = validate(decision, view.cluster, specs)
        if not check.ok:
            if staged is None:
                raise InvalidDecision(f"policy {getattr(policy, 'name', policy)} returned an "
                                      f"invalid decision: {'; '.join(check.violations[:5])}")
            log.error("decision rejected by the validator: %s", check.violations)
            decision = staged.fallback(sub, graph, "validator rejected: "
                                       + "; ".join(check.violations))
            decision.pending.extend(adm.refused)
            if not validate(decision, view.cluster, specs).ok:
                raise InvalidDecision("the greedy fallback failed validation too: "
                                      + "; ".join(check.violations))
    decision.meta.pop("validated", None)
    t = lap("validate", t)
    # the decision is complete before it is committed: what is stored is what is reported
    decision.meta["stages"] = dict(timing)
    decision.meta.setdefault("policy", getattr(policy, "name", type(policy).__name__))
    decision.meta.setdefault("now_s", view.now)
    if graph is None:
        problem = {"now_s": view.now, "policy": decision.meta["policy"],
                   "jobs": [{"job": js.id, "requested_gpus": js.spec.requested_gpus,
                             "requested_gpu_type": js.spec.requested_gpu_type}
                            for js in sub.jobs]}
    return RoundResult(decision, graph, problem, timing,
                       dump=staged.problem if staged is not None else None), t


def _rated_by(view: View) -> Callable[[JobSpec], bool]:
    """Whether the view's rate source rates a job at its requested size on some GPU type:
    admission's test for a model the catalog lacks (an operator's measured-only model). A
    rate source that cannot describe the job (an analytic estimator on a model it has no
    layers of) does not rate it."""
    by_id = {js.id: js for js in view.jobs}

    def rated(spec: JobSpec) -> bool:
        js = by_id.get(spec.id) or JobView.from_spec(spec)
        for gpu_type, cap in sorted(view.capacity.items()):
            if cap < spec.requested_gpus:
                continue
            try:
                if view.rate(js, gpu_type, spec.requested_gpus) > 0:
                    return True
            except (KeyError, ValueError):  # CatalogError is a KeyError
                continue
        return False
    return rated


def _refuse_plans(decision: Decision, view: View, accept: Any) -> None:
    """Allocations whose plan the job's workload refuses become pending (``no-supported-plan``):
    a heuristic policy picks plans without asking the executor; a formulation never offers
    them (its candidates are filtered), so this only catches what a policy chose itself."""
    by_id = {js.id: js for js in view.jobs}
    kept = []
    for a in decision.allocations:
        js = by_id.get(a.job)
        why = accept(js.spec, a.plan) if js is not None else None
        if why is None:
            kept.append(a)
            continue
        log.warning("job %s: policy chose plan %s, which its workload refuses (%s)", a.job,
                    a.plan.label(), why)
        decision.pending.append(left_out(a.job, js.alloc is not None, Reason.NO_PLAN,
                                         f"plan {a.plan.label()}: {why}", stage="validate"))
    decision.allocations[:] = kept
