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

Two readings of the files are corrections, each with its evidence:

* the profiles' ZeRO-Offload rows of the models whose trace column is
  "ZeRO-Offload+GC" ran with checkpointing: they are the same measurements as
  the trace's ``zero-offload`` rows (GPT-2 on 4 GPUs: 1715 ms in both files),
  and their backward part exceeds the DP rows' by about one forward pass (T5 on
  2 GPUs: 535 against 341 ms, forward 176 ms);
* :data:`INCONSISTENT` lists trace rows that did not run the stated workload;
  they are never scored and never fitted, and the error tables list them apart.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from apportion.estimation.models.morphling import Arch, Env, MorphlingSample, block_flops_share

from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import ExecutionPlan

GPU = "A800-80GB"
# The testbed (Morphling section 7: servers of 8 A800 GPUs) at nominal figures -- NVLink
# 200 GB/s, 12.5 GB/s per network adapter (50 GB/s a node), PCIe 25 GB/s; the artifact ships no
# measured bandwidth and the fit scales each. Four adapters per node, one per pair of GPUs, is
# read from the traces: for the models whose runs the placement does not slow otherwise, a DP
# step across ``44`` or ``35`` spends half the network time of one across ``26``, ``224``,
# ``2222`` or ``11111111`` (BERT 52-60 against 97-118 ms, GPT-2 0.20-0.23 against 0.45-0.53 s,
# RoBERTa 20-26 against 58-90 ms): a ring runs at the pace of the node driving the fewest
# adapters, two GPUs per adapter.
ENV = Env(intra_GBps=200.0, inter_GBps=50.0, pcie_GBps=25.0, nics_per_node=4, gpus_per_node=8)


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
# (model key, exec_plan, placement) -> why the row is not the configuration it names
INCONSISTENT: dict[tuple[str, str, str], str] = {
    ("roberta", code, "1"): (
        "RoBERTa's 1-GPU rows without checkpointing take the 2-GPU rows' time (ga 0.705 s "
        "against 0.705 s; zero-dp 0.684 against 0.698 s), while with checkpointing the 1-GPU "
        "row takes twice the 2-GPU one (1.760 against 0.926 s): the run processed half the "
        "global batch (the artifact's own validation script feeds this row the 2-GPU forward "
        "time)")
    for code in ("ga", "zero-dp", "zero-offload")
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
        # zero_type: 0 plain DP, 1 ZeRO-Offload (with checkpointing where the trace's column
        # is ZeRO-Offload+GC: see the module docstring), 2 ZeRO-DP
        plan = ExecutionPlan(dp=gpus, zero_stage=2 if zero else 0, offload=zero == 1,
                             checkpointing=zero == 1 and m.offload_gc)
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


@dataclass(frozen=True)
class TraceRow:
    """One measured trace row: its table-2 family, the sample, and what the trace logs besides.

    ``parts`` are the row's logged phases in seconds -- ``fwd`` (forward), ``cc``
    (backward with the overlapped synchronisation) and ``oo`` (optimizer, with the
    offload) -- where the trace has them; the files mix milliseconds and seconds
    row by row, told apart by their sum against the iteration time. They are kept
    for the error tables only: they do not always add up to the iteration (ViT's
    forward part stays at 10-16 ms from 1 to 8 GPUs, while its profile's halves).
    """

    family: str
    sample: MorphlingSample
    code: str
    placement: str
    parts: dict[str, float] = field(default_factory=dict)
    inconsistent: str | None = None


def _parts(r: dict[str, str], t: float) -> dict[str, float]:
    names = {"forward": "fwd", "overlap_sync": "cc", "optimize": "oo"}
    vals = {}
    for col, key in names.items():
        v = r.get(col)
        if v not in (None, ""):
            vals[key] = float(v)
    if not vals:
        return {}
    scale = 1e-3 if sum(vals.values()) > 10 * t else 1.0
    return {k: v * scale for k, v in vals.items() if v > 0}


def trace_records(m: ArtifactModel, root: Path) -> list[TraceRow]:
    """Every measured trace row with a positive time (inconsistent ones flagged)."""
    arch = arch_of(m, root)
    job = _job(m)
    out = []
    for r in _read(root / "traces" / m.trace / "placements.csv"):
        t = float(r["iter_time"])
        if t <= 0:
            continue
        nodes = nodes_from_digits(r["placement"])
        code = r["exec_plan"].strip()
        fam, plan, cpus = plan_of(m, code, sum(nodes))
        if plan.gpus != sum(nodes):
            continue
        placement = "".join(str(n) for n in nodes)
        sample = MorphlingSample(job=job, plan=plan, placement={}, gpu_type=GPU, iter_time_s=t,
                                 cpus=cpus, arch=arch, nodes=nodes)
        out.append(TraceRow(fam, sample, code, placement, _parts(r, t),
                            INCONSISTENT.get((m.key, code, placement))))
    return out


def trace_rows(m: ArtifactModel, root: Path) -> list[tuple[str, MorphlingSample]]:
    """Every consistent measured trace row, as ``(family, sample)``."""
    return [(r.family, r.sample) for r in trace_records(m, root) if r.inconsistent is None]
