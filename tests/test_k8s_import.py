"""Cluster files from ``kubectl get nodes -o json``: GPU Feature Discovery names are catalog aliases."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from apportion.runtime.executors.kubernetes.importer import import_k8s

from apportion.config import cluster_from_data, parse_yaml_text
from apportion.errors import InputError
from apportion.gpus import canonical_gpu_name, gpu_catalog, gpu_product


def node(name: str, product: str | None, gpus: str | None, cpu: str = "96",
         memory: str = "1056597072Ki", label: str = "nvidia.com/gpu.product",
         unschedulable: bool = False, hostname: str | None = None) -> dict:
    """A Node as ``kubectl get nodes -o json`` prints it (the fields that matter, and noise)."""
    labels = {"kubernetes.io/hostname": hostname or name, "kubernetes.io/os": "linux",
              "node.kubernetes.io/instance-type": "p4d.24xlarge"}
    cap = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "102445Mi",
           "hugepages-1Gi": "0"}
    if product is not None:
        labels[label] = product
        labels["nvidia.com/gpu.count"] = gpus or "0"
    if gpus is not None:
        cap["nvidia.com/gpu"] = gpus
    alloc = dict(cap, cpu=str(int(cpu) - 1) if cpu.isdigit() else cpu)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "uid": "x", "resourceVersion": "1"},
            "spec": {"podCIDR": "10.0.0.0/24", **({"unschedulable": True} if unschedulable
                                                  else {})},
            "status": {"capacity": cap, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "images": [{"names": ["nvcr.io/x"], "sizeBytes": 1}]}}


def write(tmp: Path, items: list[dict]) -> Path:
    p = tmp / "nodes.json"
    p.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items,
                             "metadata": {"resourceVersion": ""}}))
    return p


def group(records: list[dict]) -> dict:
    """Records with equal hardware become one node group (what `cluster import` writes)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in records:
        assert r["k8s_resources"] == "allocatable"
        groups[(r["gpu_type"], r["gpus"], r["cpus"], r["memory_gib"],
                r["gpu_product_label"])].append(r["name"])
    return {"name": "imported", "node_groups": [
        {"prefix": f"g{i}", "nodes": names, "gpu_type": t, "gpus_per_node": g,
         "cpus_per_node": c, "host_memory_gib": m, "gpu_product_label": lab}
        for i, ((t, g, c, m, lab), names) in enumerate(sorted(groups.items()))]}


def test_import_and_group_into_a_cluster_file(tmp_path: Path) -> None:
    items = [node("p4d-1", "NVIDIA-A100-SXM4-40GB", "8"),
             node("p4d-2", "NVIDIA-A100-SXM4-40GB", "8"),
             node("ip-10-0-0-7.ec2.internal", "NVIDIA-H100-80GB-HBM3", "8", cpu="192",
                  memory="2113194144Ki", hostname="ip-10-0-0-7"),
             node("gke-t4-pool-a1", "nvidia-tesla-t4", "4", cpu="32", memory="122Gi",
                  label="cloud.google.com/gke-accelerator"),
             node("cpu-only", None, None),
             node("cordoned", "NVIDIA-A100-SXM4-40GB", "8", unschedulable=True),
             node("zero", "NVIDIA-A10G", "0")]
    recs = import_k8s(write(tmp_path, items))
    assert [r["name"] for r in recs] == ["p4d-1", "p4d-2", "ip-10-0-0-7", "gke-t4-pool-a1"]
    # the kubelet's allocatable (95 of 96 CPUs here), not the capacity
    assert recs[0] == {"name": "p4d-1", "gpu_type": "NVIDIA-A100-SXM4-40GB", "gpus": 8,
                       "cpus": 95, "memory_gib": 1007.6,
                       "gpu_product_label": "NVIDIA-A100-SXM4-40GB",
                       "k8s_resources": "allocatable"}
    assert recs[3]["gpu_product_label"] == "cloud.google.com/gke-accelerator=nvidia-tesla-t4"
    data = group(recs)
    # through YAML, as the command writes it, and the project's own loader
    import yaml

    text = yaml.safe_dump(data, sort_keys=False)
    cluster = cluster_from_data(parse_yaml_text(text, "imported.yaml"), "imported.yaml")
    assert {n: (nd.gpu_type, nd.gpus) for n, nd in cluster.nodes.items()} == {
        "p4d-1": ("A100-40GB", 8), "p4d-2": ("A100-40GB", 8), "ip-10-0-0-7": ("H100-80GB", 8),
        "gke-t4-pool-a1": ("T4", 4)}
    assert cluster.total_gpus == 28


def test_single_node_and_errors_name_the_field(tmp_path: Path) -> None:
    p = tmp_path / "one.json"
    p.write_text(json.dumps(node("n1", "NVIDIA-L4", "1", cpu="8", memory="32Gi")))
    assert import_k8s(p)[0]["gpu_type"] == "NVIDIA-L4"
    bad = node("n2", "NVIDIA-L4", "lots")
    with pytest.raises(InputError, match=r"items\[0\]\.status\.allocatable\.nvidia\.com/gpu"):
        import_k8s(write(tmp_path, [bad]))
    bad = node("n3", None, "2")
    with pytest.raises(InputError, match=r"items\[0\]\.metadata\.labels.*GPU Feature Discovery"):
        import_k8s(write(tmp_path, [bad]))
    bad = node("n4", "NVIDIA-L4", "1")
    del bad["status"]["allocatable"]["memory"]
    with pytest.raises(InputError, match=r"items\[0\]\.status\.allocatable\.memory"):
        import_k8s(write(tmp_path, [bad]))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        import_k8s(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"kind": "PodList", "foo": []}')
    with pytest.raises(InputError, match="items"):
        import_k8s(tmp_path / "y.json")
    with pytest.raises(InputError, match="no such file"):
        import_k8s(tmp_path / "missing.json")


def test_unknown_product_is_named_by_the_cluster_loader(tmp_path: Path) -> None:
    recs = import_k8s(write(tmp_path, [node("m", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "7")]))
    with pytest.raises(InputError, match=r"node_groups\[0\]\.gpu_type"):
        cluster_from_data(group(recs), "imported.yaml")


def test_every_gfd_product_is_an_alias_of_one_gpu() -> None:
    seen: dict[str, str] = {}
    for gpu in gpu_catalog().values():
        assert gpu.products, gpu.name
        assert gpu_product(gpu.name) == gpu.products[0]
        for prod in gpu.products:
            assert prod.lower() not in seen, (prod, seen.get(prod.lower()))
            seen[prod.lower()] = gpu.name
            assert canonical_gpu_name(prod) == gpu.name
    names = {a.lower() for g in gpu_catalog().values() for a in (g.name, *g.aliases)}
    assert not names & set(seen)  # products never shadow a catalog name or alias


def test_gpu_product_label_is_validated() -> None:
    base = {"prefix": "a", "count": 1, "gpu_type": "A100", "gpus_per_node": 8}
    for ok in ("NVIDIA-A100-SXM4-40GB", "cloud.google.com/gke-accelerator=nvidia-tesla-a100"):
        cluster_from_data({"node_groups": [dict(base, gpu_product_label=ok)]}, "c")
    for bad in ("has space", "x=", "-lead", "a" * 64):
        with pytest.raises(InputError, match=r"node_groups\[0\]\.gpu_product_label"):
            cluster_from_data({"node_groups": [dict(base, gpu_product_label=bad)]}, "c")
