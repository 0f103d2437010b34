"""The conformance checks apportion runs on everything it registers, for a plug-in's author
to run too (scikit-learn's ``check_estimator`` is the model).

``check_policy(name_or_policy)`` runs a policy on an operator's queue through the round
pipeline; ``check_formulation(name)`` solves a registered formulation with the solver
chain and with its heuristic alone and checks every answer against the model's own rows;
``check_executor(executor)`` checks the protocol; ``check_estimator(estimator)`` the
estimator protocol; ``check_trace_format(name)`` a trace format's detection, loading and
replay on its example. Each raises :class:`AssertionError` naming what failed, and returns
what it ran on, so a test may look further::

    from apportion.testing import check_policy
    check_policy("my-policy")          # a name registered through the entry point
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import replace
from typing import Any

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Action, Allocation, Decision, Reason, SolveReport
from apportion.estimation.base import Estimate, Estimator, Sample
from apportion.estimation.models.analytic import nominal_placement
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import cells_of
from apportion.jobs import JobSpec, RunningState, Workload
from apportion.plans import Cell, ExecutionPlan
from apportion.policies import RECIPES, RoundConfig, make_policy, policy_names, run_round
from apportion.policies.formulation import FormulationPolicy, choice_vector
from apportion.runtime.executors.executor import Executor, Health
from apportion.validator import validate
from apportion.view import Policy

CLUSTER = Cluster("conformance", [NodeGroup("a40", 2, "A40", 4, 32, 256.0),
                                  NodeGroup("a100", 1, "A100-40GB", 8, 64, 512.0)])
MODELS = ("bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b")


def queue(n: int = 7, running: int = 0) -> list[JobSpec]:
    """``n`` catalog jobs of 1, 2 and 4 GPUs; the first ``running`` (at most 2) running on
    the A40 nodes."""
    jobs = [JobSpec(f"j{i}", MODELS[i % len(MODELS)], 64, 1000 + 100 * i, [1, 2, 4][i % 3],
                    submit_time_s=float(i)) for i in range(n)]
    for i in range(min(running, 2)):
        g = jobs[i].requested_gpus
        jobs[i] = replace(jobs[i], running=RunningState("A40", g, 1, {f"a40-{i}": g}))
    return jobs


def check_policy(policy: str | Policy, config: RoundConfig | None = None) -> Decision:
    """A policy decides an operator's round: admission refuses what can never run (a job
    larger than the cluster, a model the catalog lacks) with typed reasons, the decision
    is valid, every job is accounted for, something is placed on an empty cluster, and the
    decision names the policy."""
    cfg = config or RoundConfig(time_budget_s=3.0, isolate=False)
    pol = make_policy(policy, config=cfg) if isinstance(policy, str) else policy
    assert isinstance(pol, Policy) and pol.name, f"{policy!r}: not a policy (decide, name)"
    jobs = queue(9) + [JobSpec("huge", "bert-336m", 64, 10, 999),
                       JobSpec("ghost", "no-such-model", 64, 10, 1)]
    d = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol).decision
    real = [j for j in jobs if j.id not in ("huge", "ghost")]
    check = validate(d, CLUSTER, real)
    assert check.ok, f"{pol.name}: invalid decision: {check.violations[:5]}"
    seen = {a.job for a in d.allocations} | {p.job for p in d.pending}
    assert seen == {j.id for j in jobs}, f"{pol.name}: jobs unaccounted for: " \
        f"{sorted({j.id for j in jobs} ^ seen)}"
    refused = {p.job: p for p in d.pending if p.stage == "admit"}
    assert refused["huge"].reason == Reason.TOO_LARGE and not refused["huge"].can_ever_fit
    assert refused["ghost"].reason == Reason.CATALOG and not refused["ghost"].can_ever_fit
    assert d.allocations, f"{pol.name} placed nothing on an empty cluster"
    assert d.meta["policy"] == pol.name and "admit" in d.meta["stages"]
    return d


def check_formulation(name: str, backends: tuple[str, ...] = ("auto", "greedy"),
                      budget_s: float = 10.0) -> list[Decision]:
    """A registered formulation solves a round with each backend (the solver chain, and its
    heuristic alone): every decision is valid and its cells satisfy the model's rows (an
    added constraint holds whichever answered), and a fallback says why."""
    assert name in RECIPES, f"{name!r} is not a registered formulation: {sorted(RECIPES)}"
    out = []
    for backend in backends:
        jobs = queue(9, running=2)
        cfg = RoundConfig(formulation=name, backend=backend, time_budget_s=budget_s,
                          isolate=False)
        pol = FormulationPolicy(cfg)
        res = run_round(CLUSTER, jobs, 50.0, cfg, policy=pol)
        d = res.decision
        check = validate(d, CLUSTER, jobs)
        assert check.ok, f"{name}/{backend}: invalid decision: {check.violations[:5]}"
        g = res.graph
        model = pol.recipe.model(g, cfg)
        chosen = {a.job for a in d.allocations}
        choices = [c for c in _cell_choices(g, d) if c.job in chosen]
        broken = model.violations(choice_vector(model, choices))
        assert not broken, f"{name}/{backend}: the decision breaks the model: {broken}"
        if d.report.fallback:
            assert d.report.fallback_reason, f"{name}/{backend}: a fallback without a reason"
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


def check_executor(executor: Any) -> None:
    """An executor exposes apply/poll/shutdown with the protocol's signatures and a name."""
    assert isinstance(executor, Executor) and executor.name, \
        f"{executor!r}: not an executor (name, apply, poll, shutdown)"
    for meth in ("apply", "poll", "shutdown"):
        want = list(inspect.signature(getattr(Executor, meth)).parameters)[1:]
        got = list(inspect.signature(getattr(executor, meth)).parameters)
        assert got[:len(want)] == want, f"{executor.name}.{meth}{got}: expected {want}"


