"""The one packing rule: where ``k`` GPUs of a type go, and a free-GPU ledger for heuristics.

Every policy places GPUs the same way (Crius's consolidation): the tightest
single node that holds the whole request, else the nodes with the most usable
GPUs first, in whole tensor-parallel groups (a TP group never straddles
nodes). :func:`consolidate` is that rule on a list of (usable GPUs, node)
options; the cell greedy (``solvers.greedy.place``) feeds it from the
candidate graph, :class:`Packer` from a cluster's free GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable

from apportion.cluster import Cluster
from apportion.gpus import get_gpu


def consolidate(options: Iterable[tuple[int, str]], need: int, unit: int = 1,
                single_first: bool = True) -> dict[str, int] | None:
    """A placement of ``need`` GPUs from ``(usable GPUs, node)`` options, or None."""
    unit = max(1, unit)
    opts = [(k - k % unit, n) for k, n in options if k - k % unit > 0]
    if single_first:
        single = [(k, n) for k, n in opts if k >= need]
        if single:
            return {min(single)[1]: need}
    return fill_fullest(sorted(opts, key=lambda t: (-t[0], t[1])), need, unit)


def fill_fullest(ordered: Iterable[tuple[int, str]], need: int, unit: int = 1
                 ) -> dict[str, int] | None:
    """``need`` GPUs taken in whole ``unit`` groups from ``(usable GPUs, node)`` options
    already in :func:`consolidate`'s order (most usable first, then by name), or None."""
    out: dict[str, int] = {}
    for k, n in ordered:
        take = min(k, need)
        take -= take % unit
        if take > 0:
            out[n] = take
            need -= take
        if need == 0:
            return out
    return None


class Packer:
    """Free GPUs per node, and placement of k GPUs of one type."""

    _templates: dict[int, tuple[Cluster, dict[str, int], dict[str, list[str]], dict[str, str]]] = {}

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        tpl = self._templates.get(id(cluster))
        if tpl is None or tpl[0] is not cluster:
            by_type: dict[str, list[str]] = {}
            for n in cluster.nodes.values():
                by_type.setdefault(n.gpu_type, []).append(n.name)
            tpl = (cluster, {n.name: n.gpus for n in cluster.nodes.values()}, by_type,
                   {n.name: n.gpu_type for n in cluster.nodes.values()})
            self._templates[id(cluster)] = tpl
        self.free = dict(tpl[1])
        self.by_type = tpl[2]
        self.type_of = tpl[3]

    def free_of(self, gpu_type: str) -> int:
        return sum(self.free[n] for n in self.by_type.get(gpu_type, ()))

    def fits(self, placement: dict[str, int]) -> bool:
        return all(self.free.get(n, 0) >= k for n, k in placement.items())

    def take(self, placement: dict[str, int]) -> None:
        for n, k in placement.items():
            self.free[n] -= k

    def release(self, placement: dict[str, int]) -> None:
        for n, k in placement.items():
            self.free[n] += k

    def place(self, gpu_type: str, gpus: int, prefer: dict[str, int] | None = None,
              tp: int = 1, take: bool = True, spread: bool = False) -> dict[str, int] | None:
        """A placement of ``gpus`` GPUs of ``gpu_type`` (None when it does not fit);
        ``prefer`` (the job's current placement) wins when it still fits."""
        out: dict[str, int] | None
        if prefer and sum(prefer.values()) == gpus and all(
                self.type_of.get(n) == gpu_type for n in prefer) and self.fits(prefer):
            out = dict(prefer)
        else:
            if self.free_of(gpu_type) < gpus:
                return None
            names = self.by_type.get(gpu_type, [])
            out = consolidate(((self.free[n], n) for n in names), gpus, unit=tp,
                              single_first=not spread)
            if out is None:
                return None
        if take:
            self.take(out)
        return out


def type_order(cluster: Cluster) -> list[str]:
    """GPU types fastest first (16-bit peak), a deterministic tie-break by name."""
    return sorted(cluster.gpu_types, key=lambda t: (-get_gpu(t).half_tflops, t))
