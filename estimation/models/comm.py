"""Alpha-beta communication model per link type.

A message of ``V`` bytes over a link costs ``alpha + V / bandwidth``. Ring
collectives over ``n`` ranks: all-reduce ``2(n-1) alpha + 2(n-1)/n V / B``;
all-gather and reduce-scatter half of that; point-to-point ``alpha + V / B``.
Latencies are typical figures for each link type (NCCL over NVLink a few
microseconds, PCIe about ten, InfiniBand/RoCE about twenty); later estimators
replace the line with measured tables.
"""

from __future__ import annotations

from dataclasses import dataclass

LINK_ALPHA_S = {"nvlink": 5e-6, "pcie": 10e-6, "network": 20e-6}


@dataclass(frozen=True)
class Link:
    kind: str  # nvlink | pcie | network
    bandwidth_GBps: float

    @property
    def alpha_s(self) -> float:
        return LINK_ALPHA_S.get(self.kind, 20e-6)

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_GBps * 1e9


def allreduce_time(nbytes: float, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.bytes_per_s


def allgather_time(nbytes: float, n: int, link: Link) -> float:
    """All-gather (or reduce-scatter) of a total of ``nbytes`` over ``n`` ranks."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.alpha_s + (n - 1) / n * nbytes / link.bytes_per_s


def p2p_time(nbytes: float, link: Link) -> float:
    return p2p_seconds(nbytes, link.alpha_s, link.bytes_per_s)


def p2p_seconds(nbytes: float, alpha_s: float, bytes_per_s: float) -> float:
    """:func:`p2p_time` over a link given by its latency and bytes per second (a caller
    sending many messages over one link reads them once)."""
    if nbytes <= 0:
        return 0.0
    return alpha_s + nbytes / bytes_per_s
