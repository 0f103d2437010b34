"""Ground truth of fine-tuning jobs (YMIR): work to target, speed, and what transfer does.

The simulator (:mod:`apportion.experiments.simulator`) replays fine-tuning traces
like any other: a job needs ``iterations`` steps and runs at ``rate(job, type,
gpus)`` steps per second. What makes fine-tuning different is that *how* a job
runs changes how much work it needs, and YMIR's scheduler chooses how:

* **normal**: alone, from the pretrained backbone;
* **temporal** (``source=``): started from a finished sibling's weights; it needs
  ``(1 - g)`` of its normal work, ``g`` the measured transfer gain (Eqn. 1);
* **spatial** (``members=``): trained as one merged job with sibling tasks (one
  backbone, one head per task, the batches added), until every member reaches
  its target; the members finish together.

The truth expresses a mode as a *rate* in the job's own normal iterations, so
the simulator needs no second notion of work: a temporal job runs ``1/(1-g)``
times faster toward its normal iteration count; a merged lead runs at its
normal iteration count over the merged job's duration. The simulator passes the
mode fixed at a job's first start (``JobState.mode``) to :meth:`FinetuneTruth.rate`.

Where the figures come from (``shared/data/titan-finetune``, Titan's artifact,
the YMIR authors' predecessor system; see its ``SOURCES.md``):

* samples to the target per task: ``max_progress`` of the shipped result tables
  (the same figure in every table: 2.5 passes over the task's dataset); a job
  needs ``samples / batch`` iterations. Tasks without the figure (every ViT task)
  cannot be replayed and are dropped with a note;
* normal epochs to the target: the measured curve of the job's task, learning
  rate and gradient steps (``hpo_task_info``), first epoch at or above the target
  (the curve's length when it never gets there);
* temporal gain ``1 - e_transfer / e_normal``: epochs to the target on the
  measured transfer curve A->B (``transfer_task_info``); a curve that never
  reaches the target counts as ``-1`` (twice the work: negative transfer); an
  unmeasured pair (or a task from itself) transfers nothing (gain 0);
* merged work: ``e_A x S_A/E_A + e_B x S_B/E_B`` samples, ``e_X`` the epochs task X
  takes to reach its target on the measured multi-task curve (``multi_task_info``),
  ``S/E`` each task's samples per epoch; as in Titan's own simulator
  (``MtaskFoundationModelJob`` and ``get_completion_epoch`` in the artifact), a task
  whose merged curve never reaches its target takes the curve's whole length (Titan's
  ``max_epochs``, 10), and the merged job ends when both are done. Unmeasured pairs
  (the same task twice among them) and groups of three or more cannot run merged
  (rate 0). Until this rule, a pair where either task never reached its target could
  not run merged at all, and both tasks were charged the slower one's epochs: 409 of
  the 520 sibling pairs YMIR's merger saw on FM-1 RoBERTa-base were then impossible,
  and ``ymir``'s results equalled ``ymir-temporal``'s to the digit;
* iteration time: :class:`~apportion.estimation.finetune.convergence.ThroughputTable` on
  the V100 profiles (per GPU count, interpolated; placement is not modelled);
  more GPUs than samples in a batch cannot run;
* context-switch cost (``<backbone>_context_switch.csv``): :meth:`switch_s`, the
  simulator's start and restart cost for these replays.
"""

from __future__ import annotations

import csv
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from apportion.estimation.finetune.convergence import ThroughputTable, epochs_to_target
from apportion.experiments.traces import (
    FINETUNE_GPU,
    FinetuneInfo,
    SimJob,
    Trace,
    data_root,
    load_finetune_workload,
)

from apportion.gpus import canonical_gpu_name

log = logging.getLogger(__name__)

#: YMIR section 7's size classes (GPU-hours) and their probabilities
SIZE_CLASSES = {"small": (0.05, 0.5), "medium": (0.5, 10.0), "large": (10.0, 64.0)}
SIZE_PROBS = {"small": 0.3, "medium": 0.6, "large": 0.1}


