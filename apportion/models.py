"""The model catalog: layer graphs with FLOPs, parameters and activation sizes.

A :class:`ModelSpec` holds a networkx ``DiGraph`` whose nodes are layers in
execution order with attributes ``flops`` (forward FLOPs per sample),
``params`` (parameter count), ``act_bytes`` (activation bytes kept for the
backward pass, per sample, without recomputation) and ``out_bytes`` (bytes of
the layer's output per sample: what crosses a pipeline cut). Edges carry
``bytes`` (the producer's output per sample) so partitioners can cut where
outputs are small.

Closed forms (per sample, sequence length s, hidden h, FFN width f, vocab V):

* transformer block: params 4h^2 + 2hf (+ biases and norms); forward FLOPs
  2 * params * s + 4 s^2 h (attention scores and weighted values);
  activations s*h*(34 + 5*a*s/h) bytes at 16-bit (Korthikanti et al. 2022),
  scaled by ``f / 4h`` for the MLP part; LLaMA-family models are trained with
  memory-efficient attention, which drops the 5*a*s^2 term;
* LLaMA block (SwiGLU): params 4h^2 + 3hf;
* GShard MoE block: every layer has E experts of width 4h with top-2 routing:
  params 4h^2 + E*8h^2, FLOPs count two experts per token;
* Wide-ResNet (Alpa's definition): ResNet-50 bottleneck stages [3, 4, 6, 3]
  with base filters C and the 3x3 convolution widened by W; FLOPs 2 * MACs.

Sizes follow the papers: Crius table 2 uses Alpa's benchmark configurations
(their size labels are Alpa's and approximate the parameter counts); Morphling
table 1 and YMIR use the public checkpoints' architectures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from apportion.errors import CatalogError


@dataclass(frozen=True)
class ModelSpec:
    """A model as a chain-shaped layer graph plus the facts estimators need."""

    name: str
    family: str
    graph: nx.DiGraph
    layers: tuple[str, ...]
    dtype_bytes: int = 2
    seq_len: int = 1
    hidden: int = 0

    @property
    def params(self) -> int:
        return int(sum(self.graph.nodes[n]["params"] for n in self.layers))

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs per sample (training is about three times this)."""
        return float(sum(self.graph.nodes[n]["flops"] for n in self.layers))

    def layer(self, name: str) -> dict:
        return self.graph.nodes[name]

    def attr(self, key: str) -> list[float]:
        """One attribute of every layer, in execution order (memoised: specs are immutable)."""
        memo = self.__dict__.get("_attr_memo")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_attr_memo", memo)
        if key not in memo:
            memo[key] = [float(self.graph.nodes[n][key]) for n in self.layers]
        return list(memo[key])


def _chain(name: str, family: str, rows: list[tuple[str, str, float, float, float, float]],
           dtype_bytes: int, seq_len: int, hidden: int) -> ModelSpec:
    g = nx.DiGraph(name=name, family=family)
    order: list[str] = []
    for lname, kind, flops, params, act, out in rows:
        g.add_node(lname, kind=kind, flops=float(flops), params=int(params),
                   act_bytes=float(act), out_bytes=float(out))
        if order:
            g.add_edge(order[-1], lname, bytes=g.nodes[order[-1]]["out_bytes"])
        order.append(lname)
    return ModelSpec(name, family, g, tuple(order), dtype_bytes, seq_len, hidden)


