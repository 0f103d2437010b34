"""Hydra's model spilling: the rule every layer shares.

A model larger than a device is trained shard by shard (Hydra, section 4): its
layers are cut into consecutive shards, each small enough to train on the
device alone, and every shard's parameters and optimizer state wait in host
memory between its units. Two places cut a model, and they must cut it the
same way:

* the worker's pilot run (``runtime.workers.pilot.partition``), on the real
  torch model, with the bytes it measures layer by layer;
* the estimator (``estimation.models.spill``), on the catalog's layer graph,
  with the bytes the analytic model counts, so that the round knows a spilled
  plan's shards and its copies before any worker runs.

:func:`greedy_shards` is that cut (Algorithm 1's rule): grow the shard while
the next layer still fits the budget less the double-buffer reserve; with
double buffering also cut where the shard's parameters would outgrow the
reserve, into which the next shard is promoted while this one computes. This
is a core module: it imports nothing from the five areas.
"""

from __future__ import annotations

from collections.abc import Sequence


def greedy_shards(totals: Sequence[float], params: Sequence[float], inputs: Sequence[float],
                  budget_bytes: float, buffer_fraction: float, double_buffer: bool = False
                  ) -> list[tuple[int, int]]:
    """Consecutive shards ``[(start, stop), ...]`` of a chain of layers.

    ``totals[i]``: the bytes layer ``i`` holds on the device while it trains
    (parameters, gradients, optimizer state, activations); ``params[i]``: its
    parameter bytes (what a double buffer prefetches); ``inputs[i]``: the bytes
    of its input, which a shard starting at ``i`` also holds. A shard grows
    while it fits ``budget_bytes * (1 - buffer_fraction)``; with
    ``double_buffer`` its parameters must also fit the reserve
    ``budget_bytes * buffer_fraction``. Raises MemoryError naming the layer when
    one layer alone does not fit: no cut can help it.
    """
    n = len(totals)
    if not len(params) == len(inputs) == n:
        raise ValueError("totals, params and inputs must describe the same layers")
    limit = budget_bytes * (1.0 - buffer_fraction)
    reserve = budget_bytes * buffer_fraction if double_buffer else float("inf")
    out: list[tuple[int, int]] = []
    start, held, held_params = 0, 0.0, 0.0
    for i in range(n):
        if i > start and (held + totals[i] > limit or held_params + params[i] > reserve):
            out.append((start, i))
            start, held, held_params = i, 0.0, 0.0
        grown = held + (inputs[i] if i == start else 0.0) + totals[i]
        if grown > limit:
            raise MemoryError(f"layer {i} alone needs {grown:.0f} B > budget {limit:.0f} B "
                              f"({budget_bytes:.0f} B less {buffer_fraction:.0%} buffer)")
        if params[i] > reserve:
            raise MemoryError(f"layer {i}'s parameters ({params[i]:.0f} B) do not fit the "
                              f"double-buffer reserve ({reserve:.0f} B): raise buffer_fraction "
                              "or train without double buffering")
        held, held_params = grown, held_params + params[i]
    if n:
        out.append((start, n))
    return out