def _wait(executor: Any, job: str, cond: Any, what: str, timeout_s: float) -> Any:
    """Poll until ``cond(progress)`` holds for ``job``; a safety deadline, not a speed test."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        for p in executor.poll():
            if p.job == job:
                seen = p
                if cond(p):
                    return p
        time.sleep(0.5)
    raise AssertionError(f"{getattr(executor, 'name', executor)}: {job} never {what}; "
                         f"last seen {seen}")


def check_executor_behaviour(executor: Any, cluster: Cluster, node: str | None = None,
                             gpu_type: str | None = None, timeout_s: float = 600.0,
                             other_node: str | None = None) -> None:
    """An executor does what the protocol promises, by behaviour: a started job runs and
    reports progress; resized to two GPUs it resumes from its checkpoint on two workers;
    preempted it stops with a checkpoint; a job whose command cannot start fails with its
    reason while the other keeps running; shutdown checkpoints what runs. ``node`` (and its
    ``gpu_type``) is where the jobs go: a node with three GPUs or more (every decision the
    check applies is valid for it); or, with ``other_node``, a node of two GPUs for the
    running job and another for the failing one (a cluster of small nodes, as a test
    cluster of Slurm's is)."""
    name = node or next(n for n, v in cluster.nodes.items() if v.gpus >= 3)
    t = gpu_type or cluster.nodes[name].gpu_type
    b_node = other_node or name
    b_type = cluster.nodes[b_node].gpu_type if other_node else t
    report = SolveReport("check", "optimal", 0.0, 0.0, 0.0, 0.0, False)
    a = JobSpec("conf-a", "gpt-tiny", 8, 100_000, 1)
    b = JobSpec("conf-b", "gpt-tiny", 8, 10, 1,
                workload=Workload("torchrun", ("/nonexistent/apportion-check-binary",)))

    def alloc(job: JobSpec, gpus: int, action: Action) -> Allocation:
        where, kind = (b_node, b_type) if job is b else (name, t)
        return Allocation(job.id, kind, gpus, 1, ExecutionPlan(dp=gpus), {where: gpus}, 1.0,
                          action)

    d = Decision([alloc(a, 1, Action.START)], [], report)
    events = executor.apply(d, [a])
    assert any(e.job == a.id and e.action == "start" for e in events), events
    p = _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.iterations_done >= 2,
              "ran", timeout_s)
    running = replace(a, iterations_done=p.iterations_done,
                      running=RunningState(t, 1, 1, {name: 1}))
    d = Decision([alloc(a, 2, Action.RESIZE), alloc(b, 1, Action.START)], [], report)
    executor.apply(d, [running, b])
    _wait(executor, a.id, lambda p: p.health == Health.RUNNING and p.workers == 2
          and p.iterations_done > running.iterations_done, "resumed on two workers", timeout_s)
    fb = _wait(executor, b.id, lambda p: p.health == Health.FAILED, "failed", timeout_s)
    assert fb.error and ("nonexistent" in fb.error or "not found" in fb.error.lower()
                         or "No such file" in fb.error), fb.error
    pa = next(p for p in executor.poll() if p.job == a.id)
    assert pa.health == Health.RUNNING, f"the failure of {b.id} stopped {a.id}: {pa}"
    running = replace(a, iterations_done=pa.iterations_done,
                      running=RunningState(t, 2, 1, {name: 2}))
    executor.apply(Decision([], [], report), [running])  # preempted: no allocation for it
    stopped = _wait(executor, a.id, lambda p: p.health == Health.CHECKPOINTED, "stopped",
                    timeout_s)
    assert stopped.iterations_done >= running.iterations_done
    executor.shutdown(checkpoint=True)