def finetune_root() -> Path:
    return data_root() / "titan-finetune"


@dataclass
class FinetuneData:
    """Curves, sizes, speeds and switch cost of one backbone, read once."""

    fm: str
    hpo: dict[str, Any]
    transfer: dict[str, Any]
    multi: dict[str, Any]
    samples_to_target: dict[str, float]
    table: ThroughputTable
    switch_s: float

    @classmethod
    def load(cls, fm: str, root: Path | None = None, gpu: str = "V100") -> FinetuneData:
        data = root or finetune_root()
        conv = data / "converted"
        hpo = json.loads((conv / "hpo_task_info.json").read_text())[fm]
        tr = json.loads((conv / "transfer_task_info.json").read_text())[fm]
        mt = json.loads((conv / "multi_task_info.json").read_text())[fm]
        cs = data / "fminfo" / gpu / f"{fm}_context_switch.csv"
        with cs.open() as fh:
            switch = float(next(csv.DictReader(fh))["time_cost"])
        table = ThroughputTable.from_fminfo(data / "fminfo" / gpu, fm)
        return cls(fm, hpo, tr, mt, samples_to_target(data), table, switch)

    @staticmethod
    def _metric(curve: Mapping[str, Any], prefix: str = "") -> list[float]:
        keys = [k for k in curve if k.startswith(prefix) and "eval_" in k
                and not k.endswith("_epoch")]
        return list(curve[keys[0]]) if keys else []

    def normal_epochs(self, info: FinetuneInfo) -> float | None:
        """Epochs to the target on the measured normal curve (its length if never reached)."""
        curve = self._metric(self.hpo.get(info.task, {}).get(info.lr, {}).get(info.steps, {}))
        if not curve:
            return None
        return epochs_to_target(curve, info.target) or float(len(curve))

    def temporal_gain(self, src: FinetuneInfo, dst: FinetuneInfo) -> float:
        """Measured gain of ``dst`` started from ``src``'s weights (0: unmeasured)."""
        normal = self.normal_epochs(dst)
        key = f"{src.task},{dst.task}"
        if normal is None or src.task == dst.task or key not in self.transfer:
            return 0.0
        e = epochs_to_target(self._metric(self.transfer[key]), dst.target)
        return -1.0 if e is None else 1.0 - e / normal

    def spatial_epochs(self, a: FinetuneInfo, b: FinetuneInfo) -> tuple[float, float] | None:
        """Epochs each task of the merged pair takes to its target on the measured
        multi-task curve, the curve's length where it never gets there (Titan's
        ``max_epochs``); None: the pair is unmeasured (or the same task twice)."""
        key = f"{a.task},{b.task}" if f"{a.task},{b.task}" in self.multi else f"{b.task},{a.task}"
        if a.task == b.task or key not in self.multi:
            return None
        ca = self._metric(self.multi[key], f"{a.task}_")
        cb = self._metric(self.multi[key], f"{b.task}_")
        if not ca or not cb:
            return None
        return (epochs_to_target(ca, a.target) or float(len(ca)),
                epochs_to_target(cb, b.target) or float(len(cb)))


@cache
def _samples_to_target(root: str) -> dict[str, float]:
    sizes: dict[str, float] = {}
    for res in sorted((Path(root) / "results").glob("*/*.csv")):
        with res.open() as fh:
            for r in csv.DictReader(fh):
                sizes[r["name"].rsplit("-", 1)[0].split("@")[1]] = float(r["max_progress"])
    return sizes


def samples_to_target(root: Path | None = None) -> dict[str, float]:
    """Samples to the target per task (``max_progress`` of the shipped result tables)."""
    return dict(_samples_to_target(str(root or finetune_root())))


