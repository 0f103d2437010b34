"""Real torch modules for the catalog's CPU-trainable sizes, and their synthetic data.

The catalog (``apportion.models``) describes ``gpt-tiny``, ``bert-tiny`` and
``vit-tiny`` as layer graphs; this module builds the matching torch modules
from the same hidden size, block count, sequence length and vocabulary (read
back from the layer graph, so the two never drift apart) and a test checks the
parameter counts agree.

The data are synthetic and *keyed by global sample index*: sample ``i`` of a
job with seed ``s`` is always the same tensor, whatever the worker count, the
rank or the accumulation split. That is what lets a job resized from two
workers to one and back see exactly the same global batches as a job that was
never touched, so its loss trajectory can be compared.

Layers use separate q/k/v/o and fc1/fc2 ``nn.Linear`` modules (no fused
projections) so torch's tensor-parallel column/row styles apply to them
directly, and attention infers its local head count from the projected width
(a tensor-parallel rank holds ``heads / tp`` heads).
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
MASK_ID = 0  # bert-tiny's mask token


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
    def __init__(self, h: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.head_dim = h // heads
        self.causal = causal
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        local_heads = q.shape[-1] // self.head_dim  # heads / tp under tensor parallelism
        q, k, v = (t.reshape(b, s, local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, s, local_heads * self.head_dim))


class Block(nn.Module):
    """Pre-norm transformer block: the catalog's 4h^2 + 8h^2 parameters plus biases and norms."""

    def __init__(self, h: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = Attention(h, heads, causal)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
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

    def __init__(self, shape: NetShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden
        self.wte = nn.Embedding(shape.vocab, h)
        self.wpe = nn.Embedding(shape.seq, h)
        self.blocks = nn.ModuleList(Block(h, shape.heads, shape.family == "gpt")
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
    def __init__(self, shape: NetShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden
        self.patch = nn.Linear(shape.patch_dim, h, bias=False)  # the class token takes the bias's h
        self.cls = nn.Parameter(torch.zeros(1, 1, h))
        self.pos = nn.Parameter(torch.zeros(1, shape.patches + 1, h))
        self.blocks = nn.ModuleList(Block(h, shape.heads, False) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, shape.vocab)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.patch(patches)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x[:, 0]))


def build_net(name: str, seed: int = 0) -> nn.Module:
    """A freshly initialised module for catalog model ``name`` (same seed, same weights)."""
    spec = get_model(name)
    if spec.name not in _HEADS:
        raise ValueError(f"model {name!r} has no CPU-trainable torch module; "
                         f"trainable sizes are {', '.join(TRAINABLE)}")
    shape = shape_of(spec)
    torch.manual_seed(seed)
    return VitNet(shape) if shape.family == "vit" else TokenNet(shape)


def _sample_gen(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


def batch(name: str, seed: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global samples ``start .. start+count-1`` of the job's synthetic stream: (inputs, targets).

    gpt: an affine token recurrence (learnable next-token structure); bert: the
    same sequences with 15% of positions masked, targets the originals; vit:
    a fixed random prototype per class plus noise, cut into patches.
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
        first, step = torch.randint(1, shape.vocab, (2,), generator=g).tolist()
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


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