def check_estimator(estimator: Estimator) -> None:
    """scikit-learn's contract (parameters only in ``__init__``, ``fit`` returns self and
    learns only attributes ending in ``_``), and estimates that are finite, positive and
    grow with the batch."""
    cl = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 8)])
    assert isinstance(estimator, Estimator), f"{estimator!r}: not an estimator"
    sig = set(inspect.signature(type(estimator).__init__).parameters) - {"self"}
    assert set(estimator.get_params()) == sig, "parameters must be __init__'s arguments"
    before, params = set(vars(estimator)), estimator.get_params()
    assert not any(k.endswith("_") for k in before), "fitted attributes before fit"
    samples = []
    for i, g in enumerate((1, 2, 4, 8, 8, 4, 2, 1)):
        job = JobSpec(f"s{i}", "bert-336m", 64, 10, g)
        samples.append(Sample(job, ExecutionPlan(dp=g, checkpointing=i >= 4),
                              nominal_placement(cl, "A100-40GB", g), "A100-40GB",
                              0.05 + 1.6 / g))
    assert estimator.fit(samples) is estimator, "fit must return self"
    learned = set(vars(estimator)) - before
    assert all(k.endswith("_") for k in learned), f"fit set {sorted(learned)}"
    assert estimator.get_params() == params, "fit changed a parameter"
    job = JobSpec("j", "bert-336m", 64, 10, 4)
    e = estimator.predict(job, ExecutionPlan(dp=4), nominal_placement(cl, "A100-40GB", 4), cl)
    assert isinstance(e, Estimate) and e.iter_time_s > 0 and math.isfinite(e.iter_time_s)
    cell = Cell("a", "A100-40GB", 4, 1)
    small = estimator.best_in_cell(JobSpec("a", "bert-336m", 32, 10, 4), cell, cl)
    large = estimator.best_in_cell(JobSpec("b", "bert-336m", 256, 10, 4), cell, cl)
    assert small is not None and large is not None and large.iter_time_s > small.iter_time_s


# -- trace formats ------------------------------------------------------------------------
def _expect(ok: Any, what: str) -> None:
    """An :class:`AssertionError` naming what failed (kept under ``python -O``)."""
    if not ok:
        raise AssertionError(what)


def check_trace_format(fmt: Any, sample: str | None = None, cluster: str | None = None,
                       tables: str | None = None, replay: bool = True,
                       folder: str | None = None) -> Any:
    """A trace format keeps the registry's promises, on ``sample`` (a ``--trace``
    argument: a file of the format, or a generated family's name) or, without one, on the
    trace its ``example`` writes:

    * it is registered (``fmt``: its name, or the :class:`TraceFormat`), declares how it
      is detected and loaded, and names registered truths;
    * the registry detects the sample as this format and no other, from its content (a
      copy under a neutral name too), and a header missing any of its columns is not
      detected as it;
    * loading gives a trace of this format with jobs (unique ids, whole positive GPU
      counts, finite times and work), the same twice, whose substitutions concern its jobs;
    * with ``replay``, a short replay on ``cluster`` (default: the format's
      ``example_cluster``; ``tables``: measured iteration times as its truth) finishes
      jobs, and its summary names the format and carries the trace's substitutions.

    Raises :class:`AssertionError` naming what failed; returns the trace loaded."""
    import tempfile
    from pathlib import Path

    from apportion.experiments import trace_catalog, truths
    from apportion.experiments.harness import prepare_one
    from apportion.experiments.traces import COVERAGE, TraceFormat, detect, formats, load_any

    every = formats()
    name = fmt.name if isinstance(fmt, TraceFormat) else str(fmt)
    _expect(name in every, f"{name!r} is not a registered trace format (register() it, or "
            f"declare it in the apportion.trace_formats entry points): {sorted(every)}")
    f = every[name]
    _expect(not isinstance(fmt, TraceFormat) or fmt is f,
            f"{name}: another format is registered under its name")
    _expect(name and name == name.strip() and " " not in name, f"{name!r}: not a usable name")
    _expect(f.doc.strip(), f"{name}: no doc (apportion traces shows it)")
    _expect(callable(f.load), f"{name}: load is not callable")
    _expect(f.coverage in COVERAGE, f"{name}: coverage {f.coverage!r} not one of {COVERAGE}")
    _expect(f.generated or f.columns or f.any_of or f.detect is not None,
            f"{name}: declares no detection (columns, any_of or detect)")
    names = truths.truth_names()
    _expect(callable(f.truth) or f.truth in names,
            f"{name}: truth {f.truth!r} is not a registered ground truth ({', '.join(names)})")
    for t in f.truths or ():
        _expect(t in names, f"{name}: truths names {t!r}, not a registered ground truth")
    _expect(f.truths is None or callable(f.truth) or f.truth in f.truths,
            f"{name}: its own truth {f.truth!r} is not among the truths it allows")
    work = Path(folder or tempfile.mkdtemp(prefix="apportion-trace-check-"))
    _expect(sample is not None or f.example is not None,
            f"{name}: no example to check (give sample=, or declare example)")
    arg = str(sample) if sample is not None else str(f.example(work))  # type: ignore[misc]
    if f.generated:
        trace = trace_catalog.load_trace(arg)
        _expect(trace.format == name, f"{name}: {arg} generated a {trace.format!r} trace")
    else:
        trace = _check_trace_file(f, Path(arg), work, detect, load_any)
    _check_trace_jobs(name, trace)
    if replay:
        where = cluster or f.example_cluster
        try:
            run = prepare_one(arg, where, "fcfs", max_jobs=8, tables=tables,
                              sim_options={"deterministic": True})
        except Exception as exc:  # the check names what failed
            raise AssertionError(f"{name}: {arg} does not replay on {where}: {exc}") from exc
        res = run()
        s = res.summary
        _expect(s.get("trace_format") == name, f"{name}: the summary's trace_format is "
                f"{s.get('trace_format')!r}")
        _expect(s.get("finished", 0) >= 1, f"{name}: no job of {arg} finished on {where} "
                f"({s.get('jobs')} jobs, truth {s.get('truth')})")
        _expect(s.get("substitutions") == run.trace.substitution_report(),
                f"{name}: the summary's substitutions are not the trace's")
    return trace


