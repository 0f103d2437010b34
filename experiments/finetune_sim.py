"""Fine-tuning trace replay (YMIR §7): merger vs SRTF, Tiresias, Optimus, Themis, normal-only.

Self-contained round-based simulator for the titan-finetune data (the lead's
general simulator will replace the loop later). What comes from the data:

* jobs: ``traces/FM-*/workload-0.csv`` (arrival, task, requested GPUs, batch, lr,
  gradient steps, target metric);
* work to target: samples to the target per task (``max_progress`` of the shipped
  result tables — the only per-task size figure in the data) split by the epochs
  the measured normal curve (``hpo_task_info``, the job's lr and steps) needs;
* transfer gains, ground truth: epochs to the target in the measured transfer
  curves (``transfer_task_info``) and merged curves (``multi_task_info``) over the
  normal epochs (Eqn. 1) — the scheduler sees the same figure plus optional noise
  (``gain_noise``), standing in for the Task2Vec prediction on datasets not shipped;
* iteration time: :class:`ThroughputTable` on the V100 profiles; every allocation
  change costs the measured context-switch time.

Policies: ``srtf``, ``tiresias`` (2-queue LAS), ``themis`` (finish-time fairness)
on requested GPUs; ``optimus`` (elastic, marginal gain); ``normal`` (elastic SRTF,
no transfer); ``ymir`` (elastic SRTF plus temporal transfer from a finished
sibling and spatial merges chosen by the merger rule of
:func:`apportion.solvers.finetune.greedy_modes`); ``ymir-temporal`` (transfer only).
"""

from __future__ import annotations

import csv
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.estimation.convergence import ThroughputTable, epochs_to_target
from apportion.solvers.finetune import greedy_modes

from apportion.finetune_spec import problem_from_lists

log = logging.getLogger(__name__)

def _data_root() -> Path:
    from apportion.experiments.traces import data_root

    return data_root() / "titan-finetune"


DATA = _data_root()
POLICIES = ("srtf", "tiresias", "themis", "optimus", "normal", "ymir-temporal", "ymir")
#: which shipped table each policy sits next to (titan[A-B]: multi-task A, transfer B)
REFERENCE = {"srtf": "srtf", "tiresias": "tiresias", "themis": "themis", "optimus": "optimus",
             "ymir-temporal": "titan[False-True]", "ymir": "titan[True-True]"}
MIN_LOCAL_BSZ = 8  # batch-size-scaled GPU limit: at least 8 samples per GPU


@dataclass
class SimJob:
    name: str
    submit: float
    fm: str
    tasks: tuple[str, ...]
    requested: int
    batch: int
    samples: float  # samples to target (remaining)
    epochs: float
    limit: int
    gpus: int = 0
    blocked_until: float = 0.0
    attained: float = 0.0  # GPU-seconds
    started: bool = False
    finish: float | None = None
    members: list[SimJob] = field(default_factory=list)  # merged: the original jobs