# ---------------------------------------------------------------------------
# Transformers
# ---------------------------------------------------------------------------
def transformer(name: str, family: str, *, layers: int, hidden: int, heads: int, seq: int,
                vocab: int, ffn: int | None = None, gated: bool = False, positions: int = 0,
                decoder_layers: int = 0, experts: int = 0, patch_tokens: int = 0,
                patch_dim: int = 0, head_params: int | None = None, tied: bool = True,
                dtype_bytes: int = 2, flash_attention: bool = False,
                attn_dim: int | None = None) -> ModelSpec:
    """A transformer as embedding -> blocks -> head, with closed-form costs."""
    h, s, a = hidden, seq, heads
    f = ffn or 4 * h
    inner = attn_dim or h  # heads x head size; T5-3B uses 32 x 128 = 4096 on h = 1024
    b = dtype_bytes
    rows: list[tuple[str, str, float, float, float, float]] = []
    out = s * h * b
    if patch_dim:  # ViT: linear patch embedding + class token + positions
        emb_params = patch_dim * h + h + (patch_tokens + 1) * h
        emb_flops = 2.0 * patch_tokens * patch_dim * h
    else:
        emb_params = vocab * h + positions * h
        emb_flops = 0.0  # a lookup
    rows.append(("embed", "embedding", emb_flops, emb_params, s * h * b, out))

    def block(idx: str, cross: bool) -> None:
        attn = 4 * h * inner + 4 * inner
        mlp = (3 * h * f) if gated else (2 * h * f + f + h)
        norms = 4 * h
        params = attn + norms
        flops_tok = 2.0 * attn
        if cross:
            params += 4 * h * inner + 2 * h
            flops_tok += 2.0 * 4 * h * inner
        if experts:
            params += experts * mlp + h * experts  # experts and the router
            flops_tok += 2.0 * 2 * mlp + 2.0 * h * experts  # top-2 routing
        else:
            params += mlp
            flops_tok += 2.0 * mlp
        flops = flops_tok * s + 4.0 * s * s * h * (2 if cross else 1)
        mlp_scale = f / (4 * h) * (2 if experts else 1)
        act = s * h * (10 + 24 * mlp_scale)  # 16-bit bytes
        if not flash_attention:  # the softmax and dropout maps over s x s per head
            act += 5 * a * s * s
        act = act * b / 2
        rows.append((idx, "block", flops, params, act, out))

    for i in range(layers):
        block(f"block{i}", cross=False)
    for i in range(decoder_layers):
        block(f"dec{i}", cross=True)
    if head_params is None:
        head_params = 0 if tied else vocab * h
    head_flops = 2.0 * s * h * vocab if not patch_dim else 2.0 * h * max(vocab, 1)
    rows.append(("head", "head", head_flops, head_params + 2 * h, s * vocab * b if not patch_dim
                 else h * b, s * vocab * b if not patch_dim else vocab * b))
    return _chain(name, family, rows, dtype_bytes, s, h)


# ---------------------------------------------------------------------------
# Wide-ResNet (Alpa's definition)
# ---------------------------------------------------------------------------
def wide_resnet(name: str, *, filters: int, width: int, image: int = 224, classes: int = 1024,
                stages: tuple[int, ...] = (3, 4, 6, 3), dtype_bytes: int = 4) -> ModelSpec:
    """ResNet-50-style bottleneck network with base filters C and 3x3 width factor W."""
    b = dtype_bytes
    rows: list[tuple[str, str, float, float, float, float]] = []
    hw = image // 2  # 7x7 stride-2 stem
    stem_p = 7 * 7 * 3 * filters + 2 * filters
    stem_f = 2.0 * 7 * 7 * 3 * filters * hw * hw
    hw //= 2  # max pool
    rows.append(("stem", "conv", stem_f, stem_p, 2 * filters * (2 * hw) ** 2 * b,
                 filters * hw * hw * b))
    cin = filters
    for i, nblocks in enumerate(stages):
        f = filters * 2**i
        for j in range(nblocks):
            stride = 2 if (i > 0 and j == 0) else 1
            hw_in, hw_out = hw, hw // stride
            p = cin * f + 9 * f * (f * width) + (f * width) * 4 * f
            macs = cin * f * hw_in**2 + 9 * f * f * width * hw_out**2 + f * width * 4 * f * hw_out**2
            p += 2 * (f + f * width + 4 * f)  # batch norms
            if cin != 4 * f or stride != 1:
                p += cin * 4 * f + 8 * f
                macs += cin * 4 * f * hw_out**2
            # activations kept: inputs of the three convolutions, norms and relus
            act = (3 * cin * hw_in**2 + 3 * f * width * hw_out**2 + 3 * 4 * f * hw_out**2) * b
            rows.append((f"stage{i}.block{j}", "conv", 2.0 * macs, p, act,
                         4 * f * hw_out**2 * b))
            cin, hw = 4 * f, hw_out
    rows.append(("head", "head", 2.0 * cin * classes, cin * classes + classes, cin * b, classes * b))
    return _chain(name, "wresnet", rows, dtype_bytes, 1, filters)


# ---------------------------------------------------------------------------
# The catalog
# ---------------------------------------------------------------------------
def _gpt_like(name: str, family: str, layers: int, hidden: int, heads: int) -> Callable[[], ModelSpec]:
    # Alpa's GPT/BERT benchmark suite: sequence 1024, vocabulary 51200.
    return lambda: transformer(name, family, layers=layers, hidden=hidden, heads=heads, seq=1024,
                               vocab=51200, positions=1024)


def _moe(name: str, layers: int, hidden: int, experts: int) -> Callable[[], ModelSpec]:
    # Alpa's MoE suite: sequence 1024, vocabulary 32000, 16 heads, every layer MoE.
    return lambda: transformer(name, "moe", layers=layers, hidden=hidden, heads=16, seq=1024,
                               vocab=32000, positions=1024, experts=experts)


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int, seq: int = 2048,
           family: str = "llama") -> Callable[[], ModelSpec]:
    return lambda: transformer(name, family, layers=layers, hidden=hidden, heads=heads, seq=seq,
                               vocab=32000, ffn=ffn, gated=True, tied=False,
                               flash_attention=True)


