"""Cluster expansion, capacity and bottleneck bandwidth on the topology graph."""

from __future__ import annotations

import pytest

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


def test_node_groups_with_real_host_names() -> None:
    """An imported cluster keeps its host names, so decisions name nodes the engine knows."""
    from apportion.config import cluster_from_data

    cl = cluster_from_data({"node_groups": [
        {"prefix": "a40", "gpu_type": "A40", "gpus_per_node": 2, "nodes": ["gpu17", "gpu18"]},
        {"prefix": "a10", "count": 1, "gpu_type": "A10", "gpus_per_node": 2}]}, "c.yaml")
    assert sorted(cl.nodes) == ["a10-0", "gpu17", "gpu18"]
    assert cl.nodes["gpu17"].gpu_type == "A40" and cl.capacity_by_type() == {"A40": 4, "A10": 2}


@pytest.mark.parametrize("groups, field, message", [
    ([{"prefix": "a", "gpu_type": "A40", "gpus_per_node": 2}], "node_groups[0].count", "required"),
    ([{"prefix": "a", "gpu_type": "A40", "gpus_per_node": 2, "count": 3, "nodes": ["x", "y"]}],
     "node_groups[0].count", "2 nodes are listed"),
    ([{"prefix": "a", "gpu_type": "A40", "gpus_per_node": 2, "nodes": ["x", "x"]}],
     "node_groups[0].nodes", "used twice"),
    ([{"prefix": "a", "gpu_type": "A40", "gpus_per_node": 2, "count": 1},
      {"prefix": "b", "gpu_type": "A10", "gpus_per_node": 2, "nodes": ["a-0"]}],
     "node_groups[1].nodes", "used twice"),
    ([{"prefix": "a", "gpu_type": "A40", "gpus_per_node": 2, "nodes": ["../x"]}],
     "node_groups[0].nodes[0]", "pattern"),
])
def test_bad_node_lists_name_the_field(groups: list, field: str, message: str) -> None:
    from apportion.config import cluster_from_data
    from apportion.errors import InputError

    with pytest.raises(InputError) as exc:
        cluster_from_data({"node_groups": groups}, "c.yaml")
    assert exc.value.field == field and message in exc.value.message, str(exc.value)
