"""Morphling's fitted performance model (Morphling, section 4 and appendix A).

Per configuration (execution plan x GPUs x placement x CPUs):

* ``T_fwd``: profiled forward time of the per-GPU batch, an
  :class:`AffineForward` ``fixed + per_sample * n`` fitted to the samples' measured
  forward times (proportional where that fits within the timing's resolution; or a
  profiler's curve; without either, FLOPs over ``efficiency x peak``); a tensor shard
  divides the per-sample part by ``t`` and keeps the fixed one; under pipeline
  parallelism ``(m + p - 1)`` slots of one stage's micro-batch, each paying the fixed
  part whole; ``a`` micro-batch forwards under gradient accumulation; ``k_3d`` times the
  per-sample part under TP or PP (3D plans run in another framework's kernels than the
  profiled DP ones).
* ``T_bwd = k_bwd * T_fwd`` (plus the recomputed blocks' forward under gradient
  checkpointing).
* ``T_comm = steps x latency + V / B`` per collective and link, ``B`` the bottleneck
  bandwidth of each group (ranks laid out Megatron-style: TP fastest, then DP, then
  PP): ``V_dp = P_bytes * 2(d-1) / (d t p)`` in one ring per gradient bucket (intra-node
  latency ``k_lat`` per step), across nodes at the pace of the node driving the fewest
  network adapters (:func:`rails_fraction`), shared by the DP groups a node hosts, at
  ``single_scale`` or ``odd_scale`` of that for placements of single GPUs or split
  adapter groups (:func:`link_class`); ``V_tp = 4 * 2 (t-1) * b s h l * act_bytes /
  (d t)`` plus ``k_tp_lat`` per TP collective; ``V_pp = 2 p * b s h * act_bytes / d``
  (every TP rank sends the whole activation) plus ``k_pp_lat`` per send on 1F1B's
  critical path.
* ``T_cc = T_fwd + f(T_bwd, T_dp; k_sync) + T_tp + T_pp``; with GA
  ``a T_fwd' + (a-1) T_bwd' + f(T_bwd', T_dp; k_sync)`` per micro-step; ZeRO
  reduce-scatters half the volume in the backward pass and all-gathers the other half
  after the step; under ZeRO-Offload the DP traffic joins the offload instead.
* ``T_opt = k_opt P / (t p)`` (3D), ``k_opt P (k_zero + (1 - k_zero) / d)`` (ZeRO-DP:
  ``k_zero`` the share of the step that does not shrink with the shard),
  ``k_opt_off P / (d c)`` (ZeRO-Offload, ``c`` CPUs); ``T_off = offload_bytes P /
  B_pcie`` on every rank; ``T_oo = f(T_dp, T_off; k_off) + f(T_opt, T_off; k_swap)``
  under offload, else ``T_opt``.
* ``f(x, y; k) = (x^k + y^k)^(1/k)``; ``T_iter = T_cc + T_oo + k_const``.

:func:`components` says why each term beyond the paper's is there. The seven
k-parameters, the terms some sample exercises and the effective bandwidths (as
fractions of the nominal :class:`Env`) are fitted by minimising the RMSLE of
``T_iter`` (plus, where a sample carries them, of the measured ``T_cc - T_fwd`` and
``T_oo`` parts) with scipy, from at least ``min_samples`` samples; a term no sample
exercises keeps the paper's equations (:data:`K_NEUTRAL`). Fitted parameters and
forward profiles are saved per architecture in the profile cache under
``cache_dir``, keyed by :data:`MODEL_VERSION`, and reused;
:meth:`MorphlingEstimator.observe` refits online when a measured iteration strays
more than ``refit_threshold`` from the prediction. Parameter units: seconds, and
parameter counts in billions (so every k is of order one).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from apportion.estimation.base import Estimate, ParamsMixin, Sample, Source
from apportion.estimation.models.morphling_claims import Claim, claim_for
from apportion.estimation.models.tables import Curve
from scipy.optimize import least_squares

from apportion.cluster import Cluster
from apportion.gpus import get_gpu
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, get_model
from apportion.plans import Cell, ExecutionPlan

log = logging.getLogger(__name__)

K_NAMES = ("k_bwd", "k_sync", "k_opt", "k_opt_off", "k_off", "k_swap", "k_const")
# terms beyond the paper's seven, each neutral at its default; a fit frees one only when its
# samples can tell it apart (see :func:`components` and ``_terms_exercised``)
K_TERMS = ("k_zero", "k_lat", "k_tp_lat", "k_pp_lat", "k_3d")
# (ZeRO-DP's unsharded optimizer share, one NVLink ring step (s), one TP collective (s), one
# pipeline send (s), 3D plans' forward against the profiled DP one)
# effective bandwidths as fractions of the nominal ones, and the offload form
K_EXTRAS = ("intra_scale", "inter_scale", "single_scale", "odd_scale", "tp_scale", "pcie_scale",
            "offload_additive")
K_INIT = {"k_bwd": 2.0, "k_sync": 2.0, "k_opt": 0.05, "k_opt_off": 2.0, "k_off": 2.0,
          "k_swap": 2.0, "k_const": 0.005, "k_zero": 0.5, "k_lat": 1e-5, "k_tp_lat": 1e-4,
          "k_pp_lat": 1e-3, "k_3d": 1.0}
# a term's value where no sample exercised it: the paper's equations (no latency, ZeRO's
# optimizer sharded whole)
K_NEUTRAL = {"k_zero": 0.0, "k_lat": 0.0, "k_tp_lat": 0.0, "k_pp_lat": 0.0, "k_3d": 1.0}
K_LOWER = {"k_bwd": 0.5, "k_sync": 1.0, "k_opt": 0.0, "k_opt_off": 0.0, "k_off": 1.0,
           "k_swap": 1.0, "k_const": 0.0, "k_zero": 0.0, "k_lat": 0.0, "k_tp_lat": 0.0,
           "k_pp_lat": 0.0, "k_3d": 0.2}
K_UPPER = {"k_bwd": 6.0, "k_sync": 50.0, "k_opt": 50.0, "k_opt_off": 500.0, "k_off": 50.0,
           "k_swap": 50.0, "k_const": 100.0, "k_zero": 1.0, "k_lat": 0.01, "k_tp_lat": 0.1,
           "k_pp_lat": 1.0, "k_3d": 5.0}
# bump when the model's equations change: fitted parameters cached under another version
# belong to other equations and are refitted, never reused
MODEL_VERSION = 3
GiB = 2**30


def overlap(x: float, y: float, k: float) -> float:
    """``(x^k + y^k)^(1/k)``: ``x + y`` at ``k = 1``, tending to ``max`` as ``k`` grows."""
    hi, lo = max(x, y), min(x, y)
    if hi <= 0:
        return 0.0
    return hi * (1.0 + (lo / hi) ** k) ** (1.0 / k)


@dataclass(frozen=True)
class Arch:
    """What the model needs of a network: parameters, ``s*h*l``, layers."""

    name: str
    params: float
    seq_hid: float  # s * h * l
    layers: int
    flops_per_sample: float = 0.0
    recompute_share: float = 1.0  # share of the forward FLOPs in checkpointed (block) layers

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> Arch:
        blocks = sum(1 for n in spec.layers if spec.graph.nodes[n].get("kind") in ("block", "conv"))
        blocks = max(1, blocks)
        return cls(spec.name, float(spec.params), float(spec.seq_len * spec.hidden * blocks),
                   blocks, spec.flops_per_sample, block_flops_share(spec))


def block_flops_share(spec: ModelSpec) -> float:
    """Share of a forward pass's FLOPs in the blocks, the layers gradient checkpointing
    recomputes (embedding and head are not): 0.87 for gpt-tiny, 0.95-0.99 at scale."""
    flops = spec.attr("flops")
    total = sum(flops)
    if total <= 0:
        return 1.0
    blocks = sum(f for n, f in zip(spec.layers, flops)
                 if spec.graph.nodes[n].get("kind") in ("block", "conv"))
    return blocks / total if blocks > 0 else 1.0


@dataclass(frozen=True)
class Env:
    """Environment constants (GB/s), measured offline on the cluster.

    ``inter_GBps`` is one node's network bandwidth with all of its ``nics_per_node``
    network adapters in use; the GPUs of a node share the adapters evenly
    (``gpus_per_node / nics_per_node`` GPUs per adapter), so a node holding ``g`` of a
    job's GPUs drives ``ceil(g * nics / gpus_per_node)`` of them (see
    :func:`rails_fraction`). One adapter per node (the default) is the paper's
    bottleneck bandwidth unchanged.
    """

    intra_GBps: float = 200.0
    inter_GBps: float = 12.5
    pcie_GBps: float = 25.0
    nics_per_node: int = 1
    gpus_per_node: int = 8


@dataclass(frozen=True)
class MorphlingSample(Sample):
    """A :class:`Sample` plus what Morphling's profiler logs: CPUs and the parts."""

    cpus: int = 1
    fwd_s: float | None = None
    cc_s: float | None = None  # measured T_cc - T_fwd (backward plus overlapped sync)
    oo_s: float | None = None  # measured T_oo (optimizer, with offload overlap)
    arch: Arch | None = None
    nodes: tuple[int, ...] | None = None  # GPUs per node, when no cluster names them


