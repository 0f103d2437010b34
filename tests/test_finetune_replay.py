"""Fine-tuning in the one simulator: YMIR's traces, truth, run modes and policies."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.finetune_truth import (
    FinetuneTruth,
    finetune_root,
    generated_trace,
    reference_avg_jct,
)
from apportion.experiments.harness import cluster_from_arg, resolve
from apportion.experiments.simulator import PROFILES, SimConfig, SimulationError, Simulator
from apportion.experiments.traces import FinetuneInfo, SimJob, Trace

from apportion.decision import Reason
from apportion.errors import InputError
from apportion.policies import make_policy
from apportion.policies.base import Choice, Packer, build_decision

pytestmark = pytest.mark.skipif(not finetune_root().is_dir(),
                                reason="titan-finetune data not present")

V100 = "V100-32GB"
INFO = {  # (task, lr, steps, target) as the FM-1-roberta-base trace has them
    "mrpc": ("1e-3", "8", 0.9071803852889667), "stsb": ("1e-4", "1", 0.897162551068598),
    "qnli": ("4e-5", "8", 0.9031667581914699), "rte": ("1e-4", "1", 0.7111913357400722),
    "sst2": ("1e-3", "8", 0.9518348623853211)}


def job(jid: str, task: str, batch: int = 16, submit: float = 0.0, gpus: int = 1) -> SimJob:
    lr, steps, target = INFO[task]
    return SimJob(jid, submit, gpus, 0.0, f"roberta-base@{task}", batch=batch, gpu_type=V100,
                  finetune=FinetuneInfo("roberta-base", task, lr, steps, target))


@pytest.fixture(scope="module")
def truth() -> FinetuneTruth:
    return FinetuneTruth()


def test_trace_loads_with_iterations_from_the_truth(truth):
    t = catalog.load_trace("fm-1-roberta-base")
    assert len(t) == 120 and t.name == "FM-1-roberta-base"
    j = t.jobs[0]
    assert j.finetune is not None and j.finetune.task == "mrpc" and j.iterations == 0.0
    full = truth.with_iterations(t)
    assert len(full) == 120
    first = full.jobs[0]
    assert first.iterations == pytest.approx(9170 / 128)  # samples to target / batch
    cl = cluster_from_arg("32:0:0")
    t2, truth2 = resolve("fm-1-roberta-base", cl)
    assert isinstance(truth2, FinetuneTruth) and t2.jobs[0].iterations == first.iterations


def test_unsized_tasks_are_dropped_with_a_note(truth, tmp_path):
    f = tmp_path / "workload-0.csv"
    f.write_text("name,submission_time,application,num_gpus,target_batch_size,target_lr,"
                 "target_gradient_steps,target_metric\n"
                 "a,0,roberta-base@mrpc,1,128,1e-3,8,0.9\nb,5,vit@mnist,1,64,1e-3,8,0.9\n")
    t = truth.with_iterations(tr.load_any(f))
    assert [j.job_id for j in t.jobs] == ["a"] and "vit@mnist" in t.notes[-1]
    f.write_text("name,submission_time,application,num_gpus,target_batch_size,target_lr,"
                 "target_gradient_steps,target_metric\na,0,mrpc,1,128,1e-3,8,0.9\n")
    with pytest.raises(InputError, match="backbone@task"):
        tr.load_any(f)


def test_truth_modes(truth):
    a, b = job("A", "mrpc", 128), job("B", "stsb")
    a, b = truth.with_iterations(Trace("t", [a, b])).jobs
    alone = truth.rate(b, V100, 1)
    assert alone == pytest.approx(1.0 / truth.data("roberta-base").table.iteration_time(1, 16))
    g = truth.data("roberta-base").temporal_gain(a.finetune, b.finetune)
    assert 0 < g < 1
    assert truth.rate(b, V100, 1, source=a) == pytest.approx(alone / (1 - g))
    bad = job("S", "sst2", 128)
    assert truth.rate(bad, V100, 1, source=a) == pytest.approx(truth.rate(bad, V100, 1) / 2)
    assert truth.rate(b, "A100-40GB", 1) == 0.0 and truth.rate(b, V100, 17) == 0.0
    c, d = truth.with_iterations(Trace("t", [job("C", "qnli"), job("D", "rte")])).jobs
    # merged: each task its own epochs to its target on the merged curve (both done by
    # the 5th), of its own per-epoch samples (Titan's MtaskFoundationModelJob)
    data = truth.data("roberta-base")
    ec, ed = data.spatial_epochs(c.finetune, d.finetune)
    assert max(ec, ed) == 5
    sc, sd = data.samples_to_target["qnli"], data.samples_to_target["rte"]
    t2 = data.table.iteration_time(2, 32)
    want = (sc / 16) / ((ec * sc / 9 + ed * sd / 8) / 32 * t2)
    assert truth.rate(c, V100, 2, members=(d,)) == pytest.approx(want)
    assert truth.rate(c, V100, 2, members=(d, a)) == 0.0  # only pairs are measured
    assert truth.rate(c, V100, 2, members=(job("C2", "qnli"),)) == 0.0  # same task: unmeasured


class Scripted:
    """A: alone; C||D merged; B from A's weights once A has finished."""

    name = "scripted"

    def __init__(self, bad: str | None = None) -> None:
        self.bad = bad

    def decide(self, view):
        pk = Packer(view.cluster)
        by = {js.id: js for js in view.jobs}
        chosen, meta = {}, {"transfer": {}, "merged": {}}
        reasons = {"D": (Reason.MERGED, "trains inside C")}
        for jid, gpus in (("A", 1), ("C", 2)):
            if jid in by:
                chosen[jid] = Choice(V100, gpus, pk.place(V100, gpus), 1.0)
        if "C" in by:
            meta["merged"]["C"] = ["D"]
        if "B" in by and ("A" not in by or self.bad == "early"):
            chosen["B"] = Choice(V100, 1, pk.place(V100, 1), 1.0)
            meta["transfer"]["B"] = "A"
        if self.bad in ("member", "both") and "D" in by and (
                self.bad == "both" or view.round_index >= 1):
            chosen["D"] = Choice(V100, 1, pk.place(V100, 1), 1.0)
        d = build_decision(view, chosen, self.name, None, reasons)
        d.meta.update(meta)
        return d