_BUILDERS: dict[str, Callable[[], ModelSpec]] = {
    # Crius table 2 (Alpa's benchmark configurations)
    "wresnet-0.5b": lambda: wide_resnet("wresnet-0.5b", filters=224, width=2),
    "wresnet-1b": lambda: wide_resnet("wresnet-1b", filters=320, width=2),
    "wresnet-2b": lambda: wide_resnet("wresnet-2b", filters=448, width=2),
    "wresnet-4b": lambda: wide_resnet("wresnet-4b", filters=640, width=2),
    "wresnet-6.8b": lambda: wide_resnet("wresnet-6.8b", filters=320, width=16),
    "bert-336m": lambda: transformer("bert-336m", "bert", layers=24, hidden=1024, heads=16,
                                     seq=512, vocab=30522, positions=512 + 2,
                                     head_params=1024 * 1024 + 1024),
    "bert-0.76b": _gpt_like("bert-0.76b", "bert", 24, 1536, 16),
    "bert-1.3b": _gpt_like("bert-1.3b", "bert", 24, 2048, 32),
    "bert-2.6b": _gpt_like("bert-2.6b", "bert", 32, 2560, 32),
    "bert-6.7b": _gpt_like("bert-6.7b", "bert", 32, 4096, 32),
    "moe-0.69b": _moe("moe-0.69b", 8, 768, 16),
    "moe-1.3b": _moe("moe-1.3b", 16, 768, 16),
    "moe-2.4b": _moe("moe-2.4b", 16, 1024, 16),
    "moe-10b": _moe("moe-10b", 16, 1536, 32),
    "moe-27b": _moe("moe-27b", 16, 2048, 48),
    # Morphling table 1
    "vit-86m": lambda: transformer("vit-86m", "vit", layers=12, hidden=768, heads=12, seq=197,
                                   vocab=1000, patch_tokens=196, patch_dim=16 * 16 * 3,
                                   head_params=768 * 1000 + 1000),
    "roberta-355m": lambda: transformer("roberta-355m", "roberta", layers=24, hidden=1024,
                                        heads=16, seq=512, vocab=50265, positions=514 + 1,
                                        head_params=1024 * 1024 + 1024),
    "t5-1.2b": lambda: transformer("t5-1.2b", "t5", layers=24, decoder_layers=24, hidden=1280,
                                   heads=20, seq=512, vocab=32128, ffn=5120),
    "t5-3b": lambda: transformer("t5-3b", "t5", layers=24, decoder_layers=24, hidden=1024,
                                 heads=32, attn_dim=4096, seq=512, vocab=32128, ffn=16384),
    "gpt2-1.5b": lambda: transformer("gpt2-1.5b", "gpt", layers=48, hidden=1600, heads=25,
                                     seq=1024, vocab=50257, positions=1024),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 11008, seq=4096),
    "llama-30b": _llama("llama-30b", 60, 6656, 52, 17920),
    # YMIR
    "vit-base": lambda: transformer("vit-base", "vit", layers=12, hidden=768, heads=12, seq=197,
                                    vocab=1000, patch_tokens=196, patch_dim=16 * 16 * 3,
                                    head_params=768 * 1000 + 1000),
    "roberta-base": lambda: transformer("roberta-base", "roberta", layers=12, hidden=768,
                                        heads=12, seq=512, vocab=50265, positions=514 + 1,
                                        head_params=768 * 768 + 768),
    "vicuna-7b": _llama("vicuna-7b", 32, 4096, 32, 11008, seq=2048, family="vicuna"),
    # CPU-trainable sizes for the runtime's real workers (a few million parameters)
    "gpt-tiny": lambda: transformer("gpt-tiny", "gpt", layers=4, hidden=128, heads=4, seq=64,
                                    vocab=1024, positions=64, dtype_bytes=4),
    "bert-tiny": lambda: transformer("bert-tiny", "bert", layers=2, hidden=128, heads=2, seq=64,
                                     vocab=1024, positions=64, dtype_bytes=4),
    "vit-tiny": lambda: transformer("vit-tiny", "vit", layers=4, hidden=128, heads=4, seq=65,
                                    vocab=10, patch_tokens=64, patch_dim=4 * 4 * 3,
                                    head_params=128 * 10 + 10, dtype_bytes=4),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)


