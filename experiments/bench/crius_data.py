"""Crius's measured iteration times (``../shared/data/crius/converted/prof_database.json``).

``{'optimal': {'<model>_<params>_<batch>': {'<hosts>_<gpu>_<hosts>_n_<per_host>_d': seconds}}}``:
end-to-end iteration time of the Alpa-tuned best plan; ``-1.0`` marks a
configuration that ran out of memory (see SOURCES.md there).

Cluster facts the database does not carry are stated here (assumptions,
from Crius section 8.1 and the vendors' data sheets): A40 hosts on
InfiniBand ConnectX-5 (100 Gb/s = 12.5 GB/s), A10 hosts on ConnectX-6
(200 Gb/s = 25 GB/s), both with PCIe 4.0 between their GPUs (32 GB/s);
A100 and V100 hosts with NVLink (300 and 150 GB/s) on 25 and 12.5 GB/s
networks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from apportion.cluster import Cluster, NodeGroup

MODEL_MAP = {
    "moe_690M": "moe-0.69b", "moe_1.3B": "moe-1.3b", "moe_2.4B": "moe-2.4b",
    "moe_10B": "moe-10b", "moe_27B": "moe-27b",
    "bert_760M": "bert-0.76b", "bert_1.3B": "bert-1.3b", "bert_2.6B": "bert-2.6b",
    "bert_6.7B": "bert-6.7b",
    "wide_resnet_500M": "wresnet-0.5b", "wide_resnet_1B": "wresnet-1b",
    "wide_resnet_2B": "wresnet-2b", "wide_resnet_4B": "wresnet-4b",
    "wide_resnet_6.8B": "wresnet-6.8b",
}
GPU_MAP = {"a100": "A100-40GB", "v100": "V100-32GB", "a40": "A40", "a10": "A10"}
LINKS = {  # intra link, intra GB/s, inter GB/s
    "a100": ("nvlink", 300.0, 25.0), "v100": ("nvlink", 150.0, 12.5),
    "a40": ("pcie", 32.0, 12.5), "a10": ("pcie", 32.0, 25.0),
}


@dataclass(frozen=True)
class Measured:
    job: str  # '<model>_<params>_<batch>'
    model: str  # catalog name
    batch: int
    gpu: str  # short name (a100, ...)
    hosts: int
    per_host: int
    iter_time_s: float  # -1 for out of memory

    @property
    def gpus(self) -> int:
        return self.hosts * self.per_host

    @property
    def gpu_type(self) -> str:
        return GPU_MAP[self.gpu]

    @property
    def family(self) -> str:
        return self.model.split("-")[0]


def load(root: Path) -> list[Measured]:
    data = json.loads((root / "converted" / "prof_database.json").read_text())["optimal"]
    out: list[Measured] = []
    for job, cfgs in data.items():
        m = re.fullmatch(r"(.+)_(\d+)", job)
        if not m or m.group(1) not in MODEL_MAP:
            continue
        for key, t in cfgs.items():
            k = re.fullmatch(r"(\d+)_([a-z0-9]+)_(\d+)_n_(\d+)_d", key)
            if not k or k.group(2) not in GPU_MAP:
                continue
            out.append(Measured(job, MODEL_MAP[m.group(1)], int(m.group(2)), k.group(2),
                                int(k.group(3)), int(k.group(4)), float(t)))
    return out


def cluster_for(r: Measured) -> Cluster:
    link, intra, inter = LINKS[r.gpu]
    return Cluster(f"crius-{r.gpu}-{r.hosts}x{r.per_host}",
                   [NodeGroup(r.gpu, r.hosts, r.gpu_type, r.per_host, intra_node_link=link,
                              intra_node_bandwidth_GBps=intra, inter_node_bandwidth_GBps=inter)])
