"""The cluster: nodes expanded from node groups, held as a networkx graph.

The graph is a tree: a ``fabric`` root (the inter-node network), one vertex per
node joined to the fabric by an edge carrying the node's inter-node bandwidth,
and one vertex per GPU joined to its node by an edge carrying the intra-node
link bandwidth. The bottleneck bandwidth of a GPU set is the smallest
bandwidth on the edges that connect the set, which on this tree is the
intra-node link when the set sits on one node and the slowest involved
inter-node edge otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx

from apportion.gpus import GpuType, get_gpu

FABRIC = "fabric"


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes named ``prefix-0`` .. ``prefix-(count-1)``, or ``names``.

    ``names`` keeps the real host names of a cluster imported from Slurm, Ray or
    Kubernetes, so decisions name nodes the engine knows.
    """

    prefix: str
    count: int
    gpu_type: str
    gpus_per_node: int
    cpus_per_node: int = 32
    host_memory_gib: float = 256.0
    intra_node_link: str = "nvlink"
    intra_node_bandwidth_GBps: float = 300.0
    inter_node_bandwidth_GBps: float = 25.0
    names: tuple[str, ...] = ()
    gpu_product_label: str | None = None  # Kubernetes: the node label selecting these GPUs
    labels: tuple[tuple[str, str], ...] = ()  # engine annotations (cluster import), sorted
    # the device memory a job may use on each GPU of the group when it is less than the
    # catalog's (a MIG slice, a GPU another tenant shares, a CPU worker slot's budget on a
    # local cluster without GPUs); None: the catalog's, less the estimator's reserve
    gpu_memory_gib: float | None = None

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    def node_names(self) -> list[str]:
        return list(self.names) if self.names else [f"{self.prefix}-{i}" for i in range(self.count)]


@dataclass(frozen=True)
class Node:
    name: str
    group: str
    gpu_type: str
    gpus: int
    cpus: int
    host_memory_gib: float
    intra_link: str
    intra_bandwidth_GBps: float
    inter_bandwidth_GBps: float
    gpu_memory_gib: float | None = None  # NodeGroup.gpu_memory_gib


@dataclass
class Cluster:
    """Nodes of possibly different GPU types, with a topology graph."""

    name: str
    groups: list[NodeGroup]
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            for grp in self.groups:
                for name in grp.node_names():
                    n = Node(name, grp.prefix, grp.gpu_type, grp.gpus_per_node,
                             grp.cpus_per_node, grp.host_memory_gib, grp.intra_node_link,
                             grp.intra_node_bandwidth_GBps, grp.inter_node_bandwidth_GBps,
                             grp.gpu_memory_gib)
                    self.nodes[n.name] = n

    @cached_property
    def fingerprint(self) -> tuple:
        """A hashable identity of the topology (treat a Cluster as immutable once built)."""
        return (self.name, tuple(self.groups), tuple(sorted(self.nodes)))

    @cached_property
    def fingerprint_hash(self) -> int:
        """Hash of :attr:`fingerprint`, computed once (estimators key their caches by it)."""
        return hash(self.fingerprint)

    @cached_property
    def _by_type(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes.values():
            out.setdefault(n.gpu_type, []).append(n)
        return out

    @cached_property
    def _max_per_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes.values():
            out[n.gpu_type] = max(out.get(n.gpu_type, 0), n.gpus)
        return out

    @cached_property
    def graph(self) -> nx.Graph:
        g = nx.Graph(name=self.name)
        g.add_node(FABRIC, kind="fabric")
        for n in self.nodes.values():
            g.add_node(n.name, kind="node", gpu_type=n.gpu_type, gpus=n.gpus, cpus=n.cpus,
                       host_memory_gib=n.host_memory_gib, group=n.group)
            g.add_edge(FABRIC, n.name, bandwidth_GBps=n.inter_bandwidth_GBps, link="network")
            for i in range(n.gpus):
                gid = gpu_id(n.name, i)
                g.add_node(gid, kind="gpu", gpu_type=n.gpu_type, node=n.name)
                g.add_edge(n.name, gid, bandwidth_GBps=n.intra_bandwidth_GBps, link=n.intra_link)
        return g

    @property
    def gpu_types(self) -> list[str]:
        return sorted({n.gpu_type for n in self.nodes.values()})

    def gpu_spec(self, gpu_type: str) -> GpuType:
        return get_gpu(gpu_type)

    def capacity_by_type(self) -> dict[str, int]:
        return dict(self._capacity)

    @cached_property
    def _capacity(self) -> dict[str, int]:
        # read once: the candidates ask per job (1,336 walks over 5,120 nodes: 6 s of a
        # 10,000-job round)
        c: Counter[str] = Counter()
        for n in self.nodes.values():
            c[n.gpu_type] += n.gpus
        return dict(c)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def nodes_of_type(self, gpu_type: str) -> list[Node]:
        return list(self._by_type.get(gpu_type, []))

    def gpu_memory_bytes(self, gpu_type: str) -> float | None:
        """The device memory a job may use on every GPU of ``gpu_type`` here, where a node
        group says less than the catalog (the smallest such node's); None where none does."""
        return self._gpu_memory.get(gpu_type)

    @cached_property
    def _gpu_memory(self) -> dict[str, float | None]:
        # read once: the candidates ask for every cell (a 10,000-job round on 20,480 GPUs
        # asked 223,000 times, each a walk over a type's nodes: 36 s of its 60)
        out: dict[str, float | None] = {}
        for t, nodes in self._by_type.items():
            said = [n.gpu_memory_gib for n in nodes if n.gpu_memory_gib is not None]
            out[t] = min(min(said) * 2**30, get_gpu(t).memory_bytes) if said else None
        return out

    def max_gpus_per_node(self, gpu_type: str) -> int:
        return self._max_per_node.get(gpu_type, 0)

    def group_of_type(self, gpu_type: str) -> NodeGroup | None:
        for g in self.groups:
            if g.gpu_type == gpu_type:
                return g
        return None

    def bottleneck_bandwidth(self, gpus: list[str]) -> float:
        """Smallest link bandwidth (GB/s) connecting ``gpus`` (GPU ids ``node/gpuK``)."""
        if len(gpus) < 2:
            return float("inf")
        g = self.graph
        root = gpus[0]
        edges: set[tuple[str, str]] = set()
        for other in gpus[1:]:
            path = nx.shortest_path(g, root, other)
            edges.update(zip(path, path[1:]))
        return min(g.edges[e]["bandwidth_GBps"] for e in edges)

    def placement_bandwidth(self, placement: dict[str, int]) -> float:
        """Bottleneck bandwidth of a placement ``{node: gpu count}``."""
        ids = [gpu_id(node, i) for node, k in placement.items() for i in range(k)]
        return self.bottleneck_bandwidth(ids)


def gpu_id(node: str, index: int) -> str:
    return f"{node}/gpu{index}"
