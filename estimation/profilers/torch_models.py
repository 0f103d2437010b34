"""Real torch modules for the catalog's CPU-trainable sizes: one definition for the runtime
worker that trains them and the profiler that measures them.

The catalog (``apportion.models``) describes ``gpt-tiny``, ``bert-tiny`` and
``vit-tiny`` as layer graphs; the modules here are built from the same hidden
size, block count, sequence length and vocabulary (read back from the layer
graph, so the two never drift apart), and a test checks the parameter counts
agree.

Layers use separate q/k/v/o and fc1/fc2 ``nn.Linear`` modules (no fused
projections) so torch's tensor-parallel column/row styles apply to them
directly, and attention infers its local head count from the projected width
(a tensor-parallel rank holds ``heads / tp`` heads). :func:`layered` views a
module as the catalog's layers in order (``embed``, ``block0`` .., ``head``)
for per-layer profiling. The runtime's synthetic data live in
``apportion.runtime.workers.torch_nets``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn import functional as F

from apportion.models import ModelSpec, get_model

# heads are not part of the layer graph's costs that matter here; the catalog's values
_HEADS = {"gpt-tiny": 4, "bert-tiny": 2, "vit-tiny": 4}
TRAINABLE = tuple(_HEADS)


@dataclass(frozen=True)
class NetShape:
    """What a torch module needs from a catalog entry."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int  # token vocabulary (gpt/bert) or class count (vit)
    patch_dim: int = 0  # vit only
    patches: int = 0  # vit only


def shape_of(spec: ModelSpec) -> NetShape:
    """Read hidden size, block count, sequence length and vocabulary back from the layer graph."""
    h, s = spec.hidden, spec.seq_len
    blocks = [n for n in spec.layers if spec.layer(n)["kind"] == "block"]
    emb = int(spec.layer("embed")["params"])
    heads = _HEADS.get(spec.name, max(1, h // 64))
    if spec.family == "vit":  # emb = patch_dim*h + h + (patches+1)*h, head = classes*(h+1) + 2h
        patches = s - 1
        patch_dim = (emb - h - s * h) // h
        classes = (int(spec.layer("head")["params"]) - 2 * h) // (h + 1)
        return NetShape(spec.name, "vit", len(blocks), h, heads, s, classes, patch_dim, patches)
    vocab = emb // h - s  # emb = vocab*h + positions*h with positions == seq
    return NetShape(spec.name, spec.family, len(blocks), h, heads, s, vocab)


class Attention(nn.Module):
    """``tp > 1`` builds one tensor-parallel shard (``heads / tp`` heads): the profiler's
    sharded shapes on one device. The runtime shards full modules with DTensor instead."""

    def __init__(self, h: int, heads: int, causal: bool, tp: int = 1) -> None:
        super().__init__()
        if heads % tp:
            raise ValueError(f"{heads} heads cannot be split {tp} ways")
        self.head_dim = h // heads
        self.causal = causal
        inner = h // tp
        self.q, self.k, self.v = (nn.Linear(h, inner) for _ in range(3))
        self.o = nn.Linear(inner, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        local_heads = q.shape[-1] // self.head_dim  # heads / tp under tensor parallelism
        q, k, v = (t.reshape(b, s, local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, s, local_heads * self.head_dim))


class Block(nn.Module):
    """Pre-norm transformer block: the catalog's 4h^2 + 8h^2 parameters plus biases and norms."""

    def __init__(self, h: int, heads: int, causal: bool, tp: int = 1) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = Attention(h, heads, causal, tp)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h // tp), nn.Linear(4 * h // tp, h)
        self.checkpointing = False  # activation recomputation (the plan's ``checkpointing`` flag)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TokenNet(nn.Module):
    """gpt (causal, next-token) or bert (bidirectional, masked-token) with a tied head."""

    def __init__(self, shape: NetShape, tp: int = 1) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden
        self.wte = nn.Embedding(shape.vocab, h)
        self.wpe = nn.Embedding(shape.seq, h)
        self.blocks = nn.ModuleList(Block(h, shape.heads, shape.family == "gpt", tp)
                                    for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(h)
        nn.init.normal_(self.wte.weight, std=0.02)  # tied head: unit-variance embeddings give huge logits
        nn.init.normal_(self.wpe.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


class VitNet(nn.Module):
    def __init__(self, shape: NetShape, tp: int = 1) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden
        self.patch = nn.Linear(shape.patch_dim, h, bias=False)  # the class token takes the bias's h
        self.cls = nn.Parameter(torch.zeros(1, 1, h))
        self.pos = nn.Parameter(torch.zeros(1, shape.patches + 1, h))
        self.blocks = nn.ModuleList(Block(h, shape.heads, False, tp) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, shape.vocab)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.patch(patches)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x[:, 0]))


def build_net(name: str, seed: int = 0, tp: int = 1) -> nn.Module:
    """A freshly initialised module for catalog model ``name`` (same seed, same weights);
    ``tp > 1``: one tensor-parallel shard of it (see :class:`Attention`)."""
    spec = get_model(name)
    if spec.name not in _HEADS:
        raise ValueError(f"model {name!r} has no CPU-trainable torch module; "
                         f"trainable sizes are {', '.join(TRAINABLE)}")
    shape = shape_of(spec)
    torch.manual_seed(seed)
    return VitNet(shape, tp) if shape.family == "vit" else TokenNet(shape, tp)


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class _Embed(nn.Module):
    """The catalog's ``embed`` layer of a module (token + position, or patches + class token),
    holding the module's own embedding parameters."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.vit = isinstance(net, VitNet)
        if self.vit:
            self.patch, self.cls, self.pos = net.patch, net.cls, net.pos
        else:
            self.wte, self.wpe = net.wte, net.wpe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.vit:
            h = self.patch(x)
            return torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        pos = torch.arange(x.shape[1], device=x.device)
        return self.wte(x) + self.wpe(pos)


class _Head(nn.Module):
    """The catalog's ``head`` layer: final norm and the output layer (the tied embedding for
    token nets)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.vit = isinstance(net, VitNet)
        self.ln_f = net.ln_f
        if self.vit:
            self.head = net.head
        else:
            self.wte = net.wte

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.vit:
            return self.head(self.ln_f(x[:, 0]))
        return self.ln_f(x) @ self.wte.weight.t()


def layered(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(catalog layer name, module)`` in order; running them in turn is ``net``'s forward.
    The embed and head views hold references to ``net``'s own parameters (a tied embedding
    appears in both)."""
    blocks = list(net.blocks)  # type: ignore[union-attr]
    return ([("embed", _Embed(net))] + [(f"block{i}", b) for i, b in enumerate(blocks)] +
            [("head", _Head(net))])


def example_input(name: str, count: int, seed: int = 0) -> torch.Tensor:
    """Random inputs of the right shape for ``count`` samples (profiling needs no labels)."""
    shape = shape_of(get_model(name))
    g = torch.Generator().manual_seed(seed)
    if shape.family == "vit":
        return torch.randn(count, shape.patches, shape.patch_dim, generator=g)
    return torch.randint(0, shape.vocab, (count, shape.seq), generator=g)