@dataclass
class FinetuneData:
    """Curves, gains and sizes of one backbone, read once."""

    fm: str
    hpo: dict[str, Any]
    transfer: dict[str, Any]
    multi: dict[str, Any]
    samples_to_target: dict[str, float]
    table: ThroughputTable
    switch_s: float

    @classmethod
    def load(cls, fm: str, data: Path = DATA, gpu: str = "V100") -> FinetuneData:
        conv = data / "converted"
        hpo = json.loads((conv / "hpo_task_info.json").read_text())[fm]
        tr = json.loads((conv / "transfer_task_info.json").read_text())[fm]
        mt = json.loads((conv / "multi_task_info.json").read_text())[fm]
        sizes: dict[str, float] = {}
        for res in sorted((data / "results").glob("*/*.csv")):
            with res.open() as fh:
                for r in csv.DictReader(fh):
                    sizes[r["name"].rsplit("-", 1)[0].split("@")[1]] = float(r["max_progress"])
        cs = data / "fminfo" / gpu / f"{fm}_context_switch.csv"
        with cs.open() as fh:
            switch = float(next(csv.DictReader(fh))["time_cost"])
        table = ThroughputTable.from_fminfo(data / "fminfo" / gpu, fm)
        return cls(fm, hpo, tr, mt, sizes, table, switch)

    @staticmethod
    def _metric(curve: dict[str, Any], prefix: str = "") -> list[float]:
        keys = [k for k in curve if k.startswith(prefix) and "eval_" in k and not k.endswith("_epoch")]
        return list(curve[keys[0]]) if keys else []

    def normal_epochs(self, task: str, lr: str, steps: str, target: float) -> float:
        curve = self._metric(self.hpo[task][lr][steps])
        return epochs_to_target(curve, target) or float(len(curve) or 10)

    def temporal_gain(self, src: str, dst: str, target: float, normal: float) -> float:
        key = f"{src},{dst}"
        if key not in self.transfer:
            return -1.0
        e = epochs_to_target(self._metric(self.transfer[key]), target)
        return -1.0 if e is None else 1.0 - e / normal

    def spatial_epochs(self, a: str, b: str, ta: float, tb: float) -> float | None:
        key = f"{a},{b}" if f"{a},{b}" in self.multi else f"{b},{a}"
        if key not in self.multi:
            return None
        ea = epochs_to_target(self._metric(self.multi[key], f"{a}_"), ta)
        eb = epochs_to_target(self._metric(self.multi[key], f"{b}_"), tb)
        return None if ea is None or eb is None else max(ea, eb)


