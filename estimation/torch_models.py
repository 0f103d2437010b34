"""Real torch modules for the catalog's CPU-trainable models (gpt-tiny, bert-tiny, vit-tiny).

Each module is a list of layers named exactly like the catalog's layer graph
(``embed``, ``block0`` .. ``blockN``, ``head``) so per-layer measurements line
up with the graph the estimators partition. ``tp > 1`` builds the per-device
shard of a Megatron-style tensor-parallel layout on one device (heads and FFN
width divided by ``tp``): the sharded shapes are what one device computes, so
timing them is timing one TP rank's computation (the all-reduces are costed
separately from the communication tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from apportion.models import ModelSpec, get_model


@dataclass(frozen=True)
class TinyConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    patch_dim: int = 0  # > 0 for ViT
    causal: bool = False


CONFIGS = {
    "gpt-tiny": TinyConfig("gpt-tiny", 4, 128, 4, 64, 1024, causal=True),
    "bert-tiny": TinyConfig("bert-tiny", 2, 128, 2, 64, 1024),
    "vit-tiny": TinyConfig("vit-tiny", 4, 128, 4, 65, 10, patch_dim=48),
}


class Embed(nn.Module):
    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.c = c
        if c.patch_dim:
            self.proj = nn.Linear(c.patch_dim, c.hidden)
            self.cls = nn.Parameter(torch.zeros(1, 1, c.hidden))
            self.pos = nn.Parameter(torch.zeros(1, c.seq, c.hidden))
        else:
            self.tok = nn.Embedding(c.vocab, c.hidden)
            self.pos = nn.Parameter(torch.zeros(1, c.seq, c.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.c.patch_dim:
            h = self.proj(x)
            return torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        return self.tok(x) + self.pos


class Block(nn.Module):
    """Pre-norm transformer block; ``tp`` divides heads and FFN width (one shard)."""

    def __init__(self, c: TinyConfig, tp: int = 1) -> None:
        super().__init__()
        if c.heads % tp:
            raise ValueError(f"{c.heads} heads cannot be split {tp} ways")
        h, self.heads = c.hidden, c.heads // tp
        self.head_dim = h // c.heads
        inner = self.heads * self.head_dim
        self.causal = c.causal
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * inner)
        self.proj = nn.Linear(inner, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h // tp)
        self.fc2 = nn.Linear(4 * h // tp, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        att = (split(q) @ split(k).transpose(-1, -2)) / math.sqrt(self.head_dim)
        if self.causal:
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        y = (att.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, c: TinyConfig) -> None:
        super().__init__()
        self.c = c
        self.ln = nn.LayerNorm(c.hidden)
        self.out = nn.Linear(c.hidden, c.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln(x)
        if self.c.patch_dim:
            x = x[:, 0]
        return self.out(x)


class TinyModel(nn.Module):
    """Layers in catalog order; ``forward`` runs them in sequence."""

    def __init__(self, c: TinyConfig, tp: int = 1) -> None:
        super().__init__()
        self.config = c
        names = ["embed"] + [f"block{i}" for i in range(c.layers)] + ["head"]
        mods: list[nn.Module] = [Embed(c)] + [Block(c, tp) for _ in range(c.layers)] + [Head(c)]
        self.names = names
        self.layers = nn.ModuleList(mods)
        self.checkpointing = False  # recompute each block's activations in the backward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.checkpointing and isinstance(layer, Block):
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x

    def example_input(self, batch: int, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        c = self.config
        if c.patch_dim:
            return torch.randn(batch, c.seq - 1, c.patch_dim, generator=g)
        return torch.randint(0, c.vocab, (batch, c.seq), generator=g)

    def loss(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        if c.patch_dim:
            target = torch.zeros(out.shape[0], dtype=torch.long)
            return nn.functional.cross_entropy(out, target)
        return nn.functional.cross_entropy(out.reshape(-1, c.vocab), x.reshape(-1))


def build(name: str, tp: int = 1, seed: int = 0) -> TinyModel:
    """The torch module of catalog model ``name`` (one TP shard when ``tp > 1``)."""
    key = name.lower()
    if key not in CONFIGS:
        raise KeyError(f"no torch module for {name!r}; available: {', '.join(CONFIGS)}")
    torch.manual_seed(seed)
    return TinyModel(CONFIGS[key], tp)


def catalog_spec(name: str) -> ModelSpec:
    return get_model(name)
