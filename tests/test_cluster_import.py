"""`apportion cluster import`: Slurm's node records parsed, nodes of any source grouped, GPU names
mapped to the catalog, the YAML validated and written (or nothing written and exit 2).

The Slurm text below is what `scontrol show node -o` printed (22.05): the first two records were
captured from the test cluster of tests/test_runtime_slurm.py, the rest follow the records of
real GPU sites (typed GRES with socket affinity, drained and unresponsive nodes, CPU-only login
nodes, OS strings with spaces). The live import is tested in tests/test_runtime_slurm.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from apportion.runtime import cluster_import as ci
from apportion.runtime.executors.slurm.importer import nodes_from_scontrol
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.config import cluster_from_data, load_cluster
from apportion.errors import InputError
from apportion.gpus import gpu_catalog

CAPTURED = """\
NodeName=a10-0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.95 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a10:2 NodeAddr=127.0.0.1 NodeHostName=vm Port=55871 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=21907 Sockets=4 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  BootTime=2026-11-23T01:12:45 SlurmdStartTime=2026-11-23T01:33:29 LastBusyTime=2026-11-23T01:33:29 CfgTRES=cpu=4,mem=8000M,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=a40-0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.95 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a40:2 NodeAddr=127.0.0.1 NodeHostName=vm Port=56153 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=21907 Sockets=4 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  BootTime=2026-11-23T01:12:45 SlurmdStartTime=2026-11-23T01:33:29 LastBusyTime=2026-11-23T01:33:29 CfgTRES=cpu=4,mem=8000M,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
"""
SITE = """\
NodeName=gpu17 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUEfctv=64 CPUTot=64 CPULoad=3.01 AvailableFeatures=ib,a100 ActiveFeatures=ib,a100 Gres=gpu:a100_80g:8(S:0-1) GresUsed=gpu:a100_80g:2(IDX:0-1) NodeAddr=10.1.0.17 NodeHostName=gpu17 Version=22.05.8 OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023 RealMemory=1031000 AllocMem=0 FreeMem=990000 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,long BootTime=2024-01-01T00:00:00 SlurmdStartTime=2024-01-01T00:01:00 CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES=cpu=16,gres/gpu=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=gpu18 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.01 AvailableFeatures=ib,a100 ActiveFeatures=ib,a100 Gres=gpu:a100_80g:8(S:0-1) NodeAddr=10.1.0.18 NodeHostName=gpu18 Version=22.05.8 OS=Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023 RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,long CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES=
NodeName=gpu19 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 AvailableFeatures=ib,a100 ActiveFeatures=ib,a100 Gres=gpu:a100_80g:8(S:0-1) NodeAddr=10.1.0.19 NodeHostName=gpu19 RealMemory=1031000 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu,long Reason=bad DIMM B3 [root@2024-01-02T10:00:00]
NodeName=gpu20 Arch=x86_64 CPUTot=64 Gres=gpu:a100_80g:8(S:0-1) NodeAddr=10.1.0.20 RealMemory=1031000 State=DOWN* Partitions=gpu,long Reason=Not responding [slurm@2024-01-03T11:00:00]
NodeName=v100-1 Arch=x86_64 CPUTot=40 Gres=gpu:tesla_v100:4(S:0),mps:400 NodeAddr=10.1.1.1 RealMemory=385000 State=IDLE Partitions=gpu
NodeName=login01 Arch=x86_64 CPUTot=16 Gres=(null) NodeAddr=10.1.9.1 RealMemory=64000 State=IDLE Partitions=debug
"""
# scontrol's default (not -o) layout: a record over indented lines, records apart by a blank line
INDENTED = """\
NodeName=t4-a Arch=x86_64 CoresPerSocket=8
   CPUAlloc=0 CPUEfctv=16 CPUTot=16 CPULoad=0.00
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=gpu:t4:4
   NodeAddr=t4-a NodeHostName=t4-a Version=22.05.8
   OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)
   RealMemory=128000 AllocMem=0 FreeMem=120000 Sockets=2 Boards=1
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=t4

NodeName=t4-b Arch=x86_64 CoresPerSocket=8
   CPUAlloc=0 CPUEfctv=16 CPUTot=16 CPULoad=0.00
   Gres=gpu:t4:4
   RealMemory=128000
   State=ALLOCATED ThreadsPerCore=1
   Partitions=t4
