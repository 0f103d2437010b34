"""Morphling's artifact data as apportion samples: fitting profiles and measured traces.

Files (see ``../shared/data/morphling/SOURCES.md``): ``profile/<model>/config.csv``
and ``data.csv`` (row-aligned; times in **milliseconds**; UTF-8 files with a
byte-order mark) and ``traces/<model>/placements.csv`` (``iter_time`` in
**seconds**; ``exec_plan`` is ``ga``, ``gc``, ``zero-dp``, ``zero-offload`` or a
3-digit PP-TP-DP code; ``placement`` is a digit string of GPUs per node).

Per model facts that the CSVs do not carry (global batch, layer count) are
taken from the artifact's validation scripts
(``artifact/71_performance_model/model/validate_*.py``: ``BATCH_SIZE`` and
``SEQ_HID``), commit d616cd50 of github.com/AlibabaPAI/reconfigurable-dl-scheduler.
Where a script does not give the batch (ViT, RoBERTa) the value only sets the
unit of the forward curve: those models have DP-family plans only, whose
predictions depend on the batch per GPU relative to the profile.

Plan mapping: ``ga`` is the table-2 "DP" column (the validation script compares
its DP predictions with exactly these rows), modelled as DP with one
accumulation step; ``gc`` DP with checkpointing; ``zero-dp`` ZeRO stage 2;
``zero-offload`` ZeRO-Offload with 4 CPU threads per GPU as in the profile (and
checkpointing for models of 1B parameters and more: the table-2 column is
"ZeRO-Offload+GC" there); ``PTD`` codes 3D parallelism with the replica's whole
batch as one micro-batch (``m = 1``; see :func:`plan_of`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from apportion.estimation.models.morphling import Arch, MorphlingSample, block_flops_share

from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import ExecutionPlan

GPU = "A800-80GB"


@dataclass(frozen=True)
class ArtifactModel:
    key: str
    profile: str
    trace: str
    batch: int
    layers: int
    catalog: str
    offload_gc: bool
    note: str = ""


MODELS: dict[str, ArtifactModel] = {
    "vit": ArtifactModel("vit", "vit", "vit", 64, 12, "vit-86m", False,
                         "batch not in the artifact; DP-family plans only"),
    "roberta": ArtifactModel("roberta", "roberta", "roberta", 32, 24, "roberta-355m", False,
                             "batch not in the artifact; DP-family plans only"),
    "bert": ArtifactModel("bert", "bert", "bert", 32, 24, "bert-336m", False),
    "t5": ArtifactModel("t5", "t5", "t5", 16, 32, "t5-1.2b", True),
    "gpt2": ArtifactModel("gpt2", "gpt2", "gpt2", 16, 48, "gpt2-1.5b", True),
    "llama7": ArtifactModel("llama7", "llama7b", "llama7", 8, 32, "llama2-7b", True,
                            "its profile has three ZeRO-Offload rows only"),
}
SKIPPED = {"llama30": "the artifact's llama30b profile is a byte copy of llama7b's: "
                      "there are no LLaMA-30B fitting samples to fit from"}


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:  # BOM-tolerant
        return [dict(r) for r in csv.DictReader(fh)]


def nodes_from_digits(placement: str) -> tuple[int, ...]:
    return tuple(int(ch) for ch in placement.strip() if ch.isdigit() and int(ch) > 0)


def arch_of(m: ArtifactModel, root: Path) -> Arch:
    rows = _read(root / "profile" / m.profile / "config.csv")
    params = float(rows[0]["parameter_size"]) * 2**20
    seq_hid = float(rows[0]["seq_hid"])
    return Arch(m.catalog, params, seq_hid, m.layers,
                recompute_share=block_flops_share(get_model(m.catalog)))


def _job(m: ArtifactModel) -> JobSpec:
    return JobSpec(id=f"morphling-{m.key}", model=m.catalog, global_batch_size=m.batch,
                   iterations=1, requested_gpus=1, requested_gpu_type=GPU)


def profile_samples(m: ArtifactModel, root: Path) -> list[MorphlingSample]:
    """The artifact's fitting samples (ms -> s)."""
    cfg = _read(root / "profile" / m.profile / "config.csv")
    dat = _read(root / "profile" / m.profile / "data.csv")
    arch = arch_of(m, root)
    job = _job(m)
    out = []
    for c, d in zip(cfg, dat):
        gpus = int(c["gpus"])
        zero = int(c["zero_type"])
        plan = ExecutionPlan(dp=gpus, zero_stage=2 if zero else 0, offload=zero == 1)
        nodes = tuple([gpus // int(c["nodes"])] * int(c["nodes"]))
        out.append(MorphlingSample(job=job, plan=plan, placement={}, gpu_type=GPU,
                                   iter_time_s=float(d["iter_time"]) / 1e3,
                                   cpus=int(c["num_cpu_threads"]),
                                   fwd_s=float(d["forward_time"]) / 1e3,
                                   cc_s=float(d["Tcc"]) / 1e3, oo_s=float(d["Topt"]) / 1e3,
                                   arch=arch, nodes=nodes))
    return out


def plan_of(m: ArtifactModel, code: str, gpus: int) -> tuple[str, ExecutionPlan, int]:
    """``(family, plan, cpus)`` for one trace row."""
    code = code.strip()
    if code == "ga":
        return "DP", ExecutionPlan(dp=gpus), 1
    if code == "gc":
        return "GC", ExecutionPlan(dp=gpus, checkpointing=True), 1
    if code == "zero-dp":
        return "ZeRO-DP+GA", ExecutionPlan(dp=gpus, zero_stage=2), 1
    if code == "zero-offload":
        fam = "ZeRO-Offload+GC" if m.offload_gc else "ZeRO-Offload"
        return fam, ExecutionPlan(dp=gpus, zero_stage=2, offload=True,
                                  checkpointing=m.offload_gc), 4
    if len(code) == 3 and code.isdigit():
        p, t, d = (int(ch) for ch in code)
        fam = "TP+PP" if d == 1 else "DP+TP+PP"
        # one micro-batch per replica: the artifact's 3D cost function takes the replica's
        # whole batch (``local_bsz // dp``) as the unit that crosses stages, and its measured
        # PP times do not fall as stages are added (T5: 2.71, 2.83, 2.95 s on 4, 6, 8 stages),
        # which a pipelined schedule (m + p - 1 slots of 1/m) would
        return fam, ExecutionPlan(dp=d, tp=t, pp=p, micro_batches=1), 1
    raise ValueError(f"unknown exec_plan {code!r}")


def trace_rows(m: ArtifactModel, root: Path) -> list[tuple[str, MorphlingSample]]:
    """Every measured trace row with a positive time, as ``(family, sample)``."""
    arch = arch_of(m, root)
    job = _job(m)
    out = []
    for r in _read(root / "traces" / m.trace / "placements.csv"):
        t = float(r["iter_time"])
        if t <= 0:
            continue
        nodes = nodes_from_digits(r["placement"])
        fam, plan, cpus = plan_of(m, r["exec_plan"], sum(nodes))
        if plan.gpus != sum(nodes):
            continue
        out.append((fam, MorphlingSample(job=job, plan=plan, placement={}, gpu_type=GPU,
                                         iter_time_s=t, cpus=cpus, arch=arch, nodes=nodes)))
    return out