class FinetuneTruth:
    """Ground truth of fine-tuning traces: iterations to target, steps/s per mode."""

    name = "titan-finetune"

    def __init__(self, root: str | Path | None = None, gpu: str = "V100") -> None:
        self.root = Path(root) if root else finetune_root()
        self.gpu = gpu
        self.gpu_type = canonical_gpu_name(FINETUNE_GPU if gpu == "V100" else gpu)
        self.interpolated: set[tuple[Any, ...]] = set()
        self._data: dict[str, FinetuneData] = {}
        self._memo: dict[tuple[Any, ...], float] = {}

    def data(self, backbone: str) -> FinetuneData:
        if backbone not in self._data:
            self._data[backbone] = FinetuneData.load(backbone, self.root, self.gpu)
        return self._data[backbone]

    def switch_s(self, backbone: str) -> float:
        """Measured context-switch time of ``backbone`` (s): a start or restart."""
        return self.data(backbone).switch_s

    # -- work ------------------------------------------------------------------------
    def normal_iterations(self, job: SimJob) -> float | None:
        info = job.finetune
        if info is None:
            return None
        s = self.data(info.backbone).samples_to_target.get(info.task)
        return None if s is None else s / max(1, job.batch)

    def with_iterations(self, trace: Trace) -> Trace:
        """The trace with each job's iterations to target; jobs of tasks without a size
        figure are dropped (noted)."""
        out, missing = [], set()
        for j in trace.jobs:
            n = self.normal_iterations(j)
            if n is None:
                missing.add(j.job_type)
                continue
            out.append(replace(j, iterations=float(n)))
        notes = list(trace.notes)
        if missing:
            notes.append(f"dropped {len(trace.jobs) - len(out)} jobs of tasks without a "
                         f"samples-to-target figure: {', '.join(sorted(missing))}")
            log.warning("%s: %s", trace.name, notes[-1])
        return replace(trace, jobs=out, notes=notes)  # its format and substitutions kept

    # -- speed -----------------------------------------------------------------------
    def iteration_time(self, backbone: str, gpus: int, batch: int) -> float | None:
        if gpus < 1 or gpus > batch:
            return None
        table = self.data(backbone).table
        if gpus not in table.table:
            self.interpolated.add((backbone, gpus, batch))
        return table.iteration_time(gpus, batch)

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             source: SimJob | None = None, members: Sequence[SimJob] = ()) -> float:
        """Steps/s of ``job`` in its own normal iterations: alone, from ``source``'s
        weights, or as the lead of a job merged with ``members`` (0: cannot run so)."""
        info = job.finetune
        if info is None or canonical_gpu_name(gpu_type) != self.gpu_type:
            return 0.0
        key = (job.job_id, gpus, source.job_id if source else None,
               tuple(m.job_id for m in members))
        got = self._memo.get(key)
        if got is None:
            got = self._rate(job, info, gpus, source, tuple(members))
            self._memo[key] = got
        return got

    def _rate(self, job: SimJob, info: FinetuneInfo, gpus: int, source: SimJob | None,
              members: tuple[SimJob, ...]) -> float:
        data = self.data(info.backbone)
        if members:
            return self._merged_rate(job, info, gpus, members)
        t = self.iteration_time(info.backbone, gpus, job.batch)
        if t is None or t <= 0:
            return 0.0
        if source is not None and source.finetune is not None \
                and source.finetune.backbone == info.backbone:
            g = data.temporal_gain(source.finetune, info)
            return 1.0 / (t * (1.0 - g))
        return 1.0 / t

    def _merged_rate(self, lead: SimJob, a: FinetuneInfo, gpus: int,
                     members: tuple[SimJob, ...]) -> float:
        if len(members) != 1 or members[0].finetune is None:
            return 0.0  # only pairs are measured
        other = members[0]
        b = other.finetune
        assert b is not None
        if b.backbone != a.backbone:
            return 0.0
        data = self.data(a.backbone)
        e = data.spatial_epochs(a, b)
        ea, eb = data.normal_epochs(a), data.normal_epochs(b)
        sa, sb = data.samples_to_target.get(a.task), data.samples_to_target.get(b.task)
        if e is None or not ea or not eb or sa is None or sb is None:
            return 0.0
        batch = lead.batch + other.batch
        t = self.iteration_time(a.backbone, gpus, batch)
        if t is None or t <= 0:
            return 0.0
        merged_iterations = (e[0] * sa / ea + e[1] * sb / eb) / batch
        return (sa / max(1, lead.batch)) / (merged_iterations * t)


