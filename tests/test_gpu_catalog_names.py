"""The GPU catalog of today's clusters: L40S, H100 PCIe and NVL, B200, GH200 and MI300X with
data-sheet figures and sources; PCIe and SXM boards kept apart through every door (GPU Feature
Discovery labels, Slurm GRES types, Ray accelerator types); `apportion gpus --aliases`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from apportion.cli import app
from apportion.gpus import ambiguity, canonical_gpu_name, get_gpu, gpu_catalog

DATA = Path(__file__).resolve().parents[1] / "apportion" / "data" / "gpus.yaml"
runner = CliRunner()


# figures from the data sheets named in gpus.yaml (dense tensor peaks)
@pytest.mark.parametrize("name, memory, half, fp32, hbm, link, link_gbps", [
    ("L40S", 48, 362.05, 91.6, 864, "pcie", 64),
    ("H100-PCIE", 80, 756, 51, 2000, "pcie", 128),
    ("H100-NVL", 94, 835.5, 60, 3900, "pcie", 128),
    ("H100-80GB", 80, 989, 67, 3350, "nvlink", 900),
    ("H200-NVL", 141, 835.5, 60, 4800, "pcie", 128),
    ("B200", 180, 2250, 75, 8000, "nvlink", 1800),
    ("GH200", 96, 989, 67, 4000, "nvlink", 900),
    ("GH200-144GB", 144, 989, 67, 4900, "nvlink", 900),
    ("MI300X", 192, 1307.4, 163.4, 5300, "nvlink", 896),
    ("A100-PCIE-80GB", 80, 312, 19.5, 1935, "pcie", 64),
])
def test_new_entries_carry_data_sheet_figures(name: str, memory: float, half: float,
                                              fp32: float, hbm: float, link: str,
                                              link_gbps: float) -> None:
    g = gpu_catalog()[name]
    assert (g.memory_gib, g.half_tflops, g.fp32_tflops, g.hbm_GBps, g.link, g.link_GBps) == (
        memory, half, fp32, hbm, link, link_gbps)
    assert g.form_factor and g.interconnect


def test_every_family_names_its_source() -> None:
    text = DATA.read_text()
    sources = text[text.index("# Sources"):text.index("# Names each entry accepts")]
    for g in gpu_catalog().values():
        family = re.match(r"[A-Z]+\d+[A-Z]?", g.name).group(0)  # type: ignore[union-attr]
        assert re.search(rf"^#\s+[^:\n]*\b{family}\b[^:\n]*:", sources, re.M), g.name
        assert g.half_tflops >= g.fp32_tflops > 0 and g.memory_gib > 0 and g.hbm_GBps > 0


def test_pcie_parts_never_map_to_an_sxm_entry() -> None:
    """Every name that says PCIe or NVL, in any door's spelling, is a PCIe entry."""
    for g in gpu_catalog().values():
        for kind, names in g.names().items():
            for n in names:
                if re.search(r"pcie|nvl\b|-nvl", n, re.IGNORECASE):
                    assert g.form_factor.startswith("PCIe") and g.link == "pcie", (kind, n)
    spelled = {"NVIDIA-H100-PCIe": "H100-PCIE", "NVIDIA H100 PCIe": "H100-PCIE",
               "nvidia_h100_pcie": "H100-PCIE", "NVIDIA-H100-NVL": "H100-NVL",
               "NVIDIA H100 NVL": "H100-NVL", "NVIDIA-A100-PCIE-40GB": "A100-PCIE-40GB",
               "NVIDIA-A100-80GB-PCIe": "A100-PCIE-80GB", "nvidia_a100_80gb_pcie":
               "A100-PCIE-80GB", "NVIDIA-H200-NVL": "H200-NVL", "Tesla-V100-PCIE-32GB":
               "V100-PCIE-32GB", "Tesla-P100-PCIE-16GB": "P100-PCIE-16GB",
               "NVIDIA-A800-80GB-PCIe": "A800-PCIE-80GB"}
    for raw, name in spelled.items():
        assert canonical_gpu_name(raw) == name, raw
        assert get_gpu(raw).link == "pcie"


