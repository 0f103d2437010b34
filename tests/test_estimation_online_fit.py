"""Online refit API: fitted estimators report a held-out error, ``auto`` picks per job by it,
and a fit never moves a GPU type nobody measured against the measured ones."""

from __future__ import annotations

import pytest
from apportion.estimation.models.measured import TableEstimator
from apportion.estimation.models.morphling import (
    K_INIT,
    K_NAMES,
    Arch,
    Env,
    FlopsForward,
    MorphlingEstimator,
    MorphlingSample,
    components,
)
from apportion.estimation.registry import AutoEstimator

from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import ExecutionPlan

MODEL = "bert-336m"
ARCH = Arch.from_spec(get_model(MODEL))
TRUE = {**{n: K_INIT[n] for n in K_NAMES}, "k_sync": 1.0, "k_opt": 0.08}


def _fwd(n: float) -> float:
    return 0.02 + 0.007 * n


def _samples(gpu: str = "A100-40GB") -> list[MorphlingSample]:
    job = JobSpec("j", MODEL, 64, 1, 1)
    out = []
    for g in (1, 2, 4, 8):
        for plan in (ExecutionPlan(dp=g), ExecutionPlan(dp=g, checkpointing=True),
                     ExecutionPlan(dp=g, zero_stage=2)):
            t = components(TRUE, ARCH, 64, plan, (g,), 1, Env(), _fwd)["T_iter"]
            out.append(MorphlingSample(job=job, plan=plan, placement={}, gpu_type=gpu,
                                       iter_time_s=t, arch=ARCH, nodes=(g,),
                                       fwd_s=_fwd(64 / g)))
    return out


def test_morphling_reports_a_held_out_error_per_architecture() -> None:
    est = MorphlingEstimator(min_samples=7).fit(_samples())
    assert 0 <= est.heldout_error_[ARCH.name] < 0.05  # a model the data came from
    none = MorphlingEstimator(min_samples=7, heldout_folds=0).fit(_samples())
    assert ARCH.name not in none.heldout_error_


def test_a_fit_never_moves_an_unmeasured_type_against_the_measured_one() -> None:
    """Measured on A100s only, 3x slower than FLOPs at the default efficiency: V100 cells
    keep their catalog ratio to A100 cells instead of looking 3x faster."""
    plan, nodes = ExecutionPlan(dp=4), (4,)
    fresh = MorphlingEstimator()
    before = [fresh.predict_config(ARCH, 64, plan, nodes, 1, g)["T_fwd"]
              for g in ("A100-40GB", "V100-32GB")]
    flops = FlopsForward(ARCH, "A100-40GB", fresh.efficiency)
    slow = [MorphlingSample(job=s.job, plan=s.plan, placement={}, gpu_type=s.gpu_type,
                            iter_time_s=3 * s.iter_time_s, arch=ARCH, nodes=s.nodes,
                            fwd_s=3 * flops(64 / s.plan.dp))
            for s in _samples()]
    est = MorphlingEstimator(min_samples=7, heldout_folds=0).fit(slow)
    after = [est.predict_config(ARCH, 64, plan, nodes, 1, g)["T_fwd"]
             for g in ("A100-40GB", "V100-32GB")]
    assert after[0] == pytest.approx(3 * before[0], rel=0.05)
    assert after[1] / after[0] == pytest.approx(before[1] / before[0], rel=0.05)


def test_auto_picks_the_estimator_with_the_lowest_held_out_error() -> None:
    job = JobSpec("j", MODEL, 64, 10, 4)
    auto = AutoEstimator(tables=TableEstimator())
    m = auto._members()
    m["morphling"].k_ = {ARCH.name: dict(TRUE)}
    m["morphling"].heldout_error_ = {ARCH.name: 0.12}
    m["crius"].heldout_error_ = {MODEL: 0.08}
    assert auto.choose(job) == "crius"
    auto = AutoEstimator(tables=TableEstimator())
    m = auto._members()
    m["morphling"].k_ = {ARCH.name: dict(TRUE)}
    m["morphling"].heldout_error_ = {ARCH.name: 0.05}
    m["crius"].heldout_error_ = {MODEL: 0.08}
    assert auto.choose(job) == "morphling"
    # a measured table of the very model still comes first
    tables = TableEstimator([(MODEL, 64, "A100-40GB", 4, 0.3)])
    assert AutoEstimator(tables=tables).choose(job) == "tables"