def _check_trace_file(f: Any, path: Any, work: Any, detect: Any, load_any: Any) -> Any:
    """Detection and loading of a file of format ``f`` (see :func:`check_trace_format`)."""
    import csv
    import io
    import shutil

    from apportion.errors import InputError

    name = f.name
    _expect(path.is_file(), f"{name}: the sample {path} is not a file")
    got = detect(path).name
    _expect(got == name, f"{name}: {path} is detected as {got!r}")
    neutral = work / "renamed-sample.data"  # no telling suffix, another folder
    if neutral.resolve() != path.resolve():
        shutil.copyfile(path, neutral)
        got = detect(neutral).name
        _expect(got == name, f"{name}: a copy named {neutral.name} is detected as {got!r} "
                "(detection must read the content, not the name)")
    text = path.read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    header = next(csv.reader([first]), [])
    for col in f.columns:
        if col not in header:
            continue
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow([c if c != col else f"{col}_x"
                                                     for c in header])
        variant = work / f"without-{col}.csv"
        variant.write_text(out.getvalue() + "\n" + rest, encoding="utf-8")
        try:
            other = detect(variant).name
        except InputError:
            continue  # refused by name: never read as this format
        _expect(other != name, f"{name}: a file without column {col} is still detected as it")
    trace = load_any(path)
    _expect(trace.format == name, f"{name}: load_any gave a {trace.format!r} trace")
    again = load_any(path)
    _expect(again.jobs == trace.jobs, f"{name}: two loads of {path} differ")
    return trace


def _check_trace_jobs(name: str, trace: Any) -> None:
    """The jobs of a loaded trace are replayable as they are (see :func:`check_trace_format`)."""
    jobs = trace.jobs
    _expect(jobs, f"{name}: the sample has no jobs")
    ids = [j.job_id for j in jobs]
    _expect(len(set(ids)) == len(ids), f"{name}: job ids are not unique")
    for j in jobs:
        _expect(isinstance(j.gpus, int) and j.gpus >= 1, f"{name}: job {j.job_id} asks for "
                f"{j.gpus!r} GPUs")
        _expect(math.isfinite(j.submit_s) and math.isfinite(j.iterations) and j.iterations >= 0,
                f"{name}: job {j.job_id} has submit {j.submit_s!r}, iterations {j.iterations!r}")
        _expect(isinstance(j.batch, int) and j.batch >= 1, f"{name}: job {j.job_id} has batch "
                f"{j.batch!r}")
    for sub in trace.substitutions:
        _expect(sub.field and sub.why, f"{name}: a substitution without its field or reason")
        _expect(set(sub.jobs) <= set(ids), f"{name}: a substitution names jobs not in the trace")


def registered() -> dict[str, list[str]]:
    """Everything registered now, plug-ins included: what a conformance suite discovers."""
    from apportion.estimation.registry import ESTIMATORS
    from apportion.experiments.traces import formats

    return {"policies": policy_names(), "formulations": list(RECIPES),
            "estimators": list(ESTIMATORS), "trace_formats": sorted(formats())}


__all__ = ["CLUSTER", "check_estimator", "check_executor", "check_executor_behaviour",
           "check_formulation",
           "check_policy", "check_trace_format", "queue", "registered"]