def load_trace(path: Path, data: FinetuneData, capacity: int) -> list[SimJob]:
    jobs = []
    with path.open() as fh:
        for r in csv.DictReader(fh):
            fm, task = r["application"].split("@")
            if task not in data.samples_to_target:
                log.warning("%s: no size figure for %s, skipped", path, task)
                continue
            epochs = data.normal_epochs(task, r["target_lr"], r["target_gradient_steps"],
                                        float(r["target_metric"]))
            batch = int(r["target_batch_size"])
            job = SimJob(r["name"], float(r["submission_time"]), fm, (task,), int(r["num_gpus"]),
                         batch, data.samples_to_target[task], epochs,
                         min(capacity, max(1, batch // MIN_LOCAL_BSZ)))
            job.target = float(r["target_metric"])  # type: ignore[attr-defined]
            jobs.append(job)
    return jobs


SIZE_CLASSES = {"small": (0.05, 0.5), "medium": (0.5, 10.0), "large": (10.0, 64.0)}  # GPU-hours
SIZE_PROBS = {"small": 0.3, "medium": 0.6, "large": 0.1}  # YMIR section 7


def generate_workload(data: FinetuneData, n_jobs: int, capacity: int, seed: int = 0,
                      data_root: Path = DATA) -> list[SimJob]:
    """YMIR's recipe: FMTrace-like arrivals, small/medium/large jobs at 0.3/0.6/0.1.

    Job templates (task, learning rate, steps, batch, target, requested GPUs) are
    the rows of every shipped ``FM-*`` workload of this backbone; a job's size is
    its GPU time on one GPU (samples to target x step time / batch). Arrivals are
    Poisson at the mean rate of the shipped workloads (FMTrace's own timestamps
    are not in the data). Each job draws a size class, then a template whose GPU
    time falls in that class (the nearest one when none does).
    """
    rows: list[dict[str, str]] = []
    for wl in sorted((data_root / "traces").glob(f"FM-*-{data.fm}/workload-0.csv")):
        with wl.open() as fh:
            rows.extend(r for r in csv.DictReader(fh)
                        if r["application"].split("@")[1] in data.samples_to_target)
    if not rows:
        raise ValueError(f"no workload rows with size figures for {data.fm}")
    subs = sorted(float(r["submission_time"]) for r in rows)
    rate = max(1e-6, (len(subs) - 1) / max(1.0, subs[-1] - subs[0]))  # arrivals per second

    def gpu_hours(r: dict[str, str]) -> float:
        task = r["application"].split("@")[1]
        batch = int(r["target_batch_size"])
        return data.samples_to_target[task] / batch * data.table.step_time(1, batch) / 3600.0

    sized = [(gpu_hours(r), r) for r in rows]
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n_jobs):
        t += rng.expovariate(rate)
        cls_ = rng.choices(list(SIZE_PROBS), weights=list(SIZE_PROBS.values()))[0]
        lo, hi = SIZE_CLASSES[cls_]
        inside = [r for h, r in sized if lo <= h < hi]
        r = rng.choice(inside) if inside else min(sized, key=lambda hr: min(abs(hr[0] - lo),
                                                                             abs(hr[0] - hi)))[1]
        task = r["application"].split("@")[1]
        batch = int(r["target_batch_size"])
        epochs = data.normal_epochs(task, r["target_lr"], r["target_gradient_steps"],
                                    float(r["target_metric"]))
        job = SimJob(f"gen-{i}-{task}", t, data.fm, (task,), int(r["num_gpus"]), batch,
                     data.samples_to_target[task], epochs,
                     min(capacity, max(1, batch // MIN_LOCAL_BSZ)))
        job.target = float(r["target_metric"])  # type: ignore[attr-defined]
        job.size_class = cls_  # type: ignore[attr-defined]
        jobs.append(job)
    return jobs


def compare_generated(fm: str = "roberta-base", n_jobs: int = 120, capacity: int = 32,
                      seed: int = 0, round_s: float = 60.0,
                      policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    """Every policy on a workload generated by :func:`generate_workload`."""
    fdata = FinetuneData.load(fm, DATA)
    ours: dict[str, float] = {}
    for pol in policies:
        jobs = generate_workload(fdata, n_jobs, capacity, seed)
        jct = Simulator(jobs, fdata, pol, capacity, round_s).run()
        ours[pol] = sum(jct.values()) / max(1, len(jct))
    return {"trace": f"generated-{fm}-{n_jobs}-s{seed}", "capacity": capacity, "round_s": round_s,
            "avg_jct_s": ours, "reference_avg_jct_s": {}}


class Simulator:
    """Round-based replay: a policy sets GPUs per job each round; jobs run at profiled speed."""

    def __init__(self, jobs: list[SimJob], data: FinetuneData, policy: str, capacity: int = 32,
                 round_s: float = 60.0, gain_noise: float = 0.0, seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {POLICIES}")
        self.pending = sorted(jobs, key=lambda j: j.submit)
        self.data, self.policy, self.capacity, self.round_s = data, policy, capacity, round_s
        self.active: list[SimJob] = []
        self.done: list[SimJob] = []
        self.finished_tasks: set[str] = set()
        self.rng = random.Random(seed)
        self.gain_noise = gain_noise

    def speed(self, job: SimJob, gpus: int) -> float:
        """Samples per second at ``gpus`` GPUs."""
        return 0.0 if gpus <= 0 else job.batch / self.data.table.iteration_time(gpus, job.batch)

    def remaining_time(self, job: SimJob, gpus: int) -> float:
        return job.samples / self.speed(job, max(1, gpus))

    # -- YMIR's modes ---------------------------------------------------------------
    def _predicted(self, g: float) -> float:
        return g + (self.rng.gauss(0.0, self.gain_noise) if self.gain_noise else 0.0)

    def _apply_temporal(self, job: SimJob) -> None:
        """Start from the best finished sibling's weights when predicted positive."""
        best, gain = None, 0.0
        for src in self.finished_tasks:
            g = self.data.temporal_gain(src, job.tasks[0], job.target, job.epochs)  # type: ignore[attr-defined]
            if self._predicted(g) > gain:
                best, gain = src, g
        if best is not None:
            true = self.data.temporal_gain(best, job.tasks[0], job.target, job.epochs)  # type: ignore[attr-defined]
            job.samples *= max(0.0, 1.0 - true)

    def _merge_queued(self) -> None:
        """Merger rule over unstarted single jobs (the table-9 model, greedy_modes)."""
        queued = [j for j in self.active if not j.started and not j.members][:6]
        if len(queued) < 2:
            return
        spatial: dict[str, float] = {}
        merged_epochs: dict[frozenset[str], float] = {}
        for i, a in enumerate(queued):
            for b in queued[i + 1:]:
                if a.tasks[0] == b.tasks[0]:
                    continue
                e = self.data.spatial_epochs(a.tasks[0], b.tasks[0], a.target, b.target)  # type: ignore[attr-defined]
                if e is None:
                    continue
                g = 1.0 - e / max(a.epochs, b.epochs)
                if self._predicted(g) > 0:
                    spatial[f"{a.name}||{b.name}"] = round(min(0.95, self._predicted(g)), 6)
                    merged_epochs[frozenset((a.name, b.name))] = e
        if not spatial:
            return
        rows = [(j.name, round(j.epochs, 6), round(self.remaining_time(j, 1) / j.epochs, 6),
                 j.limit) for j in queued]
        sched, _ = greedy_modes(problem_from_lists(rows, None, spatial), self.capacity)
        for unit in sched.units:
            if unit.mode != "spatial":
                continue
            a, b = (next(j for j in queued if j.name == m) for m in unit.members)
            e = merged_epochs[frozenset((a.name, b.name))]
            per_epoch = a.samples / a.epochs + b.samples / b.epochs
            batch = a.batch + b.batch
            m = SimJob(f"{a.name}||{b.name}", min(a.submit, b.submit), a.fm, a.tasks + b.tasks,
                       a.requested + b.requested, batch, e * per_epoch, e,
                       min(self.capacity, max(1, batch // MIN_LOCAL_BSZ)), members=[a, b])
            self.active = [j for j in self.active if j not in (a, b)] + [m]

    # -- allocation policies ----------------------------------------------------------
    def allocate(self, now: float) -> dict[str, int]:
        jobs, cap = self.active, self.capacity
        out: dict[str, int] = {}
        if self.policy in ("srtf", "tiresias", "themis"):
            if self.policy == "srtf":
                order = sorted(jobs, key=lambda j: (self.remaining_time(j, j.requested), j.submit))
            elif self.policy == "tiresias":
                order = sorted(jobs, key=lambda j: (j.attained >= 3600.0 * j.requested, j.submit))
            else:
                def rho(j: SimJob) -> float:
                    t_ideal = self.remaining_time(j, j.requested)
                    return -((now - j.submit) + t_ideal) / max(t_ideal, 1e-9)
                order = sorted(jobs, key=rho)
            for j in order:
                need = min(j.requested, cap)
                if need <= cap - sum(out.values()):
                    out[j.name] = need
            return out
        if self.policy == "optimus":
            free = cap
            for j in sorted(jobs, key=lambda j: j.submit):
                if free > 0:
                    out[j.name], free = 1, free - 1
            while free > 0:
                best, gain = None, 0.0
                for j in jobs:
                    g = out.get(j.name, 0)
                    if 0 < g < j.limit:
                        d = self.remaining_time(j, g) - self.remaining_time(j, g + 1)
                        if d > gain:
                            best, gain = j, d
                if best is None:
                    break
                out[best.name] += 1
                free -= 1
            return out
        # normal / ymir: elastic SRTF with batch-size-scaled limits (the greedy of solve-finetune)
        free = cap
        for j in sorted(jobs, key=lambda j: (self.remaining_time(j, j.limit), j.submit)):
            if free <= 0:
                break
            out[j.name] = min(j.limit, free)
            free -= out[j.name]
        return out

    # -- loop ---------------------------------------------------------------------------
    def run(self, horizon: float = 1e8) -> dict[str, float]:
        now = 0.0
        while (self.pending or self.active) and now < horizon:
            while self.pending and self.pending[0].submit <= now:
                job = self.pending.pop(0)
                if self.policy in ("ymir", "ymir-temporal"):
                    self._apply_temporal(job)
                self.active.append(job)
            if self.policy == "ymir":
                self._merge_queued()
            alloc = self.allocate(now)
            end = now + self.round_s
            for j in list(self.active):
                g = alloc.get(j.name, 0)
                if g != j.gpus:
                    j.blocked_until = now + (self.data.switch_s if g > 0 else 0.0)
                    j.gpus = g
                if g == 0:
                    continue
                j.started = True
                t0 = max(now, j.blocked_until)
                if t0 >= end:
                    continue
                rate = self.speed(j, g)
                if j.samples <= rate * (end - t0):
                    j.finish = t0 + j.samples / rate
                    j.attained += g * (j.finish - t0)
                    j.samples = 0.0
                    self.active.remove(j)
                    self.done.append(j)
                    self.finished_tasks.update(j.tasks)
                else:
                    j.samples -= rate * (end - t0)
                    j.attained += g * (end - t0)
            now = end
        jct: dict[str, float] = {}
        for j in self.done:
            for m in (j.members or [j]):
                jct[m.name] = float(j.finish) - m.submit  # type: ignore[arg-type]
        return jct


def reference_avg_jct(trace: str, data: Path = DATA) -> dict[str, float]:
    """Average JCT (completion - submission) of each shipped result table for ``trace``."""
    out: dict[str, float] = {}
    for path in sorted((data / "results").glob(f"{trace}*/*.csv")):
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        label = path.stem if path.parent.name == trace else f"{path.stem}[{path.parent.name[len(trace) + 1:]}]"
        out[label] = sum(float(r["completion_time"]) - float(r["submission_time"]) for r in rows) / len(rows)
    return out


def compare(trace: str = "FM-1-roberta-base", capacity: int = 32, data: Path = DATA,
            round_s: float = 60.0, policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    """Replay one trace under every policy; report average JCT next to the shipped tables."""
    fm = trace.split("-", 2)[2]
    fdata = FinetuneData.load(fm, data)
    path = data / "traces" / trace / "workload-0.csv"
    ours: dict[str, float] = {}
    for pol in policies:
        jobs = load_trace(path, fdata, capacity)
        jct = Simulator(jobs, fdata, pol, capacity, round_s).run()
        ours[pol] = sum(jct.values()) / max(1, len(jct))
        log.info("%s %s: %d jobs, avg JCT %.1f s", trace, pol, len(jct), ours[pol])
    return {"trace": trace, "capacity": capacity, "round_s": round_s,
            "avg_jct_s": ours, "reference_avg_jct_s": reference_avg_jct(trace, data)}


def markdown(result: dict[str, Any]) -> str:
    """Our average JCT per policy next to the shipped table of the same policy."""
    from apportion.tables import markdown_table

    refs = dict(result["reference_avg_jct_s"])
    rows = []
    for pol, v in result["avg_jct_s"].items():
        ref = REFERENCE.get(pol, "")
        rv = refs.pop(ref, None)
        rows.append([pol, f"{v:.1f}", ref or "-", "-" if rv is None else f"{rv:.1f}"])
    for ref, rv in refs.items():
        rows.append(["-", "-", ref, f"{rv:.1f}"])
    head = f"### {result['trace']} ({result['capacity']} GPUs, {result['round_s']:.0f}-s rounds)"
    return head + "\n\n" + markdown_table(["policy", "avg JCT (s), this simulator",
                                            "shipped table", "its avg JCT (s)"], rows).rstrip("\n")


def main(out_dir: str = "experiments/results/finetune", traces: tuple[str, ...] = (
        "FM-1-roberta-base", "FM-1.5-roberta-base", "FM-2-roberta-base", "FM-1-roberta-large")) -> None:
    """One command for the comparison: ``python -m apportion.experiments.finetune_sim``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = [compare(t) for t in traces]
    results += [compare_generated("roberta-base", 120, seed=s) for s in (0, 1, 2)]
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    (out / "summary.md").write_text("\n\n".join(markdown(r) for r in results) + "\n")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
