"""`apportion cluster import` reads clusters as they are: Slurm's drained, down, reserved and
mixed nodes, GPUs in use and MemSpecLimit (its JSON interfaces and its text); Kubernetes'
node conditions, taints against the configured tolerations, MIG labels and what running pods
hold; each node left out or cut down said with why.

The outputs are in tests/cluster_outputs/ (SOURCES.md: Slurm 22.05's captured from a real
cluster, the others written from the APIs' schemas). The live Slurm import is in
tests/test_runtime_slurm.py, the live Ray one with token authentication in
tests/test_ray_import_auth.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from apportion.runtime import cluster_import as ci
from apportion.runtime.executors.kubernetes.config import load_k8s_config
from apportion.runtime.executors.kubernetes.importer import import_k8s
from apportion.runtime.executors.slurm.importer import nodes_from_scontrol

from apportion.config import load_cluster
from apportion.errors import InputError

OUTPUTS = Path(__file__).parent / "cluster_outputs"
SLURM_22 = ("slurm-22.05-sinfo.json", "slurm-22.05-scontrol-d-o.txt", "slurm-22.05-scontrol-d.txt")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=120)


def _notes(imported) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in imported.notes:
        out.setdefault(n.node, []).append(("left out: " if n.left_out else "") + n.why)
    return out


@pytest.mark.parametrize("name", SLURM_22)
def test_slurm_22_every_form_reads_the_same_cluster(name: str) -> None:
    """The three forms Slurm 22.05 printed of one cluster: drained, down and ALLOCATED nodes
    are left out, the MIXED node offers the GPUs and CPUs its job leaves, and MemSpecLimit
    (in the text form only: 22.05's sinfo --json lacks it) is kept back."""
    got = nodes_from_scontrol((OUTPUTS / name).read_text(), name)
    nodes = {n["name"]: n for n in got}
    # gpu-a3 / gpu-a5 were in reservations not yet flagged on the nodes when captured
    assert sorted(nodes) == ["gpu-a0", "gpu-a2", "gpu-a3", "gpu-a5"]
    assert nodes["gpu-a2"]["gpus"] == 4 and nodes["gpu-a2"]["cpus"] == 12
    assert nodes["gpu-a3"]["gpus"] == 8 and nodes["gpu-a3"]["cpus"] == 16
    spec = 4096 if name.endswith(".txt") else 0
    assert nodes["gpu-a0"]["memory_gib"] == round((64000 - spec) / 1024, 3)
    notes = _notes(got)
    assert any("drained" in w and "bad DIMM B3" in w for w in notes["gpu-a1"])
    assert any("down" in w and "GPU fell off the bus" in w for w in notes["gpu-a4"])
    assert notes["gpu-l0"] == ["left out: all 4 GPUs in use by running jobs"]
    assert "4 of 8 GPUs in use by running jobs" in notes["gpu-a2"]
    everything = nodes_from_scontrol((OUTPUTS / name).read_text(), name,
                                     include_unavailable=True)
    assert len(everything) == 7 and all(n["gpus"] in (8, 4) for n in everything)
    assert {n["name"]: n["gpus"] for n in everything}["gpu-a2"] == 8


def test_slurm_json_of_24_11() -> None:
    """``scontrol show node --json`` (data_parser v0.0.41): state lists, MemSpecLimit as
    specialized_memory, what jobs hold, reservations and maintenance named."""
    got = nodes_from_scontrol((OUTPUTS / "slurm-24.11-scontrol.json").read_text(), "j")
    nodes = {n["name"]: n for n in got}
    assert sorted(nodes) == ["h100-00", "h100-01"]
    assert nodes["h100-00"] == {"name": "h100-00", "gpu_type": "h100", "gpus": 8, "cpus": 104,
                                "memory_gib": round((2063500 - 16384) / 1024, 3),
                                "slurm_partitions": "gpu,preempt", "slurm_features": "ib,h100"}
    assert nodes["h100-01"]["gpus"] == 4 and nodes["h100-01"]["cpus"] == 104 - 48
    assert nodes["h100-01"]["memory_gib"] == round((2063500 - 16384 - 524288) / 1024, 3)
    notes = _notes(got)
    assert any("drained" in w and "ECC" in w for w in notes["h100-02"])
    assert any("advance reservation" in w and "llm-pretrain" in w for w in notes["h100-03"])
    assert any("down" in w and "not responding" in w for w in notes["h100-04"])
    assert notes["h100-05"] == ["left out: all 8 GPUs in use by running jobs"]
    assert any("maintenance" in w for w in notes["h100-06"])
    assert any("drained" in w and "swap PSU" in w for w in notes["h100-07"])  # draining
    assert notes["login-1"] == ["left out: no GPUs"]


def test_slurm_json_errors_and_bad_values_are_named() -> None:
    with pytest.raises(InputError, match="errors.*Invalid node"):
        nodes_from_scontrol(json.dumps({"nodes": [], "errors": [{"description": "Invalid node",
                                                                  "error_number": 2}]}), "e")
    with pytest.raises(InputError, match=r"nodes\[0\]\.name"):
        nodes_from_scontrol('{"nodes": [{"gres": "gpu:a100:8"}]}', "e")
    with pytest.raises(InputError, match="malformed JSON"):
        nodes_from_scontrol("{nodes", "e")
    with pytest.raises(InputError, match=r"n1\.CPUTot"):
        nodes_from_scontrol("NodeName=n1 CPUTot=many Gres=gpu:a40:2 State=IDLE\n", "t")


def test_cli_slurm_says_what_it_left_out(tmp_path: Path) -> None:
    r = _cli("cluster", "import", "--from", "slurm", str(OUTPUTS / "slurm-24.11-scontrol.json"),
             "--out", "c.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for words in ("h100-02", "ECC", "h100-03", "llm-pretrain", "h100-05", "all 8 GPUs in use",
                  "4 of 8 GPUs in use", "MemSpecLimit", "7 nodes left out"):
        assert words in r.stderr, (words, r.stderr)
    cl = load_cluster(tmp_path / "c.yaml")
    assert {n: nd.gpus for n, nd in cl.nodes.items()} == {"h100-00": 8, "h100-01": 4}


# -- Kubernetes ---------------------------------------------------------------------------
NODES = OUTPUTS / "k8s-nodes.json"
PODS = OUTPUTS / "k8s-pods.json"


def test_k8s_conditions_taints_cordons_and_mig() -> None:
    got = import_k8s(NODES)
    names = [n["name"] for n in got]
    assert names == ["gpu-a100-0", "gpu-mig-single", "gpu-mig-part", "gpu-h100-0", "gpu-h100-1"]
    notes = _notes(got)
    assert any("not Ready: Ready=False" in w and "cni plugin" in w for w in notes["gpu-a100-1"])
    assert any("Ready=unknown" in w for w in notes["gpu-a100-2"])
    assert any("nvidia.com/gpu=present:NoSchedule" in w and "toleration" in w
               for w in notes["gpu-a100-3"])
    assert any("cordoned" in w for w in notes["gpu-a100-4"])
    assert any("dedicated=inference:NoSchedule" in w for w in notes["gpu-a100-5"])
    assert any("MIG slices only" in w and "nvidia.com/mig-1g.5gb x28" in w
               for w in notes["gpu-mig-mixed"])
    part = {n["name"]: n for n in got}["gpu-mig-part"]
    assert part["gpus"] == 4 and "mig_profile" not in part  # its whole GPUs only
    assert any("nvidia.com/mig-3g.20gb" in w for w in notes["gpu-mig-part"])
    assert {n["name"]: n for n in got}["gpu-mig-single"]["mig_profile"] == "1g.5gb"
    assert notes["cpu-0"] == ["left out: no GPUs"]


def test_k8s_tolerations_keep_tainted_nodes(tmp_path: Path) -> None:
    cfg = tmp_path / "k8s.yaml"
    cfg.write_text("tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: "
                   "NoSchedule}\n")
    got = import_k8s(NODES, tolerations=load_k8s_config(cfg).tolerations)
    rec = {n["name"]: n for n in got}["gpu-a100-3"]
    assert rec["k8s_taints"] == "nvidia.com/gpu=present:NoSchedule"
    assert "gpu-a100-5" not in {n["name"] for n in got}  # another key: still refused
    # Equal needs the value; a toleration with no effect tolerates every effect
    cfg.write_text("tolerations: [{key: dedicated, value: training}]\n")
    assert "gpu-a100-5" not in {n["name"] for n in
                                import_k8s(NODES, tolerations=load_k8s_config(cfg).tolerations)}
    cfg.write_text("tolerations: [{key: dedicated, value: inference}]\n")
    assert "gpu-a100-5" in {n["name"] for n in
                            import_k8s(NODES, tolerations=load_k8s_config(cfg).tolerations)}
    cfg.write_text("tolerations: [{key: dedicated, operator: Sometimes}]\n")
    with pytest.raises(InputError, match=r"tolerations\[0\]\.operator"):
        load_k8s_config(cfg)


def test_k8s_running_pods_are_taken_off() -> None:
    got = import_k8s(NODES, pods=PODS)
    nodes = {n["name"]: n for n in got}
    h0 = nodes["gpu-h100-0"]
    # another team's 4 GPUs; the DaemonSets' CPUs (dcgm: its init container's 1 CPU is more);
    # apportion's own pod and the finished one hold nothing here
    assert h0["gpus"] == 4 and h0["k8s_resources"] == "free"
    assert h0["cpus"] == int(191.45 - 24 - 0.1 - 1)
    assert h0["memory_gib"] == pytest.approx((2101659296 * 1024 - 200 * 2**30 - 128 * 2**20
                                              - 512 * 2**20) / 2**30, abs=0.1)
    notes = _notes(got)
    assert any("4 of 8 GPUs requested" in w and "vision/resnet-train-0" in w
               for w in notes["gpu-h100-0"])
    # limits only (requests default to them), with a pod overhead: every GPU held
    assert "gpu-h100-1" not in nodes
    assert any("all 8 GPUs requested" in w and "nlp/bert-sweep-3" in w
               for w in notes["gpu-h100-1"])


def test_cli_k8s_mig_is_refused_by_name_or_mapped(tmp_path: Path) -> None:
    """A MIG product label never stops the import: the node is left out by name, or kept
    where --gpu-map maps the slice."""
    r = _cli("cluster", "import", "--from", "k8s", str(NODES), "--pods", str(PODS), "--out",
             "c.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "gpu-mig-single" in r.stderr and "MIG slices NVIDIA-A100-SXM4-40GB-MIG-1g.5gb" \
        in r.stderr and "--gpu-map" in r.stderr
    for words in ("gpu-a100-1", "not Ready", "gpu-a100-3", "nvidia.com/gpu=present:NoSchedule",
                  "gpu-h100-1", "all 8 GPUs requested"):
        assert words in r.stderr, (words, r.stderr)
    cl = load_cluster(tmp_path / "c.yaml")
    assert {n: nd.gpus for n, nd in cl.nodes.items()} == {
        "gpu-a100-0": 8, "gpu-mig-part": 4, "gpu-h100-0": 4}
    assert {g.label("k8s_resources") for g in cl.groups} == {"free"}
    (tmp_path / "map.yaml").write_text("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb: A10\n")
    (tmp_path / "k8s.yaml").write_text("tolerations: [{key: nvidia.com/gpu, operator: "
                                       "Exists}]\n")
    r = _cli("cluster", "import", "--from", "k8s", str(NODES), "--gpu-map", "map.yaml",
             "--k8s-config", "k8s.yaml", "--out", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    groups = {n: g for g in doc["node_groups"] for n in g["nodes"]}
    assert groups["gpu-mig-single"]["gpus_per_node"] == 56
    assert groups["gpu-a100-3"]["labels"]["k8s_taints"] == "nvidia.com/gpu=present:NoSchedule"
    r = _cli("cluster", "import", "--from", "slurm", str(NODES), "--pods", str(PODS), "--out",
             "x.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "--pods" in r.stderr


def test_free_nodes_keep_their_figures_in_manifests(tmp_path: Path) -> None:
    """A node group read less its pods' requests ("free") is not reduced again by the
    DaemonSets' reserve when pods are sized."""
    from apportion.runtime.executors.kubernetes.config import K8sConfig
    from apportion.runtime.executors.kubernetes.manifests import node_usable

    doc = ci.cluster_document(import_k8s(NODES, pods=PODS).nodes[:1] + [
        {**import_k8s(NODES, pods=PODS).nodes[-1], "k8s_resources": "allocatable",
         "name": "other"}], "c", ci.GpuNames(), "t")
    from apportion.config import cluster_from_data

    cl = cluster_from_data(doc, "t")
    cfg = K8sConfig()
    free = cl.nodes["gpu-a100-0"]
    assert node_usable(cl, free, cfg) == (float(free.cpus), float(free.host_memory_gib))
    other = cl.nodes["other"]
    assert node_usable(cl, other, cfg) == (other.cpus - cfg.reserve.pods_cpus,
                                           other.host_memory_gib - cfg.reserve.pods_memory_gib)
