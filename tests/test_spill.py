"""Hydra spilled training: pilot partitioning and the equal-loss test (the core test).

Tolerance: in-process spilled training runs the same kernels in the same order as
whole training, so losses must match to rtol 1e-6; worker processes run with one
thread each, whose float reductions may differ in the last bits, so rtol 1e-5.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from apportion.formulations.shards import Placement, ShardDevice, ShardModel, ShardProblem
from apportion.runtime.workers.pilot import OptimSpec, partition
from apportion.runtime.workers.spill import (
    SpillJob,
    SpillTrainer,
    make_batches,
    make_mlp,
    train_whole,
)
from apportion.solvers.shards import solve
from apportion.solvers.shards_validator import check_schedule

WIDTH, CLASSES = 24, 4


def _job(name: str, seed: int, optim: OptimSpec, budget: float, epochs: int = 2
         ) -> tuple[SpillJob, list[float]]:
    layers, loss = make_mlp(WIDTH, 3, CLASSES, seed)
    batches = make_batches(3, 8, WIDTH, CLASSES, seed + 100)
    part = partition(layers, batches[0][0], budget, optim, loss_fn=loss, target=batches[0][1],
                     repeats=1)
    ref = train_whole(copy.deepcopy(layers), loss, batches, epochs, optim)
    job = SpillJob(name, copy.deepcopy(layers), part.boundaries, loss, batches, epochs, optim,
                   part.unit_runtimes(1))
    return job, ref


def test_pilot_partition_respects_the_budget() -> None:
    layers, _loss = make_mlp(WIDTH, 3, CLASSES, 0)
    x = torch.randn(8, WIDTH)
    opt = OptimSpec("adam", 1e-3)
    budget = 30_000.0
    part = partition(layers, x, budget, opt, buffer_fraction=0.15, repeats=1)
    assert len(part.shards) > 1
    assert part.boundaries[0] == 0
    assert [s.stop for s in part.shards[:-1]] == part.boundaries[1:]
    assert part.shards[-1].stop == len(layers)
    for s in part.shards:
        assert 0 < s.total_bytes <= budget * 0.85
        assert s.forward_s > 0 and s.backward_s > 0
    linear = layers[0]
    assert part.shards[0].param_bytes >= sum(p.numel() * 4 for p in linear.parameters())
    assert part.shards[0].optim_bytes == 2 * part.shards[0].grad_bytes  # Adam: two moments
    whole = partition(layers, x, 1e12, opt, repeats=1)
    assert whole.boundaries == [0]
    runtimes = part.unit_runtimes(minibatches=2)
    assert len(runtimes) == 2 * 2 * len(part.shards)
    with pytest.raises(MemoryError):
        partition(layers, x, 1_000.0, opt, repeats=1)


@pytest.mark.parametrize("fraction", [0.15, 0.2, 0.25])
def test_double_buffered_shards_prefetch_into_the_reserve(fraction: float) -> None:
    """With double buffering the next shard's parameters land in the reserve while this
    one computes: every shard's parameters fit it, and the limit still holds. Plain SGD
    on one sample: parameters and gradients dominate, so the reserve is what cuts."""
    layers, _loss = make_mlp(WIDTH, 5, CLASSES, 0)
    x = torch.randn(1, WIDTH)
    opt = OptimSpec("sgd", 1e-3)
    budget = 20_000.0
    single = partition(layers, x, budget, opt, buffer_fraction=fraction, repeats=1)
    double = partition(layers, x, budget, opt, buffer_fraction=fraction, repeats=1,
                       double_buffer=True)
    assert double.meta["reserve_bytes"] == budget * fraction
    assert single.meta["reserve_bytes"] is None
    assert max(s.param_bytes for s in single.shards) > budget * fraction  # the case at hand
    for s in double.shards:
        assert 0 < s.param_bytes <= budget * fraction
        assert s.total_bytes <= budget * (1 - fraction)
    assert [s.stop for s in double.shards[:-1]] == double.boundaries[1:]
    assert double.shards[-1].stop == len(layers)
    assert len(double.shards) > len(single.shards)
    biggest = max(sum(p.numel() * 4 for p in m.parameters()) for m in layers)
    with pytest.raises(MemoryError, match="double-buffer reserve"):
        partition(layers, x, 0.9 * biggest / 0.1, opt, buffer_fraction=0.1, repeats=1,
                  double_buffer=True)


def test_spilled_equals_whole_in_process_under_lrtf() -> None:
    a, ref_a = _job("a", 1, OptimSpec("adam", 1e-2), 30_000)
    b, ref_b = _job("b", 2, OptimSpec("sgd", 0.1, momentum=0.9), 25_000, epochs=1)
    assert a.num_shards > 1 and b.num_shards > 1
    rep = SpillTrainer([a, b], workers=0, devices=["cpu", "cpu"]).train()
    assert rep.losses["a"] == pytest.approx(ref_a, rel=1e-6)
    assert rep.losses["b"] == pytest.approx(ref_b, rel=1e-6)
    assert rep.losses["a"][-1] < rep.losses["a"][0]  # it does train
    assert len(rep.units_run) == a.num_units + b.num_units


def test_double_buffering_prefetches_and_changes_nothing() -> None:
    """The double buffer promotes the next shard while the current one computes; losses are
    bit-for-bit those of the single-buffer run, under LRTF and under a fixed order."""
    a, ref_a = _job("a", 1, OptimSpec("adam", 1e-2), 30_000)
    b, _ = _job("b", 2, OptimSpec("sgd", 0.1, momentum=0.9), 25_000, epochs=1)
    # uniform unit runtimes: LRTF's order (and so how often a device runs the same job's next
    # unit, the only case a prefetch serves) must not hang on pilot timings of a loaded machine
    a, b = dataclasses.replace(a, unit_runtimes=None), dataclasses.replace(b, unit_runtimes=None)
    plain = SpillTrainer([a, b], workers=0, devices=["cpu", "cpu"]).train()
    buffered = SpillTrainer([a, b], workers=0, devices=["cpu", "cpu"], double_buffer=True)
    rep = buffered.train()
    assert rep.losses == plain.losses
    assert rep.losses["a"] == pytest.approx(ref_a, rel=1e-6)
    assert buffered.prefetched > 0
    one = SpillTrainer([a], workers=0, devices=["cpu"], double_buffer=True)
    order = [Placement(0, u, 0, float(u), float(u + 1)) for u in range(a.num_units)]
    assert one.train(order).losses["a"] == pytest.approx(ref_a, rel=1e-6)
    assert one.prefetched == sum(1 for u in range(1, a.num_units)
                                 if a.unit(u)[1] != a.unit(u - 1)[1])


def test_spilled_equals_whole_on_worker_processes_in_solver_order() -> None:
    """Two jobs on two CPU worker processes, following a CP-SAT schedule built from the
    pilot-run unit runtimes (validated first)."""
    a, ref_a = _job("a", 3, OptimSpec("adam", 1e-2), 30_000)
    b, ref_b = _job("b", 4, OptimSpec("sgd", 0.05), 30_000)
    problem = ShardProblem([ShardDevice("w0"), ShardDevice("w1")], [
        ShardModel(j.name, tuple((j.unit_runtimes or []) * (len(j.batches) * j.epochs)))
        for j in (a, b)])
    sol = solve(problem, "cp-sat", 2.0)
    check_schedule(problem, sol.schedule)
    rep = SpillTrainer([a, b], workers=2).train(order=sol.schedule)
    assert rep.losses["a"] == pytest.approx(ref_a, rel=1e-5)
    assert rep.losses["b"] == pytest.approx(ref_b, rel=1e-5)
    by_device = {(j, u): p for p, j, u in rep.units_run}
    assert all(by_device[pl.model, pl.unit] == pl.device for pl in sol.schedule)


@pytest.mark.parametrize("double", [False, True])
def test_a_device_holds_one_shard_at_a_time(double: bool) -> None:
    """Spilling keeps one shard's buffer per device (two with the double buffer), whatever
    the number of shards: the model never sits on the device whole."""
    a, ref_a = _job("a", 5, OptimSpec("adam", 1e-2), 30_000)
    assert a.num_shards > 2
    t = SpillTrainer([a], workers=0, devices=["cpu"], double_buffer=double)
    assert t.train().losses["a"] == pytest.approx(ref_a, rel=1e-6)
    assert 1 <= len(t._buffers[0]) <= (2 if double else 1)


def test_a_fresh_buffer_has_the_shards_structure_and_unsaved_buffers() -> None:
    from apportion.runtime.workers.spill import _empty_like

    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    m[0].bias.requires_grad_(False)
    m.register_buffer("table", torch.arange(5.0), persistent=False)
    e = _empty_like(m, "cpu")
    assert set(e.state_dict()) == set(m.state_dict())
    assert all(isinstance(p, torch.nn.Parameter) for p in e.parameters())
    assert [p.requires_grad for p in e.parameters()] == [p.requires_grad for p in m.parameters()]
    assert torch.equal(e.table, m.table)  # not carried by promotion: copied at build
    assert e[0].weight.data_ptr() != m[0].weight.data_ptr()
