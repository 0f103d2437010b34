"""Catalog formulas against published parameter counts and closed forms."""

from __future__ import annotations

import networkx as nx
import pytest

from apportion.errors import CatalogError
from apportion.gpus import canonical_gpu_name, get_gpu, gpu_catalog
from apportion.models import MODEL_NAMES, get_model, transformer, wide_resnet

REQUIRED_GPUS = ["A100-40GB", "A100-80GB", "A800-80GB", "H100-80GB", "H200", "A40", "A10",
                 "V100-32GB", "L4", "T4"]


def test_gpu_catalog_has_required_types_with_sane_figures() -> None:
    cat = gpu_catalog()
    for name in REQUIRED_GPUS:
        g = cat[name]
        assert g.memory_gib > 0 and g.half_tflops > g.fp32_tflops > 0
        assert g.hbm_GBps > 0 and g.link in ("nvlink", "pcie")
    assert get_gpu("a100").name == "A100-40GB"
    assert get_gpu("H100").memory_gib == 80
    assert cat["H100-80GB"].half_tflops > cat["A100-40GB"].half_tflops > cat["V100-32GB"].fp32_tflops
    with pytest.raises(CatalogError):
        canonical_gpu_name("B300-imaginary")


# Published parameter counts (model cards / papers), tolerance 1.5 %.
PUBLISHED = {
    "bert-336m": 335e6,      # BERT-large (Devlin et al.)
    "roberta-base": 124.6e6,  # RoBERTa-base (Hugging Face model card: 125M)
    "roberta-355m": 355.4e6,  # RoBERTa-large
    "vit-base": 86.6e6,       # ViT-B/16 (Dosovitskiy et al.)
    "vit-86m": 86.6e6,
    "gpt2-1.5b": 1.558e9,     # GPT-2 XL
    "llama2-7b": 6.738e9,     # LLaMA-2-7B (Touvron et al.)
    "vicuna-7b": 6.738e9,     # Vicuna-7B is a LLaMA-7B fine-tune
    "llama-30b": 32.5e9,      # LLaMA-30B (32.5B in Touvron et al. 2023)
    "bert-0.76b": 0.76e9,     # Alpa's 760M GPT/BERT configuration (Crius table 2)
    "bert-1.3b": 1.3e9,
    "bert-2.6b": 2.6e9,
    "bert-6.7b": 6.7e9,
}


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_parameter_counts_match_published(name: str, count: float) -> None:
    assert get_model(name).params == pytest.approx(count, rel=0.025)


def test_resnet_closed_form_matches_torchvision_resnet50() -> None:
    # Alpa's WResNet with width 1 and 64 base filters is ResNet-50: 25.557M parameters and
    # about 4.1 GMACs at 224x224 (torchvision's published figures).
    m = wide_resnet("resnet50", filters=64, width=1, classes=1000)
    assert m.params == pytest.approx(25.557e6, rel=0.005)
    assert m.flops_per_sample / 2 == pytest.approx(4.09e9, rel=0.03)


@pytest.mark.parametrize("name,label", [("wresnet-0.5b", 0.5e9), ("wresnet-1b", 1e9),
                                        ("wresnet-2b", 2e9), ("wresnet-4b", 4e9),
                                        ("wresnet-6.8b", 6.8e9)])
def test_wide_resnet_sizes_match_alpa_labels(name: str, label: float) -> None:
    # Alpa's definition widens only the 3x3 convolution; its size labels follow from it.
    assert get_model(name).params == pytest.approx(label, rel=0.025)


def test_crius_sizes_are_ordered_and_near_their_labels() -> None:
    for family, names in {
        "wresnet": ["wresnet-0.5b", "wresnet-1b", "wresnet-2b", "wresnet-4b", "wresnet-6.8b"],
        "moe": ["moe-0.69b", "moe-1.3b", "moe-2.4b", "moe-10b", "moe-27b"],
    }.items():
        params = [get_model(n).params for n in names]
        assert params == sorted(params), family
        for n, p in zip(names, params):
            label = float(n.split("-")[1].rstrip("b"))
            assert 0.8 * label * 1e9 <= p <= 1.1 * label * 1e9, (n, p)


def test_transformer_block_flops_closed_form() -> None:
    # one standard block: 24 s h^2 + 4 s^2 h forward FLOPs per sample (biases aside)
    s, h = 512, 1024
    m = transformer("t", "bert", layers=1, hidden=h, heads=16, seq=s, vocab=1000, positions=s)
    block = m.layer("block0")
    assert block["flops"] == pytest.approx(24 * s * h * h + 4 * s * s * h, rel=0.01)
    assert block["params"] == pytest.approx(12 * h * h, rel=0.01)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_layer_graph_is_a_chain_with_edge_bytes(name: str) -> None:
    m = get_model(name)
    g = m.graph
    assert nx.is_directed_acyclic_graph(g)
    assert list(nx.topological_sort(g)) == list(m.layers)
    for u, v, d in g.edges(data=True):
        assert d["bytes"] == g.nodes[u]["out_bytes"] > 0
    for n in m.layers:
        assert g.nodes[n]["flops"] >= 0 and g.nodes[n]["params"] >= 0
    assert m.flops_per_sample > 0


def test_unknown_model_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="unknown model"):
        get_model("gpt-5-ultra")


def test_cpu_sizes_are_small() -> None:
    for name in ("gpt-tiny", "bert-tiny", "vit-tiny"):
        assert get_model(name).params < 5e6