def nodes_of(placement: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(int(k) for k in placement.values() if int(k) > 0)


def rank_nodes(nodes: Sequence[int]) -> list[int]:
    """Node index of every rank when ranks fill nodes in order."""
    out: list[int] = []
    for i, k in enumerate(nodes):
        out.extend([i] * int(k))
    return out


def group_spans(plan: ExecutionPlan, nodes: Sequence[int]) -> dict[str, bool]:
    """Whether the TP, DP and PP groups of a Megatron rank layout cross nodes."""
    d, t, p = plan.dp, plan.tp, plan.pp
    where = rank_nodes(nodes)
    g = d * t * p
    if len(where) < g:
        where = where + [where[-1] if where else 0] * (g - len(where))

    def rank(pi: int, di: int, ti: int) -> int:
        return pi * d * t + di * t + ti

    tp_x = any(len({where[rank(pi, di, ti)] for ti in range(t)}) > 1
               for pi in range(p) for di in range(d))
    dp_x = any(len({where[rank(pi, di, ti)] for di in range(d)}) > 1
               for pi in range(p) for ti in range(t))
    pp_x = any(len({where[rank(pi, di, ti)] for pi in range(p)}) > 1
               for di in range(d) for ti in range(t))
    return {"tp": tp_x, "dp": dp_x, "pp": pp_x}


def dp_rings_per_node(plan: ExecutionPlan, nodes: Sequence[int]) -> int:
    """How many DP groups that cross nodes one node hosts (the most of any node): they
    all-reduce at once through the node's adapters. One for plain DP; eight for DP across
    nodes of eight GPUs that each hold one TP-8 replica."""
    d, t, p = plan.dp, plan.tp, plan.pp
    where = rank_nodes(nodes)
    if d <= 1 or len(where) < d * t * p:
        return 1
    groups: dict[tuple[int, int], set[int]] = {}
    for pi in range(p):
        for ti in range(t):
            groups[(pi, ti)] = {where[pi * d * t + di * t + ti] for di in range(d)}
    crossing = [nodes_ for nodes_ in groups.values() if len(nodes_) > 1]
    per_node: dict[int, int] = {}
    for nodes_ in crossing:
        for n in nodes_:
            per_node[n] = per_node.get(n, 0) + 1
    return max(per_node.values(), default=1)


def rails_fraction(nodes: Sequence[int], env: Env) -> float:
    """Share of a node's network bandwidth a collective across ``nodes`` gets: the node
    holding the fewest of the job's GPUs drives the fewest adapters, and a ring runs at
    its pace. On Morphling's A800 testbed (four adapters for eight GPUs) BERT's DP step
    spends 52 ms in the network on ``44`` and 97-118 ms on ``26``, ``2222`` or
    ``11111111``; GPT-2's 0.20 and 0.46-0.53 s: two adapters against one."""
    nics = max(1, env.nics_per_node)
    if nics == 1 or not nodes:
        return 1.0
    per_nic = max(1, env.gpus_per_node // nics)
    used = min(min(nics, -(-int(g) // per_nic)) for g in nodes if g > 0)
    return used / nics


# link classes across nodes with their own fitted bandwidth (as fractions of the rails'):
# class -> the scale's name in ``k``
CLASS_SCALES = {"inter-single": "single_scale", "inter-odd": "odd_scale"}


def link_class(nodes: Sequence[int], env: Env) -> str:
    """``intra`` (one node), ``inter``, ``inter-single`` or ``inter-odd``, where the GPUs of a
    node share its network adapters in groups (two GPUs per adapter on Morphling's A800
    testbed):

    * ``inter``: every node holds whole groups (two, four, six GPUs);
    * ``inter-single``: every node holds one GPU;
    * ``inter-odd``: some node holds a part of a group and the placement is not all single
      GPUs (``35``, ``233``, ``13``, ``11222``, ``1111112``).

    Each non-``inter`` class has its own fitted bandwidth (:data:`CLASS_SCALES`) for the
    GPUs' own collectives (not ZeRO-Offload's, which the traces never show slowed). On the
    testbed ViT's DP step takes 0.066-0.083 s on ``44``, ``26``, ``2222``, 0.12-0.23 s on
    ``11``, ``1111``, ``11111111`` and 0.27-0.45 s on ``13``, ``35``, ``17``, ``11222``; T5's
    0.67-0.71 s, 0.78-0.92 s and 0.77-0.90 s; BERT's, RoBERTa's and GPT-2's run as fast as
    their adapters allow in every class.
    """
    counts = [int(g) for g in nodes if g > 0]
    if len(counts) <= 1:
        return "intra"
    per_nic = max(1, env.gpus_per_node // max(1, env.nics_per_node))
    if env.nics_per_node <= 1 or per_nic <= 1 or not any(g % per_nic for g in counts):
        return "inter"
    if all(g == 1 for g in counts):
        return "inter-single"
    return "inter-odd"


def _split(fwd: Any, samples: float) -> tuple[float, float]:
    """``(fixed, per-sample part)`` of the forward seconds of ``samples`` samples: profiles
    that split them (:class:`AffineForward`) give both; any other curve is all per-sample."""
    fixed = getattr(fwd, "fixed", None)
    per = getattr(fwd, "per_sample", None)
    if fixed is not None and per is not None:
        return float(fixed), float(per) * samples
    return 0.0, float(fwd(samples))


def _shard(fwd: Any, samples: float, t: int, k3d: float = 1.0) -> float:
    """Forward seconds of ``samples`` on a ``1/t`` tensor shard: the fixed part of a profile
    that splits it off (:class:`AffineForward`) stays whole, the per-sample part is divided
    by ``t`` and scaled by ``k3d``."""
    fixed, per = _split(fwd, samples)
    return fixed + k3d * per / t


def forward_scale(plan: ExecutionPlan, batch: float, fwd: Any, k3d: float = 1.0
                  ) -> tuple[float, float]:
    """``(T_fwd, T_fwd per accumulation micro-step)`` from the forward profile ``fwd``.

    ``fwd(samples)`` is the forward time of the whole model over ``samples``
    samples on one GPU. Under pipeline parallelism ``(m + p - 1)`` slots of one
    stage's micro-batch (the paper's ``t_p g_p / p (m + p - 1)``), each slot paying the
    profile's fixed part whole: it is the latency of one forward call (launches, the
    framework's per-call work), which every stage's process pays on its own, as a TP shard
    does (T5's 3D times grow 45 ms per stage at every TP width, three times its 15.7 ms
    fixed forward part); under gradient accumulation ``a`` forwards of the micro-batch.
    ``k3d`` scales the per-sample part only (3D plans' kernels against the profiled DP
    ones).
    """
    d, t, p = plan.dp, plan.tp, plan.pp
    per_replica = batch / d
    if p > 1:
        m = max(plan.micro_batches, 1)
        fixed, per = _split(fwd, per_replica / m)
        total = (fixed + k3d * per / (t * p)) * (m + p - 1)
        return total, total
    a = max(plan.accumulation, 1)
    micro = _shard(fwd, per_replica / a, t, k3d)
    return micro * a, micro


def components(k: Mapping[str, float], arch: Arch, batch: float, plan: ExecutionPlan,
               nodes: Sequence[int], cpus: int, env: Env, fwd: Any, grad_bytes: float = 2.0,
               act_bytes: float = 2.0, offload_bytes: float = 4.0,
               offload_form: str | None = None, dp_bucket_bytes: float = 25 * 2**20,
               zero_bucket_bytes: float = 1e9) -> dict[str, float]:
    """Every part of appendix A for one configuration (seconds).

    Beyond the paper's equations, each neutral where its parameter is absent
    (:data:`K_NEUTRAL`), each there because the artifact's traces show it:

    * communication per collective and link, ``T = calls x steps x latency + V / B``:
      PyTorch DDP all-reduces in 25 MiB buckets and DeepSpeed's ZeRO in 1 GB ones, each a
      ring of ``2 (d - 1)`` steps costing ``k_lat`` on NVLink (T5's DDP step moves its 2.4
      GB in 96 rings and loses to ZeRO's 3 by 79 ms on 8 GPUs). Across nodes the ring runs
      at the pace of the node driving the fewest network adapters
      (:func:`rails_fraction`), shared by the DP groups one node hosts
      (:func:`dp_rings_per_node`: LLaMA's TP-8 replicas all-reduce eight at a time per
      node), at ``odd_scale`` of that when a node splits a GPU pair (:func:`link_class`).
      Each TP collective on the critical path costs ``k_tp_lat`` (``4`` per layer per
      micro-batch pass) and each pipeline send ``k_pp_lat`` (``2 (m + p - 1)`` on 1F1B's
      critical path).
    * 3D plans' forward runs at ``k_3d`` times the profiled DP forward's per-sample part
      (each pipeline stage paying the fixed part: :func:`forward_scale`): the artifact's
      TP/PP runs use another framework's kernels (T5 on one GPU of a 4-stage pipeline
      takes 2.7 s, on one GPU under DP 1.1 s; GPT-2's take 3.1 and 3.6 s), which is why
      the paper feeds each 3D prediction its own measured forward time.
    * ZeRO-DP's optimizer keeps a share ``k_zero`` of DP's step unsharded: ViT and BERT
      run ZeRO-DP as fast as DP on 1-8 GPUs (0.052 against 0.049 s on 8), T5 and GPT-2
      gain from the shard (0.241 against 0.320 s).
    * ZeRO-Offload's transfer ``T_off = offload_bytes x P / B_pcie`` on every rank (the
      paper divides by ``d``): measured offload steps keep a floor proportional to the
      whole model on every GPU count (0.23-0.29 s per 1e9 parameters for ViT, BERT and
      GPT-2 on 1-8 GPUs, on one node or eight), the rest falling as ``1 / (d c)``.

    ``offload_form`` chooses how ZeRO-Offload's parts combine: ``"overlap"`` is
    the paper's text, ``f(T_dp, T_off; k_off) + f(T_opt, T_off; k_swap)``;
    ``"additive"`` reads ``k_off`` and ``k_swap`` as fixed latencies (seconds)
    added to the synchronisation and to the CPU optimizer step,
    ``(T_dp + k_off + T_off) + (T_opt + k_swap + T_off)`` (the artifact's fitting
    code). Without an explicit form, ``k["offload_additive"] > 0.5`` selects it.

    ``k`` may also carry the effective bandwidths as fractions of ``env``'s nominal
    ones (``intra_scale``, ``inter_scale``, ``odd_scale``, ``tp_scale``,
    ``pcie_scale``), fitted when no measured bandwidths exist (see
    :class:`MorphlingEstimator` ``fit_env``).
    """
    if offload_form is None:
        offload_form = "additive" if k.get("offload_additive", 0.0) > 0.5 else "overlap"
    t, p = plan.tp, plan.pp
    P = arch.params
    Pg = P / 1e9
    spans, bandwidths = _link_bandwidths(k, plan, nodes, env)
    # 3D plans: another framework's kernels than the profiled DP forward (per-sample part)
    t_fwd, _ = forward_scale(plan, batch, fwd,
                             k.get("k_3d", 1.0) if t > 1 or p > 1 else 1.0)
    a = max(plan.accumulation, 1) if p == 1 else 1
    m = max(plan.micro_batches, 1) if p > 1 else 1
    # recomputation repeats the checkpointed layers' forward, not the embedding or the head
    t_bwd = k["k_bwd"] * t_fwd + (arch.recompute_share * t_fwd if plan.checkpointing else 0.0)
    t_dp, t_tp, t_pp = _comm_times(k, arch, batch, plan, spans, bandwidths, a, m, grad_bytes,
                                   act_bytes, dp_bucket_bytes, zero_bucket_bytes)
    if plan.offload:
        t_cc = t_fwd + t_bwd + t_tp + t_pp
        t_opt, t_off, t_oo = _offload_step(k, plan, P, Pg, cpus, env, t_dp, offload_bytes,
                                           offload_form)
    else:
        t_off = 0.0
        t_cc, t_opt, t_oo = _gpu_step(k, plan, Pg, a, t_fwd, t_bwd, t_dp, t_tp, t_pp)
    t_iter = t_cc + t_oo + k["k_const"]
    return {"T_fwd": t_fwd, "T_bwd": t_bwd, "T_comm_dp": t_dp,
            "T_comm_tp": t_tp, "T_comm_pp": t_pp, "T_cc": t_cc, "T_opt": t_opt,
            "T_off": t_off, "T_oo": t_oo, "T_iter": t_iter, "cc_part": t_cc - t_fwd}


def _link_bandwidths(k: Mapping[str, float], plan: ExecutionPlan, nodes: Sequence[int],
                     env: Env) -> tuple[dict[str, bool], tuple[float, float, float]]:
    """Which of the plan's groups span nodes, and the TP, DP and PP collectives' bandwidths
    (bytes/s): NVLink within a node, across nodes the ring's pace (:func:`components`)."""
    intra = env.intra_GBps * k.get("intra_scale", 1.0)
    inter = env.inter_GBps * k.get("inter_scale", 1.0)
    spans = group_spans(plan, nodes)
    cls = link_class(nodes, env)
    net = inter * rails_fraction(nodes, env)
    if cls in CLASS_SCALES and not plan.offload:  # the GPUs' own collectives in the class
        net *= k.get(CLASS_SCALES[cls], 1.0)
    one_nic = inter / max(1, env.nics_per_node)
    b_tp = (one_nic if spans["tp"] else intra) * k.get("tp_scale", 1.0) * 1e9
    b_dp = (net / dp_rings_per_node(plan, nodes) if spans["dp"] else intra) * 1e9
    b_pp = (one_nic if spans["pp"] else intra) * 1e9
    return spans, (b_tp, b_dp, b_pp)


def _comm_times(k: Mapping[str, float], arch: Arch, batch: float, plan: ExecutionPlan,
                spans: Mapping[str, bool], bandwidths: tuple[float, float, float], a: int,
                m: int, grad_bytes: float, act_bytes: float, dp_bucket_bytes: float,
                zero_bucket_bytes: float) -> tuple[float, float, float]:
    """The DP, TP and PP communication times of one iteration, ``V / B`` plus each
    collective's latency (:func:`components`)."""
    b_tp, b_dp, b_pp = bandwidths
    d, t, p = plan.dp, plan.tp, plan.pp
    P = arch.params
    v_dp = grad_bytes * P * 2 * (d - 1) / (d * t * p) if d > 1 else 0.0
    sh = arch.seq_hid / max(arch.layers, 1)
    v_tp = 4 * 2 * (t - 1) * batch * arch.seq_hid * act_bytes / (d * t) if t > 1 else 0.0
    v_pp = 2 * p * batch * sh * act_bytes / d if p > 1 else 0.0
    # one ring collective per gradient bucket, 2 (d - 1) steps each
    bucket = zero_bucket_bytes if plan.zero_stage >= 1 else dp_bucket_bytes
    calls = math.ceil(grad_bytes * P / (t * p) / bucket) if d > 1 else 0
    t_dp = v_dp / b_dp + (calls * 2 * (d - 1) * k.get("k_lat", 0.0) if not spans["dp"] else 0.0)
    t_tp = (v_tp / b_tp + 4 * arch.layers * (m + p - 1) / p * a * k.get("k_tp_lat", 0.0)
            if t > 1 else 0.0)
    t_pp = v_pp / b_pp + 2 * (m + p - 1) * k.get("k_pp_lat", 0.0) if p > 1 else 0.0
    return t_dp, t_tp, t_pp


def _offload_step(k: Mapping[str, float], plan: ExecutionPlan, P: float, Pg: float, cpus: int,
                  env: Env, t_dp: float, offload_bytes: float,
                  offload_form: str) -> tuple[float, float, float]:
    """ZeRO-Offload's CPU optimizer step, its PCIe transfer and how they combine with the
    synchronisation (``offload_form``: :func:`components`): ``(T_opt, T_off, T_oo)``."""
    d = plan.dp
    t_opt = k["k_opt_off"] * Pg / (d * max(cpus, 1))
    t_off = offload_bytes * P / (env.pcie_GBps * k.get("pcie_scale", 1.0) * 1e9)
    if offload_form == "additive":
        t_oo = (t_dp + k["k_off"] + t_off) + (t_opt + k["k_swap"] + t_off)
    else:
        t_oo = overlap(t_dp, t_off, k["k_off"]) + overlap(t_opt, t_off, k["k_swap"])
    return t_opt, t_off, t_oo


def _gpu_step(k: Mapping[str, float], plan: ExecutionPlan, Pg: float, a: int, t_fwd: float,
              t_bwd: float, t_dp: float, t_tp: float, t_pp: float) -> tuple[float, float, float]:
    """Without offload: the compute-and-communicate part (the backward overlapping the
    gradients' synchronisation), the optimizer step on the GPUs and what follows it:
    ``(T_cc, T_opt, T_oo)``."""
    d, t, p = plan.dp, plan.tp, plan.pp
    zero2 = plan.zero_stage >= 2
    t_bwd_micro = t_bwd / a
    # ZeRO-DP moves the same volume as DP's all-reduce, but in two halves: gradients
    # reduce-scattered during the backward pass, updated parameter shards all-gathered
    # after the optimizer step, where nothing overlaps them (the artifact's ZeRO rows log
    # 2-4x DP's optimizer time across nodes; torch's ZeroRedundancyOptimizer likewise)
    # (stage 1 -- torch's ZeroRedundancyOptimizer -- all-reduces whole gradients first)
    zero = plan.zero_stage >= 1 and d > 1
    t_sync = t_dp / 2 if zero and zero2 else t_dp
    if a > 1:
        t_cc = t_fwd + (a - 1) * t_bwd_micro + overlap(t_bwd_micro, t_sync, k["k_sync"])
    else:
        t_cc = t_fwd + overlap(t_bwd, t_sync, k["k_sync"])
    t_cc += t_tp + t_pp
    if plan.zero_stage >= 1:
        # the share k_zero of the step does not shrink with the shard
        share = k.get("k_zero", K_NEUTRAL["k_zero"])
        t_opt = k["k_opt"] * Pg * (share + (1.0 - share) / d)
    else:
        t_opt = k["k_opt"] * Pg / (t * p)
    t_oo = t_opt + (t_dp / 2 if zero else 0.0)
    return t_cc, t_opt, t_oo


@dataclass(frozen=True)
class AffineForward:
    """Forward seconds of ``n`` samples on one GPU: ``fixed + per_sample * n``.

    The fixed part is the latency-bound share of a forward pass (kernel launches, small
    layers), which neither a smaller batch nor a tensor shard shortens: BERT's profile
    gives 40, 65, 116 and 227 ms for 4, 8, 16 and 32 samples (13 ms + 6.7 ms per
    sample), ViT's 5 to 40 ms for 8 to 64 (none). A straight line through the
    profile also extrapolates where a piecewise interpolation would copy one stray
    point (T5's 4-GPU forward logged once at 4 ms, once at 91 ms).
    """

    fixed: float
    per_sample: float

    def __call__(self, samples: float) -> float:
        return self.fixed + self.per_sample * samples

    def shard(self, samples: float, t: int) -> float:
        return self.fixed + self.per_sample * samples / t


# the median log residual of the proportional line under which a forward profile has no
# fixed part (3 %: the profiles' timings are whole milliseconds of 5-400 ms passes)
PROPORTIONAL_TOLERANCE = 0.03


def fit_forward(points: Iterable[tuple[float, float]]) -> AffineForward:
    """:class:`AffineForward` through ``(samples, seconds)`` points, robust to stray ones:
    least squares on log times with a soft-L1 loss (scipy), both parts non-negative. With
    fewer than three batch sizes, or where the proportional line through the points'
    median time per sample misses them by a median of at most
    :data:`PROPORTIONAL_TOLERANCE`, the forward is proportional to the batch (the paper's
    linear scaling): a fixed part from noise alone would be paid again by every pipeline
    stage."""
    pts = [(float(x), float(y)) for x, y in points if x > 0 and y > 0]
    if not pts:
        raise ValueError("a forward profile needs at least one positive point")
    xs = np.array([x for x, _ in pts])
    ys = np.array([y for _, y in pts])
    slope0 = float(np.median(ys / xs))
    if len(set(xs.tolist())) < 3:  # two sizes fix a line but cannot check it: proportional
        return AffineForward(0.0, slope0)
    if float(np.median(np.abs(np.log(slope0 * xs / ys)))) <= PROPORTIONAL_TOLERANCE:
        # the proportional line already fits within the timing's resolution: a fixed part
        # would be noise (LLaMA-7B's 1, 2, 4 samples give 9.5 ms out of 381), and each
        # pipeline stage would pay it
        return AffineForward(0.0, slope0)

    def resid(v: np.ndarray) -> np.ndarray:
        return np.log(v[0] + v[1] * xs) - np.log(ys)

    lo = np.array([0.0, slope0 * 1e-3])
    hi = np.array([float(ys.max()), slope0 * 10])
    x0 = np.array([0.0, slope0])
    res = least_squares(resid, np.clip(x0, lo + 1e-12, hi - 1e-12), bounds=(lo, hi),
                        loss="soft_l1", f_scale=0.1, method="trf")
    return AffineForward(float(res.x[0]), float(res.x[1]))


class FlopsForward:
    """Forward time from FLOPs when nothing was profiled: ``F * n / (eff * peak)``."""

    def __init__(self, arch: Arch, gpu_type: str, efficiency: float) -> None:
        gpu = get_gpu(gpu_type)
        self.rate = gpu.peak_flops("half") * efficiency
        self.flops = arch.flops_per_sample

    def __call__(self, samples: float) -> float:
        return self.flops * samples / self.rate


class MorphlingEstimator(ParamsMixin):
    """Appendix-A model with fitted k-parameters; see the module docstring.

    ``fit_env``: the paper measures ``B_intra``/``B_inter`` offline; where no
    measured values are given, the effective bandwidths are fitted with the
    k-parameters as log-scaled fractions of the nominal :class:`Env` (pulled
    weakly towards 1): ``intra_scale`` always, ``inter_scale`` when a sample
    spans nodes, ``tp_scale`` (TP's small collectives) when a sample uses TP.
    On the artifact's ViT profile the fitted intra-node bandwidth is 27 GB/s
    against the nominal 200; the artifact's own scripts use 34.
    ``offload_form``: ``"overlap"``, ``"additive"`` or ``"auto"`` (both tried
    when offload samples exist, the lower training RMSLE kept); see
    :func:`components`.
    """

    def __init__(self, env: Env | None = None, min_samples: int = 7,
                 refit_threshold: float = 0.1, cache_dir: str | None = None,
                 efficiency: float = 0.45, prior_weight: float = 0.02,
                 grad_bytes: float = 2.0, act_bytes: float = 2.0, max_micro_batches: int = 64,
                 fit_env: bool = True, offload_form: str = "auto",
                 terms: tuple[str, ...] = K_TERMS, heldout_folds: int = 5) -> None:
        if offload_form not in ("auto", "overlap", "additive"):
            raise ValueError(f"offload_form must be auto, overlap or additive, not {offload_form!r}")
        self.env = env
        self.min_samples = min_samples
        self.refit_threshold = refit_threshold
        self.cache_dir = cache_dir
        self.efficiency = efficiency
        self.prior_weight = prior_weight
        self.grad_bytes = grad_bytes
        self.act_bytes = act_bytes
        self.max_micro_batches = max_micro_batches
        self.fit_env = fit_env
        self.offload_form = offload_form
        unknown = set(terms) - set(K_TERMS)
        if unknown:
            raise ValueError(f"unknown terms {sorted(unknown)}; known: {', '.join(K_TERMS)}")
        # the terms beyond the paper's seven a fit may free (the others keep K_NEUTRAL)
        self.terms = tuple(terms)
        # folds of the held-out error each fit reports (heldout_error_); 0: none
        self.heldout_folds = heldout_folds


    # -- helpers ---------------------------------------------------------------------
    def _env(self) -> Env:
        return self.env or Env()

    def k_for(self, arch_name: str) -> dict[str, float]:
        ks = getattr(self, "k_", {})
        if arch_name in ks:
            return dict(ks[arch_name])
        cached = self._load_cached(arch_name)
        if cached is not None:
            self.k_ = {**ks, arch_name: cached}
            return dict(cached)
        # unfitted: the paper's seven at their starting values, the other terms neutral
        return {**{n: K_INIT[n] for n in K_NAMES}, **K_NEUTRAL}

    def _forward(self, arch: Arch, gpu_type: str | None) -> Any:
        tables = getattr(self, "forward_", {})
        key = f"{arch.name}|{gpu_type}"
        if key in tables:
            return tables[key]
        any_key = next((k for k in tables if k.startswith(f"{arch.name}|")), None)
        if any_key is not None and gpu_type is None:
            return tables[any_key]
        if gpu_type is None:
            raise ValueError(f"no forward profile for {arch.name} and no GPU type to derive one")
        return FlopsForward(arch, gpu_type, self.efficiency / self._measured_ratio(arch))

    def _measured_ratio(self, arch: Arch, samples: float = 8.0) -> float:
        """How much slower than FLOPs at ``efficiency`` the architecture's measured forward
        profiles run (median over the GPU types measured; 1 without one): a type nobody
        measured keeps its catalog ratio to the measured ones instead of looking faster by
        what the measurement found."""
        ratios = []
        for key, curve in getattr(self, "forward_", {}).items():
            name, _, gpu = key.partition("|")
            if name != arch.name:
                continue
            try:
                ref = FlopsForward(arch, gpu, self.efficiency)(samples)
            except (KeyError, ValueError):  # a stand-in device the catalog does not know
                continue
            if ref > 0:
                ratios.append(float(curve(samples)) / ref)
        return float(np.median(ratios)) if ratios else 1.0

    def set_forward_profile(self, arch_name: str, gpu_type: str | None,
                            curve: Curve | AffineForward) -> None:
        """Install a profiled forward curve (seconds against samples per GPU)."""
        tables = dict(getattr(self, "forward_", {}))
        tables[f"{arch_name}|{gpu_type}"] = curve
        self.forward_ = tables

    # -- fitting -----------------------------------------------------------------------
    def fit(self, samples: Iterable[Sample], cluster: Cluster | None = None
            ) -> MorphlingEstimator:
        """Fit the seven k-parameters per architecture by RMSLE (scipy least squares), and
        report each architecture's held-out error (``heldout_error_``: the mean relative
        error of every sample predicted by a fit on the other folds' samples, where those
        still number ``min_samples``), which ``--estimator auto`` compares.

        Safe on any mix of samples, as the online refit passes every sample so far: an
        architecture with fewer than ``min_samples`` keeps what it had (an earlier fit, a
        cached one, or the priors) and is listed in ``unfitted_``; a sample of a model the
        catalog cannot build, or without a positive time, is skipped. ``cluster``: where
        the samples ran; a sample placed on its nodes is fitted against their bandwidths
        (the ones :meth:`predict` uses), any other against ``env``."""
        by_arch: dict[str, list[tuple[Arch, Sample]]] = {}
        for s in samples:
            if not s.iter_time_s > 0:
                continue
            arch = getattr(s, "arch", None)
            if arch is None:
                try:
                    arch = Arch.from_spec(get_model(s.job.model))
                except (KeyError, ValueError) as exc:  # CatalogError is a KeyError
                    log.info("morphling: no architecture for %s, sample skipped (%s)",
                             s.job.model, exc)
                    continue
            by_arch.setdefault(arch.name, []).append((arch, s))
        fitted = dict(getattr(self, "k_", {}))
        history: dict[str, list[Sample]] = dict(getattr(self, "samples_", {}))
        fit_err: dict[str, float] = dict(getattr(self, "fit_rmsle_", {}))
        heldout: dict[str, float] = dict(getattr(self, "heldout_error_", {}))
        unfitted: dict[str, int] = {}
        done: list[str] = []
        self._fit_cluster = cluster
        try:
            for name, rows in by_arch.items():
                history[name] = [s for _, s in rows]
                if len(rows) < self.min_samples:
                    unfitted[name] = len(rows)  # keeps its prior: Morphling fits 7 parameters
                    continue
                self._install_forward(rows)
                k, err = self._fit_one(rows)
                fitted[name] = k
                fit_err[name] = err
                h = self._heldout(rows)
                if h is not None:
                    heldout[name] = h
                else:
                    heldout.pop(name, None)
                done.append(name)
        finally:  # where this fit's samples ran is no parameter and nothing learned
            self.__dict__.pop("_fit_cluster", None)
        if unfitted:
            log.info("morphling: %s keep their priors (fewer than %d samples)",
                     ", ".join(f"{n} ({c})" for n, c in sorted(unfitted.items())),
                     self.min_samples)
        self.k_ = fitted
        self.samples_ = history
        self.fit_samples_ = {**getattr(self, "fit_samples_", {}),
                             **{name: len(history[name]) for name in done}}
        self.fit_rmsle_ = fit_err
        self.heldout_error_ = heldout
        self.unfitted_ = unfitted
        for name in done:
            self._save_cached(name, fitted[name])
        return self

    def _sample_env(self, s: Sample) -> Env:
        """The environment a sample ran in: its placement's nodes on the cluster being
        fitted (as :meth:`predict` reads them), else ``env``."""
        cluster = getattr(self, "_fit_cluster", None)
        if cluster is None or not s.placement:
            return self._env()
        return self._env_for(s.placement, cluster)

    def _heldout(self, rows: list[tuple[Arch, Sample]]) -> float | None:
        """Mean relative error of ``rows`` predicted by fits on the other folds (every
        ``heldout_folds``-th sample held out together); None where no fold leaves
        ``min_samples`` to fit."""
        k = min(self.heldout_folds, len(rows))
        if k < 2:
            return None
        errs: list[float] = []
        cluster = getattr(self, "_fit_cluster", None)
        for f in range(k):
            train = [s for i, (_, s) in enumerate(rows) if i % k != f]
            if len(train) < self.min_samples:
                continue
            sub = type(self)(**{**self.get_params(), "cache_dir": None, "heldout_folds": 0})
            sub.forward_ = {key: c for key, c in getattr(self, "forward_", {}).items()
                            if not isinstance(c, AffineForward)}  # a profiler's curves only
            sub.fit(train, cluster)
            for arch, s in rows[f::k]:
                nodes, cpus = self._row(arch, s)
                pred = sub.predict_config(arch, s.job.global_batch_size, s.plan, nodes, cpus,
                                          s.gpu_type, self._sample_env(s))["T_iter"]
                errs.append(abs(pred - s.iter_time_s) / s.iter_time_s)
        return float(np.mean(errs)) if errs else None

    def _install_forward(self, rows: list[tuple[Arch, Sample]]) -> None:
        """Forward curves from samples that carry a measured forward time."""
        pts: dict[str, list[tuple[float, float]]] = {}
        for arch, s in rows:
            fwd = getattr(s, "fwd_s", None)
            # the curve is the whole model's forward on one device: a pipeline stage's or a
            # TP shard's forward is not (TP shards run narrower, less efficient matmuls)
            if fwd is None or fwd <= 0 or s.plan.pp > 1 or s.plan.tp > 1:
                continue
            per_gpu = s.job.global_batch_size / s.plan.dp
            pts.setdefault(f"{arch.name}|{s.gpu_type}", []).append((per_gpu, fwd))
        if pts:
            tables = dict(getattr(self, "forward_", {}))
            for key, p in pts.items():
                tables[key] = fit_forward(p)
            self.forward_ = tables

    def _row(self, arch: Arch, s: Sample) -> tuple[tuple[int, ...], int]:
        nodes = getattr(s, "nodes", None) or nodes_of(s.placement) or (s.plan.gpus,)
        return tuple(nodes), int(getattr(s, "cpus", 1) or 1)

    def _fit_one(self, rows: list[tuple[Arch, Sample]]) -> tuple[dict[str, float], float]:
        """Best fit over the offload forms allowed (``offload_form="auto"`` tries both when
        offload samples exist and keeps the lower training RMSLE)."""
        has_off = any(s.plan.offload for _, s in rows)
        forms = (["overlap", "additive"] if self.offload_form == "auto" and has_off
                 else ["additive" if self.offload_form == "additive" else "overlap"])
        best: tuple[dict[str, float], float] | None = None
        for form in forms:
            k, err = self._fit_form(rows, form)
            if best is None or err < best[1] - 1e-9:
                best = (k, err)
        assert best is not None
        return best

    def _terms_exercised(self, prepared: list[tuple[Arch, Sample, tuple[int, ...], int, Any]],
                         env: Env, envs: Mapping[int, Env] | None = None) -> list[str]:
        """The parameters beyond the seven that some sample exercises: a term no sample
        exercises keeps its neutral default (no ZeRO run, no ZeRO partitioning phase)."""
        out: list[str] = []
        plans = [(s.plan, nodes) for _, s, nodes, _, _ in prepared]
        dp_x = [group_spans(pl, nodes)["dp"] for pl, nodes in plans]
        if any(pl.zero_stage >= 1 and not pl.offload and pl.dp > 1 for pl, _ in plans):
            out.append("k_zero")  # on one GPU the share has nothing to shard
        # latency and bandwidth part only through how a ring's time grows with its size
        if len({pl.dp for (pl, _), x in zip(plans, dp_x) if pl.dp > 1 and not x}) >= 3:
            out.append("k_lat")
        if any(pl.tp > 1 or pl.pp > 1 for pl, _ in plans):
            out.append("k_3d")
        if any(pl.tp > 1 for pl, _ in plans):
            out.append("k_tp_lat")
        if any(pl.pp > 1 for pl, _ in plans):
            out.append("k_pp_lat")
        if not self.fit_env:
            return out
        out.append("log_intra")
        if any(len(nodes) > 1 for _, nodes in plans):
            out.append("log_inter")
        classes = [link_class(nodes, (envs or {}).get(id(p[1]), env))
                   for p, (_, nodes) in zip(prepared, plans)]
        for cls, scale in CLASS_SCALES.items():  # the GPUs' own collectives in the class
            if any(x and not pl.offload and c == cls
                   for x, (pl, _), c in zip(dp_x, plans, classes)):
                out.append("log_" + scale.removesuffix("_scale"))
        if any(pl.tp > 1 for pl, _ in plans):
            out.append("log_tp")
        if any(pl.offload for pl, _ in plans):
            out.append("log_pcie")
        return out

    def _fit_form(self, rows: list[tuple[Arch, Sample]], form: str
                  ) -> tuple[dict[str, float], float]:
        env = self._env()
        prepared = []
        envs: dict[int, Env] = {}
        for arch, s in rows:
            nodes, cpus = self._row(arch, s)
            prepared.append((arch, s, nodes, cpus, self._forward(arch, s.gpu_type)))
            envs[id(s)] = self._sample_env(s)
        init = dict(K_INIT)
        lo_d, hi_d = dict(K_LOWER), dict(K_UPPER)
        if form == "additive":  # k_off, k_swap are latencies in seconds, not exponents
            init.update(k_off=0.01, k_swap=0.01)
            lo_d.update(k_off=0.0, k_swap=0.0)
        names = list(K_NAMES)
        names += [n for n in self._terms_exercised(prepared, env, envs)
                  if not n.startswith("k_") or n in self.terms]
        used = {"k_opt_off", "k_off", "k_swap"} if any(s.plan.offload for _, s in rows) else set()
        used |= {"k_bwd", "k_sync", "k_opt", "k_const"} | set(names[len(K_NAMES):])
        for n in names:
            if n.startswith("log_"):  # effective bandwidths: log fractions of the nominal ones
                slower_only = n in ("log_odd", "log_single")  # a class never beats the rails
                init[n], lo_d[n], hi_d[n] = 0.0, -6.0, (0.0 if slower_only else 1.0)
        lo = np.array([lo_d[n] for n in names])
        hi = np.array([hi_d[n] for n in names])

        def unpack(x: np.ndarray) -> dict[str, float]:
            k = {n: float(v) for n, v in zip(names, x)}
            for scale in ("intra", "inter", "single", "odd", "tp", "pcie"):
                k[f"{scale}_scale"] = math.exp(k.pop(f"log_{scale}", 0.0))
            for n in K_TERMS:
                k.setdefault(n, K_NEUTRAL[n])
            k["offload_additive"] = 1.0 if form == "additive" else 0.0
            return k

        def predict(k: dict[str, float], arch: Arch, s: Sample, nodes: tuple[int, ...],
                    cpus: int, fwd: Any) -> dict[str, float]:
            return components(k, arch, s.job.global_batch_size, s.plan, nodes, cpus,
                              envs.get(id(s), env), fwd, self.grad_bytes, self.act_bytes)

        def resid(x: np.ndarray) -> np.ndarray:
            k = unpack(x)
            r: list[float] = []
            for arch, s, nodes, cpus, fwd in prepared:
                c = predict(k, arch, s, nodes, cpus, fwd)
                r.append(math.log(max(c["T_iter"], 1e-12)) - math.log(s.iter_time_s))
                cc = getattr(s, "cc_s", None)
                if cc and not s.plan.offload and c["cc_part"] > 0:
                    r.append(math.log(c["cc_part"]) - math.log(cc))
                oo = getattr(s, "oo_s", None)
                if oo and not s.plan.offload and c["T_oo"] > 0:
                    r.append(math.log(c["T_oo"]) - math.log(oo))
            # weak pull towards the priors keeps parameters the data cannot see sane
            for n, v in zip(names, x):
                scale = self.prior_weight * (1.0 if n in used else 10.0)
                if n.startswith("log_"):
                    r.append(scale * v)
                else:
                    r.append(scale * (math.log1p(v) - math.log1p(init[n])))
            return np.array(r)

        k = unpack(_multi_start_fit(resid, names, np.array([init[n] for n in names]), lo, hi))
        errs = []
        for arch, s, nodes, cpus, fwd in prepared:
            c = predict(k, arch, s, nodes, cpus, fwd)
            errs.append((math.log(c["T_iter"]) - math.log(s.iter_time_s)) ** 2)
        return k, float(math.sqrt(sum(errs) / len(errs)))

    # -- online refit --------------------------------------------------------------------
    def observe(self, sample: Sample, cluster: Cluster | None = None) -> bool:
        """Record a measured iteration; refit when the error passes ``refit_threshold``.

        Returns True when a refit happened.
        """
        arch = getattr(sample, "arch", None) or Arch.from_spec(get_model(sample.job.model))
        nodes, cpus = self._row(arch, sample)
        pred = self.predict_config(arch, sample.job.global_batch_size, sample.plan, nodes, cpus,
                                   sample.gpu_type)["T_iter"]
        err = abs(pred - sample.iter_time_s) / sample.iter_time_s
        history = dict(getattr(self, "samples_", {}))
        history.setdefault(arch.name, []).append(sample)
        self.samples_ = history
        if err <= self.refit_threshold:
            return False
        rows = history[arch.name]
        if len(rows) < self.min_samples:
            return False
        log.info("refitting %s: error %.1f%% > %.1f%%", arch.name, 100 * err,
                 100 * self.refit_threshold)
        self.fit(rows)
        return True

    # -- persistence per architecture -----------------------------------------------------
    def _disk(self) -> Any:
        from apportion.estimation.cache import DiskCache

        return DiskCache(self.cache_dir) if self.cache_dir else None

    @staticmethod
    def _cache_key(arch_name: str) -> dict[str, Any]:
        """Fits are keyed by architecture and :data:`MODEL_VERSION`: parameters fitted to other
        equations are never read back."""
        return {"arch": arch_name, "version": MODEL_VERSION}

    def _save_cached(self, arch_name: str, k: Mapping[str, float]) -> None:
        """The fitted parameters, forward profiles and training RMSLE of one architecture,
        in the profile cache (``cache_dir``: ``$APPORTION_CACHE`` where the registry builds
        the estimator)."""
        disk = self._disk()
        if disk is None:
            return
        fwd = {key.split("|", 1)[1]: [c.fixed, c.per_sample]
               for key, c in getattr(self, "forward_", {}).items()
               if key.startswith(f"{arch_name}|") and isinstance(c, AffineForward)}
        disk.put("morphling-fit", self._cache_key(arch_name),
                 {"k": dict(k), "forward": fwd,
                  "rmsle": getattr(self, "fit_rmsle_", {}).get(arch_name),
                  "heldout_error": getattr(self, "heldout_error_", {}).get(arch_name),
                  "samples": len(getattr(self, "samples_", {}).get(arch_name, []))})

    def _load_cached(self, arch_name: str) -> dict[str, float] | None:
        """Cached parameters of ``arch_name`` (installing its forward profiles), or None."""
        disk = self._disk()
        if disk is None:
            return None
        hit = disk.get("morphling-fit", self._cache_key(arch_name))
        if not hit:
            return None
        k = {n: float(v) for n, v in hit["k"].items()}
        if any(n not in k for n in K_NAMES):
            return None
        tables = dict(getattr(self, "forward_", {}))
        for gpu, (fixed, per) in hit.get("forward", {}).items():
            tables.setdefault(f"{arch_name}|{gpu}", AffineForward(float(fixed), float(per)))
        self.forward_ = tables
        if hit.get("heldout_error") is not None:
            self.heldout_error_ = {**getattr(self, "heldout_error_", {}),
                                   arch_name: float(hit["heldout_error"])}
        if isinstance(hit.get("samples"), int):
            self.fit_samples_ = {**getattr(self, "fit_samples_", {}), arch_name: hit["samples"]}
        return k

    # -- prediction ---------------------------------------------------------------------
    def predict_config(self, arch: Arch, batch: float, plan: ExecutionPlan,
                       nodes: Sequence[int], cpus: int, gpu_type: str | None,
                       env: Env | None = None) -> dict[str, float]:
        """All parts of the model for one configuration (seconds)."""
        k = self.k_for(arch.name)
        return components(k, arch, batch, plan, nodes, cpus, env or self._env(),
                          self._forward(arch, gpu_type), self.grad_bytes, self.act_bytes)

    def _env_for(self, placement: Mapping[str, int], cluster: Cluster | None) -> Env:
        base = self._env()
        if self.env is not None or cluster is None:
            return base
        nodes = [cluster.nodes[n] for n in placement if n in cluster.nodes and placement[n] > 0]
        if not nodes:
            return base
        return Env(min(n.intra_bandwidth_GBps for n in nodes),
                   min(n.inter_bandwidth_GBps for n in nodes), base.pcie_GBps)

    def memory(self, model: ModelSpec, batch: float, plan: ExecutionPlan) -> float:
        """Peak bytes per GPU: 16 B/param (sharded by ZeRO/offload) plus activations."""
        d, t, p = plan.dp, plan.tp, plan.pp
        P = model.params / (t * p)
        opt = 0.0 if plan.offload else 12.0 / (d if plan.zero_stage >= 1 else 1)
        grads = 2.0 / (d if plan.zero_stage >= 2 else 1)
        acts = model.attr("act_bytes")
        outs = model.attr("out_bytes")
        act = (sum(outs) + max(acts)) if plan.checkpointing else sum(acts)
        micro = batch / d / (max(plan.micro_batches, 1) if p > 1 else max(plan.accumulation, 1))
        inflight = min(max(plan.micro_batches, 1), p) if p > 1 else 1
        return P * (2.0 + grads + opt) + act / (t * p) * micro * inflight + 1.5 * GiB

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        node = next(iter(placement), None)
        if node is None:
            raise ValueError("empty placement")
        gpu_type = cluster.nodes[node].gpu_type
        spec = get_model(job.model)
        arch = Arch.from_spec(spec)
        cpus = max(1, min(cluster.nodes[n].cpus for n in placement if n in cluster.nodes)
                   // max(1, max(placement.values())))
        parts = self.predict_config(arch, job.global_batch_size, plan, nodes_of(placement), cpus,
                                    gpu_type, self._env_for(placement, cluster))
        mem = self.memory(spec, job.global_batch_size, plan)
        gpu = get_gpu(gpu_type)
        feasible = mem <= gpu.memory_bytes * 0.95 and job.global_batch_size >= plan.dp
        claim = claim_for(plan, nodes_of(placement))
        bd = dict(parts)
        if not claim.claimed:  # read by ``auto``, which refuses the figure there
            bd["outside_claims"] = 1.0
            if claim.max_error is not None:
                bd["claim_max_error"] = float(claim.max_error)
        key = (arch.name, claim, arch.name in getattr(self, "k_", {}),
               getattr(self, "fit_samples_", {}).get(arch.name))
        memo = self.__dict__.setdefault("_source_memo", {})  # one per claim and fit state
        if key not in memo:
            memo[key] = self.source(arch.name, claim)
        return Estimate(parts["T_iter"], mem, feasible, plan, job.global_batch_size, bd,
                        memo[key])

    def source(self, arch_name: str, claim: Claim | None = None) -> Source:
        """``fitted`` (with the samples the fit saw) where the architecture's parameters were
        fitted (here or in the cache), else ``analytic`` (the paper's starting parameters);
        with the claim of the plan's family where one is given (see
        :mod:`~apportion.estimation.models.morphling_claims`)."""
        fitted = arch_name in getattr(self, "k_", {})
        n = getattr(self, "fit_samples_", {}).get(arch_name)
        if fitted:
            kind, detail = "fitted", (f"Morphling's appendix-A model fitted to {n} samples of "
                                      f"{arch_name}" if n else
                                      f"Morphling's appendix-A model fitted for {arch_name}")
        else:
            kind, detail = "analytic", ("Morphling's appendix-A equations at the paper's "
                                        f"starting parameters (no fit for {arch_name})")
        if claim is not None:
            detail += f"; {claim.describe()}" + ("" if claim.claimed else
                                                  ": outside the model's claims")
        return Source(kind, detail, estimator="morphling", samples=n if fitted else None)

    # -- plans, cells and sensitivity curves ----------------------------------------------
    def candidate_plans(self, gpus: int, max_tp: int, layers: int, batch: int
                        ) -> list[ExecutionPlan]:
        """Morphling's plan space on ``gpus`` GPUs: 3D splits, ZeRO-DP, ZeRO-Offload, GA, GC."""
        out: list[ExecutionPlan] = []
        tps = [t for t in (1, 2, 4, 8, 16) if t <= max_tp and gpus % t == 0]
        for t in tps:
            for p in (1, 2, 4, 8, 16):
                if gpus % (t * p) or p > layers:
                    continue
                d = gpus // (t * p)
                if d > batch:
                    continue
                m = min(self.max_micro_batches, max(1, batch // d)) if p > 1 else 1
                for gc in (False, True):
                    out.append(ExecutionPlan(dp=d, tp=t, pp=p, micro_batches=m, checkpointing=gc))
        if gpus <= batch:
            for gc in (False, True):
                out.append(ExecutionPlan(dp=gpus, zero_stage=2, checkpointing=gc))
                out.append(ExecutionPlan(dp=gpus, zero_stage=2, offload=True, checkpointing=gc))
            for a in (2, 4, 8):
                if batch % (gpus * a) == 0:
                    out.append(ExecutionPlan(dp=gpus, accumulation=a))
        return out

    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        """Best feasible plan with ``cell.gpus`` GPUs and ``cell.stages`` pipeline stages."""
        from apportion.estimation.models.analytic import nominal_placement

        placement = nominal_placement(cluster, cell.gpu_type, cell.gpus)
        if placement is None or cell.gpus % cell.stages:
            return None
        spec = get_model(job.model)
        best: Estimate | None = None
        for plan in self.candidate_plans(cell.gpus, cluster.max_gpus_per_node(cell.gpu_type),
                                         len(spec.layers), job.global_batch_size):
            if plan.pp != cell.stages:
                continue
            e = self.predict(job, plan, placement, cluster)
            if e.feasible and (best is None or e.iter_time_s < best.iter_time_s):
                best = e
        return best

    def sensitivity_curve(self, job: JobSpec, gpu_type: str, cluster: Cluster,
                          gpu_counts: Sequence[int] = (1, 2, 4, 8, 16, 32),
                          cpu_counts: Sequence[int] = (1, 2, 4, 8, 16)
                          ) -> dict[str, list[dict[str, Any]]]:
        """Best plan and throughput per GPU count and per CPU count (Morphling figure 6).

        Cached per (architecture, batch, GPU type, counts) in ``sensitivity_``
        and, with a ``cache_dir``, on disk.
        """
        from apportion.estimation.cache import DiskCache

        key = {"model": job.model, "batch": job.global_batch_size, "gpu": gpu_type,
               "gpus": list(gpu_counts), "cpus": list(cpu_counts),
               "k": self.k_for(Arch.from_spec(get_model(job.model)).name),
               "cluster": cluster.name}
        mem_cache = dict(getattr(self, "sensitivity_", {}))
        skey = json.dumps(key, sort_keys=True)
        if skey in mem_cache:
            return mem_cache[skey]
        disk = DiskCache(self.cache_dir) if self.cache_dir else None
        if disk is not None:
            hit = disk.get("sensitivity", key)
            if hit is not None:
                mem_cache[skey] = hit
                self.sensitivity_ = mem_cache
                return hit
        from apportion.estimation.models.analytic import nominal_placement

        spec = get_model(job.model)
        arch = Arch.from_spec(spec)
        max_tp = cluster.max_gpus_per_node(gpu_type)
        by_gpu: list[dict[str, Any]] = []
        for g in gpu_counts:
            placement = nominal_placement(cluster, gpu_type, g)
            best = None
            if placement is not None:
                for plan in self.candidate_plans(g, max_tp, len(spec.layers),
                                                 job.global_batch_size):
                    e = self.predict(job, plan, placement, cluster)
                    if e.feasible and (best is None or e.throughput > best.throughput):
                        best = e
            by_gpu.append({"gpus": g, "throughput": best.throughput if best else 0.0,
                           "plan": best.plan.label() if best else None})
        by_cpu: list[dict[str, Any]] = []
        placement1 = nominal_placement(cluster, gpu_type, 1)
        for c in cpu_counts:
            best_t, best_plan = 0.0, None
            if placement1 is not None:
                for plan in self.candidate_plans(1, 1, len(spec.layers), job.global_batch_size):
                    parts = self.predict_config(arch, job.global_batch_size, plan, (1,), c,
                                                gpu_type, self._env_for(placement1, cluster))
                    if self.memory(spec, job.global_batch_size, plan) > \
                            get_gpu(gpu_type).memory_bytes * 0.95:
                        continue
                    thr = job.global_batch_size / parts["T_iter"]
                    if thr > best_t:
                        best_t, best_plan = thr, plan.label()
            by_cpu.append({"cpus": c, "throughput": best_t, "plan": best_plan})
        out = {"gpus": by_gpu, "cpus": by_cpu}
        mem_cache[skey] = out
        self.sensitivity_ = mem_cache
        if disk is not None:
            disk.put("sensitivity", key, out)
        return out


def _multi_start_fit(resid: Callable[[np.ndarray], np.ndarray], names: list[str],
                     x_init: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The parameters of the best of six bounded least-squares fits: from ``x_init`` and
    from five seeded jitters of it (log terms shifted, the others scaled), because the
    residuals are not convex and one start can stop in a poor local minimum."""
    best = None
    starts = [x_init]
    rng = np.random.default_rng(0)
    for _ in range(5):
        jitter = rng.normal(0, 0.8, len(names))
        starts.append(np.array([v + j if n.startswith("log_") else v * math.exp(j)
                                for n, v, j in zip(names, x_init, jitter)]))
    for x0 in starts:
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
        res = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale="jac",
                            max_nfev=2000)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return best.x