def _tiny(truth):
    t = Trace("tiny", [job("A", "mrpc", 128), job("B", "stsb"), job("C", "qnli"),
                       job("D", "rte")], "titan-finetune#test")
    return truth.with_iterations(t)


def test_simulator_applies_transfer_and_merging(truth):
    t = _tiny(truth)
    cl = cluster_from_arg("4:0:0")
    cfg = SimConfig(interval_s=60.0, restart_cost_s=0.0, information="oracle")
    res = Simulator(cl, t, Scripted(), truth, cfg).run()
    jobs = res.jobs.set_index("job_id")
    assert res.summary["finished"] == 4
    a, b, c, d = t.jobs
    # B starts at the first round after A finished, from A's weights
    b_start = math.ceil(jobs.loc["A", "finish_s"] / 60.0) * 60.0
    assert jobs.loc["B", "first_start_s"] == pytest.approx(b_start)
    assert jobs.loc["B", "finish_s"] == pytest.approx(
        b_start + b.iterations / truth.rate(b, V100, 1, source=a))
    # C and D trained as one job: they finish together, at the merged rate
    assert jobs.loc["C", "finish_s"] == jobs.loc["D", "finish_s"] == pytest.approx(
        c.iterations / truth.rate(c, V100, 2, members=(d,)))
    assert jobs.loc["D", "first_start_s"] == 0.0 and jobs.loc["D", "gpu_seconds"] == 0.0


@pytest.mark.parametrize(("bad", "msg"), [("early", "not finished"),
                                          ("member", "allocated on its own"),  # the validator or the simulator
                                          ("both", "cannot merge D|merged into C but allocated")])
def test_simulator_refuses_impossible_modes(truth, bad, msg):
    cl = cluster_from_arg("4:0:0")
    with pytest.raises(SimulationError, match=msg):
        Simulator(cl, _tiny(truth), Scripted(bad), truth, SimConfig(interval_s=60.0)).run()


@pytest.fixture(scope="module")
def fm1_head(truth):
    cl = cluster_from_arg("32:0:0")
    t, _ = resolve("fm-1-roberta-base", cl)
    return cl, t.head(40)


@pytest.mark.parametrize("information", ["oracle", "estimated"])
def test_ymir_beats_srtf_and_tiresias_in_the_one_simulator(truth, fm1_head, information):
    cl, t = fm1_head
    cfg = replace(PROFILES["ymir"], information=information, seed=1)
    avg = {}
    for name in ("srtf", "tiresias", "ymir"):
        res = Simulator(cl, t, make_policy(name), truth, cfg).run()
        assert res.summary["finished"] == len(t), name
        avg[name] = res.summary["avg_jct_s"]
    assert avg["ymir"] < avg["srtf"] and avg["ymir"] < avg["tiresias"], avg


def test_ymir_transfers_from_finished_siblings(truth, fm1_head):
    cl, t = fm1_head
    pol = make_policy("ymir-temporal")
    sim = Simulator(cl, t, pol, truth, replace(PROFILES["ymir"], information="oracle"))
    seen: list[dict[str, str]] = []
    real = sim._apply

    def spy(decision, *a, **kw):
        seen.append(dict(decision.meta.get("transfer", {})))
        return real(decision, *a, **kw)

    sim._apply = spy  # type: ignore[method-assign]
    res = sim.run()
    started = {j: s for m in seen for j, s in m.items()}
    assert started, "no job started from a sibling's weights"
    ends = res.jobs.set_index("job_id")
    for j, src in started.items():  # every source had finished, with a positive gain
        assert ends.loc[src, "finish_s"] <= ends.loc[j, "first_start_s"]
        a = next(x for x in t.jobs if x.job_id == src)
        b = next(x for x in t.jobs if x.job_id == j)
        assert truth.rate(b, V100, 1, source=a) > truth.rate(b, V100, 1)


def test_generated_workload_follows_the_recipe(truth):
    t = generated_trace(300, "roberta-base", seed=5)
    counts = Counter(j.job_id.rsplit("-", 1)[1] for j in t.jobs)
    for cls_, p in (("small", 0.3), ("medium", 0.6), ("large", 0.1)):
        assert abs(counts[cls_] / 300 - p) < 0.08, counts
    assert all(a.submit_s <= b.submit_s for a, b in zip(t.jobs, t.jobs[1:]))
    assert catalog.load_trace("fm-generated:300", seed=5).jobs == t.jobs
    assert len(truth.with_iterations(t)) == 300


def test_reference_tables_read():
    ref = reference_avg_jct("FM-1-roberta-base")
    assert ref["srtf"] == pytest.approx(1278.424, abs=0.01)
    assert ref["titan[True-True]"] < ref["titan[False-True]"] < ref["srtf"]