@lru_cache(maxsize=None)
def get_model(name: str) -> ModelSpec:
    """The catalog model ``family-size`` (case-insensitive), or an inline custom model's name."""
    key = str(name).lower()
    if key.startswith(CUSTOM_PREFIX):
        return _custom_from_name(key)
    if key not in _BUILDERS:
        raise CatalogError("model", name, list(_BUILDERS))
    return _BUILDERS[key]()


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog's :class:`ModelSpec` for ``name``, or None where the catalog lacks it.

    A job whose model the catalog lacks (a trace's own job type: Gavel's ``ResNet-18
    (batch size 128)``, ElasticFlow's ``vgg16``; an operator's measured-only model) is
    still scheduled wherever a rate source rates it: its rate stands for the job's
    data-parallel plan, and its memory for "fits" (a rate of 0: it does not run there).
    Callers that can work from rates alone ask here instead of catching the error."""
    try:
        return get_model(name)
    except CatalogError:
        return None


# ---------------------------------------------------------------------------
# Inline custom models (a job's own architecture, described by four numbers)
# ---------------------------------------------------------------------------
CUSTOM_PREFIX = "custom:"
CUSTOM_FAMILIES = ("gpt", "bert", "llama")
# digits bounded in the pattern: int() of a thousand-digit field is slow and then refused
_CUSTOM = re.compile(r"^custom:([a-z0-9_.-]{1,64}):(gpt|bert|llama):l(\d{1,16})-h(\d{1,16})-"
                     r"s(\d{1,16})-p(\d{1,16})(?:-a(\d{1,16}))?$")
#: an inline model's bounds: the same whether it is written as a spec (config.CustomModelSpec)
#: or as its name (``custom:...``, which a jobs file may also give as ``model:``)
CUSTOM_MAX_PARAMETERS = 10**15
CUSTOM_MAX_HEADS = 100_000


def custom_model_name(name: str, family: str, layers: int, hidden: int, seq_len: int,
                      params: int, heads: int | None = None) -> str:
    """The name a job's inline model spec is stored and estimated under.

    Every fact the estimators need is in the name, so a job read back from the
    state store (or by another process) resolves to the same :class:`ModelSpec`
    through :func:`get_model` without a registry. Raises ``ValueError`` naming
    the field when the numbers describe no transformer.
    """
    full = (f"{CUSTOM_PREFIX}{name.lower()}:{family}:l{int(layers)}-h{int(hidden)}-"
            f"s{int(seq_len)}-p{int(params)}" + (f"-a{int(heads)}" if heads else ""))
    _custom_from_name(full)  # validates
    return full


def _custom_transformer(name: str, family: str, layers: int, hidden: int, seq: int,
                        heads: int, vocab: int) -> ModelSpec:
    if family == "llama":
        ffn = 256 * max(1, round(8 * hidden / 3 / 256))
        return transformer(name, "llama", layers=layers, hidden=hidden, heads=heads, seq=seq,
                           vocab=vocab, ffn=ffn, gated=True, tied=False, flash_attention=True)
    return transformer(name, family, layers=layers, hidden=hidden, heads=heads, seq=seq,
                       vocab=vocab, positions=seq)


def _custom_from_name(key: str) -> ModelSpec:
    m = _CUSTOM.match(key)
    if m is None:
        raise ValueError(f"{key!r} is not a custom model name (custom:NAME:FAMILY:lL-hH-sS-pP)")
    _, family = m.group(1), m.group(2)
    layers, hidden, seq, params = (int(m.group(i)) for i in (3, 4, 5, 6))
    heads = int(m.group(7)) if m.group(7) else max(1, hidden // 64)
    if not 1 <= layers <= 10_000:
        raise ValueError(f"layers: {layers} must be in 1..10000")
    if not 8 <= hidden <= 1_000_000:
        raise ValueError(f"hidden_size: {hidden} must be in 8..1000000")
    if not 1 <= seq <= 10_000_000:
        raise ValueError(f"sequence_length: {seq} must be in 1..10000000")
    if not 1 <= params <= CUSTOM_MAX_PARAMETERS:
        raise ValueError(f"parameters: {params} must be in 1..{CUSTOM_MAX_PARAMETERS}")
    if not 1 <= heads <= CUSTOM_MAX_HEADS:
        raise ValueError(f"heads: {heads} must be in 1..{CUSTOM_MAX_HEADS}")
    if heads < 1 or hidden % heads:
        raise ValueError(f"heads: {heads} must divide hidden_size {hidden}")
    # the embedding (vocabulary) takes whatever the blocks leave of the parameter count
    one = _custom_transformer(key, family, layers, hidden, seq, heads, 1).params
    per_token = _custom_transformer(key, family, layers, hidden, seq, heads, 2).params - one
    vocab = 1 + round((params - one) / per_token)
    if vocab < 2:
        raise ValueError(f"parameters: {params} is fewer than {layers} {family} blocks of hidden "
                         f"size {hidden} hold with their embeddings ({one + per_token}); give the "
                         "real total or fewer layers")
    return _custom_transformer(key, family, layers, hidden, seq, heads, vocab)
