"""The policy and formulation checks: a policy decides an operator's round through the
pipeline; a registered formulation's answers, by the solver chain and by its heuristic
alone, keep the model's own rows."""

from __future__ import annotations

from typing import Any

from apportion.decision import Decision, Reason
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import cells_of
from apportion.jobs import JobSpec
from apportion.policies import RECIPES, RoundConfig, make_policy, run_round
from apportion.policies.formulation import FormulationPolicy, choice_vector
from apportion.testing.failures import check, expect
from apportion.testing.fixtures import CLUSTER, queue
from apportion.validator import validate
from apportion.view import Policy


@check
def check_policy(policy: str | Policy, config: RoundConfig | None = None) -> Decision:
    """A policy decides an operator's round: admission refuses what can never run (a job
    larger than the cluster, a model the catalog lacks) with typed reasons, the decision
    is valid, every job is accounted for, something is placed on an empty cluster, and the
    decision names the policy."""
    cfg = config or RoundConfig(time_budget_s=3.0, isolate=False)
    pol = make_policy(policy, config=cfg) if isinstance(policy, str) else policy
    expect(isinstance(pol, Policy) and pol.name, f"{policy!r}: not a policy (decide, name)")
    jobs = queue(9) + [JobSpec("huge", "bert-336m", 64, 10, 999),
                       JobSpec("ghost", "no-such-model", 64, 10, 1)]
    d = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol).decision
    real = [j for j in jobs if j.id not in ("huge", "ghost")]
    verdict = validate(d, CLUSTER, real)
    expect(verdict.ok, f"{pol.name}: invalid decision: {verdict.violations[:5]}")
    seen = {a.job for a in d.allocations} | {p.job for p in d.pending}
    expect(seen == {j.id for j in jobs}, f"{pol.name}: jobs unaccounted for: "
           f"{sorted({j.id for j in jobs} ^ seen)}")
    refused = {p.job: p for p in d.pending if p.stage == "admit"}
    for job, reason in (("huge", Reason.TOO_LARGE), ("ghost", Reason.CATALOG)):
        got = refused.get(job)
        expect(got is not None and got.reason == reason and not got.can_ever_fit,
               f"{pol.name}: {job} is not refused at admission as {reason.value} that can "
               f"never fit: {got}")
    expect(d.allocations, f"{pol.name} placed nothing on an empty cluster")
    expect(d.meta.get("policy") == pol.name, f"{pol.name}: the decision names the policy "
           f"{d.meta.get('policy')!r}")
    expect("admit" in d.meta.get("stages", {}), f"{pol.name}: the decision did not go "
           "through the pipeline's admission")
    return d


@check
def check_formulation(name: str, backends: tuple[str, ...] = ("auto", "greedy"),
                      budget_s: float = 10.0) -> list[Decision]:
    """A registered formulation solves a round with each backend (the solver chain, and its
    heuristic alone): every decision is valid and its cells satisfy the model's rows (an
    added constraint holds whichever answered), and a fallback says why."""
    expect(name in RECIPES, f"{name!r} is not a registered formulation: {sorted(RECIPES)}")
    out = []
    for backend in backends:
        jobs = queue(9, running=2)
        cfg = RoundConfig(formulation=name, backend=backend, time_budget_s=budget_s,
                          isolate=False)
        pol = FormulationPolicy(cfg)
        res = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol)
        d = res.decision
        verdict = validate(d, CLUSTER, jobs)
        expect(verdict.ok, f"{name}/{backend}: invalid decision: {verdict.violations[:5]}")
        g = res.graph
        model = pol.recipe.model(g, cfg)
        chosen = {a.job for a in d.allocations}
        choices = [c for c in _cell_choices(g, d) if c.job in chosen]
        broken = model.violations(choice_vector(model, choices))
        expect(not broken, f"{name}/{backend}: the decision breaks the model: {broken}")
        expect(not d.report.fallback or d.report.fallback_reason,
               f"{name}/{backend}: a fallback without a reason")
        out.append(d)
    return out


def _cell_choices(g: Any, d: Decision) -> list[Any]:
    """The decision's allocations as the candidate graph's cells (what the model sees)."""
    out = []
    for a in d.allocations:
        for cn in cells_of(g, a.job):
            c = g.nodes[cn]
            if c["gpu_type"] == a.gpu_type and int(c["gpus"]) == a.gpus and \
                    int(c.get("stages", 1)) == a.stages:
                out.append(CellChoice(a.job, cn, dict(a.placement)))
                break
    return out


__all__ = ["check_formulation", "check_policy"]
