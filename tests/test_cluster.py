"""Cluster expansion, capacity and bottleneck bandwidth on the topology graph."""

from __future__ import annotations

from apportion.cluster import Cluster, NodeGroup, gpu_id
from apportion.config import default_cluster


def test_groups_expand_to_named_nodes() -> None:
    c = Cluster("c", [NodeGroup("a", 3, "A100-40GB", 8, inter_node_bandwidth_GBps=25,
                                intra_node_bandwidth_GBps=300),
                      NodeGroup("b", 2, "T4", 4, intra_node_link="pcie",
                                intra_node_bandwidth_GBps=16, inter_node_bandwidth_GBps=5)])
    assert sorted(c.nodes) == ["a-0", "a-1", "a-2", "b-0", "b-1"]
    assert c.capacity_by_type() == {"A100-40GB": 24, "T4": 8}
    assert c.total_gpus == 32
    # inside one node: the intra-node link
    assert c.bottleneck_bandwidth([gpu_id("a-0", 0), gpu_id("a-0", 7)]) == 300
    # across nodes: the slowest inter-node edge involved
    assert c.bottleneck_bandwidth([gpu_id("a-0", 0), gpu_id("a-1", 0)]) == 25
    assert c.bottleneck_bandwidth([gpu_id("a-0", 0), gpu_id("b-1", 0)]) == 5
    assert c.placement_bandwidth({"b-0": 4}) == 16
    g = c.graph
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu") == 32


def test_default_cluster_is_crius_testbed() -> None:
    c = default_cluster()
    assert c.capacity_by_type() == {"A40": 32, "A10": 32}
    assert len(c.nodes) == 32
    assert c.max_gpus_per_node("A40") == 2