"""


def test_captured_test_cluster() -> None:
    nodes = nodes_from_scontrol(CAPTURED).nodes
    assert nodes == [
        {"name": "a10-0", "gpu_type": "a10", "gpus": 2, "cpus": 4, "memory_gib": 7.812,
         "slurm_partitions": "main"},
        {"name": "a40-0", "gpu_type": "a40", "gpus": 2, "cpus": 4, "memory_gib": 7.812,
         "slurm_partitions": "main"}]


def test_site_records_skip_unavailable_and_cpu_nodes() -> None:
    nodes = {n["name"]: n for n in nodes_from_scontrol(SITE)}
    assert sorted(nodes) == ["gpu17", "gpu18", "v100-1"]  # drained, down and login nodes left out
    # MIXED: 2 of its 8 GPUs and 16 of its 64 CPUs held by running jobs
    assert nodes["gpu17"]["gpu_type"] == "a100_80g" and nodes["gpu17"]["gpus"] == 6
    assert nodes["gpu17"]["cpus"] == 48 and nodes["gpu17"]["slurm_features"] == "ib,a100"
    assert nodes["v100-1"]["gpus"] == 4  # mps is not a GPU
    everything = {n["name"] for n in nodes_from_scontrol(SITE, include_unavailable=True)}
    assert everything == {"gpu17", "gpu18", "gpu19", "gpu20", "v100-1"}


def test_indented_layout() -> None:
    nodes = nodes_from_scontrol(INDENTED)
    assert [(n["name"], n["gpu_type"], n["gpus"], n["cpus"]) for n in nodes] == [
        ("t4-a", "t4", 4, 16), ("t4-b", "t4", 4, 16)]


def test_a_node_with_two_gpu_types_is_refused_by_name() -> None:
    with pytest.raises(InputError) as exc:
        nodes_from_scontrol("NodeName=mix CPUTot=8 RealMemory=1000 State=IDLE "
                            "Gres=gpu:a100:2(S:0),gpu:v100:2(S:1)\n")
    assert exc.value.field == "mix.Gres" and "a100, v100" in exc.value.message


def test_groups_keep_names_and_map_gpu_names(tmp_path: Path) -> None:
    gmap = tmp_path / "map.yaml"
    gmap.write_text("tesla_v100: V100-32GB\n")
    names = ci.GpuNames(ci.load_gpu_map(gmap))
    doc = ci.cluster_document(nodes_from_scontrol(SITE), "site", names, "scontrol")
    groups = {g["prefix"]: g for g in doc["node_groups"]}
    # gpu17 offers what its running jobs leave: a group of its own
    assert groups["a100-80gb"]["nodes"] == ["gpu17"] and groups["a100-80gb-g2"]["nodes"] == [
        "gpu18"]
    assert groups["a100-80gb"]["gpus_per_node"] == 6
    assert groups["a100-80gb"]["labels"] == {"gpu_type_raw": "a100_80g",
                                             "slurm_features": "ib,a100",
                                             "slurm_partitions": "gpu,long"}
    assert groups["v100-32gb"]["gpu_type"] == "V100-32GB"  # from the user's map (the catalog
    assert ci.GpuNames().lookup("tesla_v100") == "V100-32GB"  # alias agrees: prefix dropped)
    cl = cluster_from_data(doc, "doc")
    assert cl.capacity_by_type() == {"A100-80GB": 14, "V100-32GB": 4}
    assert cl.nodes["gpu17"].host_memory_gib == pytest.approx(1031000 / 1024, abs=1e-3)
    assert cl.groups[0].label("gpu_type_raw") == "a100_80g"


def test_nodes_from_ray_and_kubernetes_shapes() -> None:
    """The shape ray_import and k8s_import return: extras such as the product label become
    labels, nodes differing only in an extra stay apart, names with dots are kept."""
    nodes: list[dict[str, Any]] = [
        {"name": "ip-10-0-0-5.ec2.internal", "gpu_type": "NVIDIA-A100-SXM4-80GB", "gpus": 8,
         "cpus": 96, "memory_gib": 1120.0, "gpu_product_label": "NVIDIA-A100-SXM4-80GB",
         "zone": "us-east-1a"},
        {"name": "ip-10-0-0-6.ec2.internal", "gpu_type": "NVIDIA-A100-SXM4-80GB", "gpus": 8,
         "cpus": 96, "memory_gib": 1120.0, "gpu_product_label": "NVIDIA-A100-SXM4-80GB",
         "zone": "us-east-1b"},
        {"name": "10.0.1.7", "gpu_type": "L4", "gpus": 1.0, "cpus": 8.0, "memory_gib": 30},
        {"name": "cpu-node", "gpu_type": None, "gpus": 0, "cpus": 4, "memory_gib": 16},
    ]
    doc = ci.cluster_document(nodes, "mixed", ci.GpuNames(), "k8s")
    groups = doc["node_groups"]
    assert [(g["prefix"], g["nodes"]) for g in groups] == [
        ("a100-80gb", ["ip-10-0-0-5.ec2.internal"]),
        ("a100-80gb-g2", ["ip-10-0-0-6.ec2.internal"]), ("l4", ["10.0.1.7"])]
    assert groups[0]["gpu_product_label"] == "NVIDIA-A100-SXM4-80GB"  # the field k8s selects by
    assert "gpu_product_label" not in groups[0]["labels"]
    assert groups[0]["labels"]["zone"] == "us-east-1a"
    assert groups[2]["intra_node_link"] == "pcie" and groups[0]["intra_node_link"] == "nvlink"
    cl = cluster_from_data(doc, "doc")
    assert cl.capacity_by_type() == {"A100-80GB": 16, "L4": 1}


@pytest.mark.parametrize(("nodes", "field", "words"), [
    ([{"name": "n1", "gpu_type": "rtx_6000", "gpus": 2}], "n1.gpu_type",
     ["'rtx_6000'", "--gpu-map", "rtx_6000: <catalog name>"]),
    ([{"name": "n1", "gpu_type": "", "gpus": 2}], "n1.gpu_type", ["no GPU type"]),
    ([{"name": "n1", "gpu_type": "a40", "gpus": -1}], "n1.gpus", ["GPU count"]),
    ([{"name": "n1", "gpu_type": "a40", "gpus": 1, "cpus": 0}], "n1.cpus", ["positive"]),
    ([{"name": "n1", "gpu_type": "a40", "gpus": 1}, {"name": "n1", "gpu_type": "a40", "gpus": 1}],
     "n1.name", ["twice"]),
    ([{"name": "n1", "gpu_type": "a40", "gpus": 0}], "nodes", ["no node with GPUs"]),
    ([{"name": "n[1]", "gpu_type": "a40", "gpus": 1}], "n[1].name", ["cannot hold"]),
])
def test_bad_nodes_name_the_node_and_field(nodes: list[dict[str, Any]], field: str,
                                           words: list[str]) -> None:
    with pytest.raises(InputError) as exc:
        ci.cluster_document(nodes, "c", ci.GpuNames(), "src")
    assert exc.value.field == field
    for w in words:
        assert w in exc.value.message


def test_gpu_map_file_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rtx_6000: RTX-6000\n")
    with pytest.raises(InputError) as exc:
        ci.load_gpu_map(bad)
    assert exc.value.source == str(bad) and exc.value.field == "rtx_6000"
    assert "unknown GPU type 'RTX-6000'" in exc.value.message
    bad.write_text("- a\n- b\n")
    with pytest.raises(InputError, match="mapping"):
        ci.load_gpu_map(bad)
    good = tmp_path / "good.yaml"
    good.write_text("RTX_6000: A40\n# a user entry wins over the built-in table\nA100: A100-80GB\n")
    names = ci.GpuNames(ci.load_gpu_map(good))
    assert names.lookup("rtx-6000") == "A40" and names.lookup("a100") == "A100-80GB"
    assert ci.GpuNames().lookup("a100") == "A100-40GB"  # the catalog's own alias


@pytest.mark.parametrize(("raw", "name"), [
    ("a40", "A40"), ("NVIDIA-A100-SXM4-80GB", "A100-80GB"), ("Tesla-V100-SXM2-16GB", "V100-16GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"), ("tesla_t4", "T4"), ("nvidia_l4", "L4"),
    ("A100-80G", "A100-80GB"), ("h200", "H200")])
def test_known_gpu_names(raw: str, name: str) -> None:
    assert ci.GpuNames().lookup(raw) == name


def test_a_missing_importer_module_is_a_clear_error() -> None:
    with pytest.raises(InputError) as exc:
        ci._lazy("no_such_importer", "f", "Nowhere")
    assert "apportion.runtime.no_such_importer" in exc.value.message


TYPES = sorted(gpu_catalog())


@settings(max_examples=40)
@given(st.lists(st.tuples(st.sampled_from(TYPES), st.integers(1, 8), st.sampled_from([8, 16]),
                          st.sampled_from([64.0, 128.5])), min_size=1, max_size=12))
def test_grouping_keeps_every_node_once(specs: list[tuple[str, int, int, float]]) -> None:
    nodes = [{"name": f"n{i:02d}", "gpu_type": t.lower(), "gpus": g, "cpus": c, "memory_gib": m}
             for i, (t, g, c, m) in enumerate(specs)]
    doc = ci.cluster_document(nodes, "p", ci.GpuNames(), "prop")
    listed = [n for g in doc["node_groups"] for n in g["nodes"]]
    assert sorted(listed) == [n["name"] for n in nodes]
    assert len(doc["node_groups"]) == len({(t, g, c, m) for t, g, c, m in specs})
    cl = cluster_from_data(doc, "prop")
    for n, (t, g, c, m) in zip(nodes, specs, strict=True):
        node = cl.nodes[n["name"]]
        assert (node.gpu_type, node.gpus, node.cpus, node.host_memory_gib) == (t, g, c, m)


# -- the command line ----------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=120)


def test_cli_imports_saved_scontrol_text(tmp_path: Path) -> None:
    (tmp_path / "nodes.txt").write_text(SITE)
    (tmp_path / "map.yaml").write_text("a100_80g: A100-80GB\n")
    r = _cli("cluster", "import", "--from", "slurm", "nodes.txt", "--gpu-map", "map.yaml",
             "--out", "c.yaml", "--name", "site", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 node groups, 3 nodes" in r.stderr and "gpu19" in r.stderr  # drained: said, left out
    cl = load_cluster(tmp_path / "c.yaml")
    assert cl.name == "site" and sorted(cl.nodes) == ["gpu17", "gpu18", "v100-1"]
    r = _cli("cluster", "import", "--from", "slurm", "nodes.txt", "--gpu-map", "map.yaml",
             "--out", "-", cwd=tmp_path)
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["node_groups"][0]["nodes"] == [
        "gpu17"]


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "nodes.txt").write_text(SITE.replace("a100_80g", "rtx_a6000"))
    r = _cli("cluster", "import", "--from", "slurm", "nodes.txt", "--out", "c.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "gpu17.gpu_type" in r.stderr and "'rtx_a6000'" in r.stderr
    assert "--gpu-map" in r.stderr
    assert not (tmp_path / "c.yaml").exists()
    (tmp_path / "map.yaml").write_text("rtx_a6000: Z9000\n")
    r = _cli("cluster", "import", "--from", "slurm", "nodes.txt", "--gpu-map", "map.yaml",
             "--out", "c.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "map.yaml" in r.stderr and "Z9000" in r.stderr
    r = _cli("cluster", "import", "--from", "lsf", "--out", "c.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "slurm, ray, k8s" in r.stderr
    # the same checks in-process (each CLI start costs seconds): InputError is what exits 2
    (tmp_path / "d").mkdir()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"source": "slurm", "out": tmp_path / "d", "path": tmp_path / "nodes.txt"}, "is a folder"),
        ({"source": "slurm", "out": tmp_path / "no" / "c.yaml", "path": tmp_path / "nodes.txt"},
         "does not exist"),
        ({"source": "ray", "out": tmp_path / "c.yaml"}, "--ray-address"),
        ({"source": "k8s", "out": tmp_path / "c.yaml"}, "kubectl get nodes -o json")]
    if importlib.util.find_spec("apportion.runtime.executors.kubernetes.importer") is None:
        (tmp_path / "nodes.json").write_text('{"items": []}')
        cases.append(({"source": "k8s", "out": tmp_path / "c.yaml",
                       "path": tmp_path / "nodes.json"},
                      "apportion.runtime.executors.kubernetes.importer"))
    for kw, words in cases:
        with pytest.raises(InputError, match=words.replace(".", r"\.")):
            ci.import_cluster(**kw)
    assert not (tmp_path / "c.yaml").exists()