def _mixed_run() -> tuple:
    """Measurements a run's store would hold: BERT on A100s under twelve plans (enough to
    fit), GPT-2 twice (too few), a workload the catalog cannot build, a failed (0 s) one.
    Times are the model's own at TRUE on the cluster's bandwidths, so a fit can recover
    them; the cluster also has V100 nodes nobody measured."""
    from apportion.cluster import Cluster, NodeGroup
    from apportion.decision import Allocation

    cl = Cluster("mix", [NodeGroup("a", 2, "A100-40GB", 8), NodeGroup("v", 2, "V100-32GB", 8)])
    env = MorphlingEstimator()._env_for({"a-0": 1}, cl)
    rows = []
    for g in (1, 2, 4, 8):
        for plan in (ExecutionPlan(dp=g), ExecutionPlan(dp=g, checkpointing=True),
                     ExecutionPlan(dp=g, zero_stage=2)):
            rows.append((JobSpec(f"b-{plan.label()}", MODEL, 64, 100, g), plan, {"a-0": g}))
    gpt = [(JobSpec(f"g{g}", "gpt2-1.5b", 16, 100, g), ExecutionPlan(dp=g), {"a-1": g})
           for g in (1, 2)]
    out = []
    for job, plan, placement in rows + gpt:
        arch = Arch.from_spec(get_model(job.model))
        fwd = FlopsForward(arch, "A100-40GB", 0.3)
        t = components(TRUE, arch, job.global_batch_size, plan, (plan.gpus,), 1, env,
                       fwd)["T_iter"]
        out.append((job, Allocation(job.id, "A100-40GB", plan.gpus, 1, plan, placement, 1.0),
                    t))
    odd = JobSpec("u", "custom-workload-nobody-built", 8, 100, 1)
    out.append((odd, Allocation("u", "A100-40GB", 1, 1, ExecutionPlan(), {"a-1": 1}, 1.0), 2.0))
    fail = JobSpec("f", MODEL, 64, 100, 1)
    out.append((fail, Allocation("f", "A100-40GB", 1, 1, ExecutionPlan(), {"a-1": 1}, 1.0),
                0.0))
    return cl, out


@pytest.mark.parametrize("auto", [False, True])
def test_online_refit_on_a_mix_of_architectures_fits_what_it_can(auto: bool) -> None:
    from apportion.runtime.refit import OnlineRefit

    cl, run = _mixed_run()
    est = AutoEstimator(tables=TableEstimator()) if auto else \
        MorphlingEstimator(min_samples=7)
    morph = est._members()["morphling"] if auto else est
    morph.cache_dir = None  # never the user's cache
    gpt = Arch.from_spec(get_model("gpt2-1.5b")).name
    probe = (JobSpec("p", "gpt2-1.5b", 16, 1, 4), ExecutionPlan(dp=4), {"a-1": 4})
    prior = MorphlingEstimator().predict(*probe, cl).iter_time_s
    v100_before = [MorphlingEstimator().predict(JobSpec("q", MODEL, 64, 1, 4),
                                                ExecutionPlan(dp=4), {n: 4}, cl).iter_time_s
                   for n in ("a-0", "v-0")]
    refit = OnlineRefit(cl, estimator=est, threshold=0.0)
    for i, (job, alloc, t) in enumerate(run):
        refit.observe(i, job, alloc, t)  # never raises, whatever the mix
    assert refit.refits >= 1 and len(refit.samples) == len(run) - 1  # the 0 s one dropped
    assert ARCH.name in morph.k_ and gpt not in morph.k_
    assert morph.unfitted_ == {gpt: 2}
    assert ARCH.name in morph.heldout_error_
    # BERT's fit recovers the run's times; GPT-2 keeps the prior's prediction
    job, alloc, t = run[5]
    assert morph.predict(job, alloc.plan, alloc.placement, cl).iter_time_s == \
        pytest.approx(t, rel=0.05)
    assert morph.predict(*probe, cl).iter_time_s == pytest.approx(prior)
    # the V100s nobody measured keep their ratio to the measured A100s
    after = [morph.predict(JobSpec("q", MODEL, 64, 1, 4), ExecutionPlan(dp=4), {n: 4},
                           cl).iter_time_s for n in ("a-0", "v-0")]
    assert after[1] / after[0] == pytest.approx(v100_before[1] / v100_before[0], rel=0.15)
    if auto:  # the decision names the member that answered for each job
        from apportion.estimation.registry import estimator_name

        assert estimator_name(est, run[0][0]).startswith("auto:")
        assert len(est._members()["tables"].rows_) == len(set(est._members()["tables"].rows_))