def test_gpus_aliases_lists_every_name_and_each_resolves_to_its_entry() -> None:
    r = runner.invoke(app, ["gpus", "--aliases", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    owner: dict[str, str] = {}
    for row in data["gpus"]:
        assert set(row) >= {"name", "form_factor", "aliases", "products", "slurm", "ray"}
        for kind in ("aliases", "products", "slurm", "ray"):
            for n in row[kind]:
                assert canonical_gpu_name(n) == row["name"], (kind, n)
                assert owner.setdefault(n.lower(), row["name"]) == row["name"], n
    rows = {r["name"]: r for r in data["gpus"]}
    assert "NVIDIA-L40S" in rows["L40S"]["products"] and "L40S" in rows["L40S"]["ray"]
    assert "AMD-Instinct-MI300X-OAM" in rows["MI300X"]["ray"]
    assert "h100_pcie" in rows["H100-PCIE"]["slurm"]
    assert "NVIDIA-B200" in rows["B200"]["products"]
    assert {a["name"] for a in data["ambiguous"]} >= {"H100", "A100"}
    table = runner.invoke(app, ["gpus", "--aliases"], env={"COLUMNS": "240"})
    assert table.exit_code == 0 and "NVIDIA-H100-PCIe" in table.stdout
    assert "H100: taken as H100-80GB" in table.stdout
    plain = runner.invoke(app, ["gpus", "--json"])
    assert {"form_factor", "interconnect"} <= set(json.loads(plain.stdout)["gpus"][0])


def test_ambiguous_names_are_said_and_a_gpu_map_settles_them(tmp_path: Path) -> None:
    """Slurm's `h100` GRES (or Ray's H100) names SXM, PCIe and NVL parts alike: the import
    takes it as the catalog says and names the others; --gpu-map h100: H100-PCIE settles it."""
    assert ambiguity("H100") is not None and ambiguity("NVIDIA-H100-PCIe") is None
    (tmp_path / "nodes.txt").write_text(
        "NodeName=h1 Arch=x86_64 CPUTot=64 CPUEfctv=64 Gres=gpu:h100:8(S:0-1) "
        "NodeAddr=10.0.0.1 RealMemory=1000000 State=IDLE Partitions=gpu\n")
    r = runner.invoke(app, ["cluster", "import", "--from", "slurm", str(tmp_path / "nodes.txt"),
                            "--out", str(tmp_path / "c.yaml")])
    assert r.exit_code == 0, r.output
    assert "H100-PCIE" in r.output and "H100-NVL" in r.output and "--gpu-map" in r.output
    (g,) = yaml.safe_load((tmp_path / "c.yaml").read_text())["node_groups"]
    assert g["gpu_type"] == "H100-80GB"
    (tmp_path / "map.yaml").write_text("h100: H100-PCIE\n")
    r = runner.invoke(app, ["cluster", "import", "--from", "slurm", str(tmp_path / "nodes.txt"),
                            "--out", str(tmp_path / "c2.yaml"), "--gpu-map",
                            str(tmp_path / "map.yaml")])
    assert r.exit_code == 0 and "H100-NVL" not in r.output, r.output
    (g,) = yaml.safe_load((tmp_path / "c2.yaml").read_text())["node_groups"]
    assert (g["gpu_type"], g["intra_node_link"]) == ("H100-PCIE", "pcie")


def _node(name: str, labels: dict[str, str], resource: str, gpus: str) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, **labels}}, "spec": {}, "status": {
        "capacity": {"cpu": "64", "memory": "512Gi", resource: gpus},
        "allocatable": {"cpu": "63", "memory": "500Gi", resource: gpus}}}


def test_kubernetes_import_keeps_pcie_nvl_and_amd_parts_apart(tmp_path: Path) -> None:
    items = [_node("pcie-0", {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}, "nvidia.com/gpu",
                   "4"),
             _node("sxm-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                   "nvidia.com/gpu", "8"),
             _node("nvl-0", {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"}, "nvidia.com/gpu",
                   "8"),
             _node("l40s-0", {"nvidia.com/gpu.product": "NVIDIA-L40S"}, "nvidia.com/gpu", "4"),
             _node("mi-0", {"amd.com/gpu.product-name": "AMD_Instinct_MI300X"}, "amd.com/gpu",
                   "8")]
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "List", "items": items}))
    r = runner.invoke(app, ["cluster", "import", "--from", "k8s", str(tmp_path / "nodes.json"),
                            "--out", str(tmp_path / "c.yaml")])
    assert r.exit_code == 0, r.output
    groups = {g["nodes"][0]: g for g in yaml.safe_load((tmp_path / "c.yaml").read_text())[
        "node_groups"]}
    assert {n: (g["gpu_type"], g["intra_node_link"]) for n, g in groups.items()} == {
        "pcie-0": ("H100-PCIE", "pcie"), "sxm-0": ("H100-80GB", "nvlink"),
        "nvl-0": ("H100-NVL", "pcie"), "l40s-0": ("L40S", "pcie"), "mi-0": ("MI300X", "nvlink")}
    assert groups["mi-0"]["gpu_product_label"] == "amd.com/gpu.product-name=AMD_Instinct_MI300X"


def test_a_name_two_entries_would_share_is_refused_by_the_loader(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import apportion.gpus as gpus

    doc = yaml.safe_load(DATA.read_text())
    doc["gpus"][1]["aliases"].append("A100-SXM4-40GB")  # A100-80GB claims a 40 GB name
    monkeypatch.setattr(gpus, "_read", lambda: doc)
    for f in (gpus.gpu_catalog, gpus._alias_map):
        f.cache_clear()
    try:
        with pytest.raises(ValueError, match="A100-SXM4-40GB"):
            gpus.canonical_gpu_name("A100")
    finally:
        monkeypatch.undo()
        for f in (gpus.gpu_catalog, gpus._alias_map):
            f.cache_clear()
