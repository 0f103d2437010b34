"""The runtime worker's models and synthetic data.

The torch modules themselves live in :mod:`apportion.estimation.profilers.torch_models`
(one definition, shared with the profiler that measures them); this module
re-exports them and adds the data.

The data are synthetic and *keyed by global sample index*: sample ``i`` of a
job with seed ``s`` is always the same tensor, whatever the worker count, the
rank or the accumulation split. That is what lets a job resized from two
workers to one and back see exactly the same global batches as a job that was
never touched, so its loss trajectory can be compared.
"""

from __future__ import annotations

import torch
from apportion.estimation.profilers.torch_models import (
    TRAINABLE,
    Block,
    NetShape,
    TokenNet,
    VitNet,
    build_net,
    param_count,
    shape_of,
)
from torch.nn import functional as F

from apportion.models import get_model

__all__ = ["MASK_ID", "TRAINABLE", "Block", "NetShape", "TokenNet", "VitNet", "batch",
           "build_net", "loss_fn", "param_count", "shape_of"]

MASK_ID = 0  # bert-tiny's mask token
STEPS = (1, 2, 3, 5)  # the token streams' strides (see batch)


def _sample_gen(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


def batch(name: str, seed: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global samples ``start .. start+count-1`` of the job's synthetic stream: (inputs, targets).

    gpt: an affine token recurrence ``t[k+1] = t[k] + step`` (mod the vocabulary)
    with the step drawn from a few small values, so a short run learns it
    (each token has a handful of likely successors: the loss falls from
    ln(vocab) towards ln(len(STEPS)) and below once attention reads the step);
    bert: the same sequences with 15% of positions masked, targets the
    originals; vit: a fixed random prototype per class plus noise, cut into
    patches.
    """
    shape = shape_of(get_model(name))
    xs, ys = [], []
    if shape.family == "vit":
        protos = torch.randn(shape.vocab, shape.patches, shape.patch_dim,
                             generator=torch.Generator().manual_seed(seed))
    for i in range(start, start + count):
        g = _sample_gen(seed, i)
        if shape.family == "vit":
            c = int(torch.randint(shape.vocab, (1,), generator=g))
            xs.append(protos[c] + 0.5 * torch.randn(shape.patches, shape.patch_dim, generator=g))
            ys.append(torch.tensor(c))
            continue
        first, k = torch.randint(1, shape.vocab, (2,), generator=g).tolist()
        step = STEPS[k % len(STEPS)]
        seq = (first + step * torch.arange(shape.seq + 1)) % (shape.vocab - 1) + 1
        if shape.family == "gpt":
            xs.append(seq[:-1])
            ys.append(seq[1:])
        else:
            tokens = seq[:-1]
            mask = torch.rand(shape.seq, generator=g) < 0.15
            xs.append(torch.where(mask, torch.full_like(tokens, MASK_ID), tokens))
            ys.append(tokens)
    return torch.stack(xs), torch.stack(ys)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every predicted token (or image)."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