# ---------------------------------------------------------------------------------------
# YMIR's workload recipe and the shipped result tables
# ---------------------------------------------------------------------------------------
def generated_trace(n_jobs: int = 120, fm: str = "roberta-base", seed: int = 0,
                    root: Path | None = None) -> Trace:
    """YMIR section 7's recipe: FMTrace-like arrivals, small/medium/large at 0.3/0.6/0.1.

    Job templates (task, learning rate, steps, batch, target, requested GPUs) are the
    rows of every shipped ``FM-*`` workload of this backbone; a job's size is its GPU
    time on one GPU (iterations to target x one-GPU iteration time). Arrivals are
    Poisson at the mean rate of the shipped workloads (FMTrace's own timestamps are
    not in the data). Each job draws a size class, then a template whose GPU time
    falls in that class (the nearest one when none does). Iterations are left to
    :meth:`FinetuneTruth.with_iterations`.
    """
    data_dir = root or finetune_root()
    truth = FinetuneTruth(data_dir)
    rows: list[SimJob] = []
    for wl in sorted((data_dir / "traces").glob(f"FM-*-{fm}/workload-0.csv")):
        rows.extend(j for j in load_finetune_workload(wl).jobs
                    if truth.normal_iterations(j) is not None)
    if not rows:
        raise ValueError(f"no workload rows with size figures for {fm}")
    subs = sorted(j.submit_s for j in rows)
    rate = max(1e-6, (len(subs) - 1) / max(1.0, subs[-1] - subs[0]))  # arrivals per second

    def gpu_hours(j: SimJob) -> float:
        t = truth.iteration_time(fm, 1, j.batch) or 0.0
        return (truth.normal_iterations(j) or 0.0) * t / 3600.0

    sized = [(gpu_hours(j), j) for j in rows]
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n_jobs):
        t += rng.expovariate(rate)
        cls_ = rng.choices(list(SIZE_PROBS), weights=list(SIZE_PROBS.values()))[0]
        lo, hi = SIZE_CLASSES[cls_]
        inside = [j for h, j in sized if lo <= h < hi]
        tpl = rng.choice(inside) if inside else min(
            sized, key=lambda hj: min(abs(hj[0] - lo), abs(hj[0] - hi)))[1]
        assert tpl.finetune is not None
        jobs.append(replace(tpl, job_id=f"gen-{i}-{tpl.finetune.task}-{cls_}",
                            submit_s=round(t, 3)))
    return Trace(f"fm-generated-{fm}-{n_jobs}-s{seed}", jobs, f"{data_dir}#generated",
                 [f"YMIR recipe: {n_jobs} jobs, seed {seed}, Poisson {rate * 3600:.2f}/h"],
                 "finetune")  # its truth is the fine-tuning truth, as the FM traces'


def reference_avg_jct(trace: str, root: Path | None = None) -> dict[str, float]:
    """Average JCT (completion - submission) of each shipped result table for ``trace``
    (``FM-1-roberta-base``: srtf, tiresias, themis, optimus, pollux and Titan's
    ``titan[multi-task-transfer]`` runs)."""
    data = root or finetune_root()
    out: dict[str, float] = {}
    for path in sorted((data / "results").glob(f"{trace}*/*.csv")):
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        label = path.stem if path.parent.name == trace else \
            f"{path.stem}[{path.parent.name[len(trace) + 1:]}]"
        out[label] = sum(float(r["completion_time"]) - float(r["submission_time"])
                         for r in rows) / len(rows)
    return out
