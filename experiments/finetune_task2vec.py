"""Task2Vec's score-to-gain map calibrated against Titan's measured transfer and merge gains.

    python -m apportion.experiments.finetune_task2vec [--out DIR] [--task-data DIR]

What it measures. Every measured pair of Titan's artifact (``titan-finetune``: the transfer
curves A->B and the multi-task curves A||B of RoBERTa-base and RoBERTa-large) has a
measured gain: temporal ``1 - T_B(from A) / T_B``, spatial ``1 - T(A||B) / (T_A + T_B)``
(one GPU, the times of :class:`~apportion.experiments.finetune_truth.FinetuneTruth`, the
replays' truth). Each pair's Task2Vec score comes from the tasks' samples; the map
``gain = intercept - slope x score`` (:class:`~apportion.estimation.finetune.
transferability.GainMap`) is fitted on RoBERTa-base's pairs and its error reported on
RoBERTa-large's, which the fit never sees (and, within RoBERTa-base, on alternate pairs),
with how often it says rightly whether a pair pays (measured gain > 0).

Which samples. The GLUE datasets (and SNLI) are not shipped, and nothing here may fetch
them. The samples embedded are **stand-ins**: per task, Gaussian-class samples whose class
means are those of the task's GLUE family (natural-language inference: MNLI, QNLI, RTE,
WNLI, SNLI; paraphrase and similarity: MRPC, QQP, STS-B; sentiment: SST-2; the grouping
of the GLUE paper, not read from the measured gains) shifted per task, with the task's
class count. So the experiment measures how much of Titan's measured transfer a
family-level relatedness, as Task2Vec sees it, explains; with a task's own samples
(``--task-data``: ``<backbone>@<task>.npz`` or ``.csv``) it measures Task2Vec on them.
``--write-task-data DIR`` writes the stand-ins where ``$APPORTION_TASK_DATA`` can point
(``ymir-task2vec``, ``apportion-task2vec``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from apportion.estimation.finetune.gains import Task2VecGains
from apportion.estimation.finetune.transferability import (
    GainMap,
    Task2VecProbe,
    TaskData,
    TransferabilityEstimator,
    load_task_data,
    synthetic_task,
)
from apportion.experiments.finetune_truth import FinetuneTruth
from apportion.experiments.harness import cluster_from_arg, resolve

log = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results" / "finetune"
#: GLUE's task families (its paper's grouping) and class counts; STS-B's scores in 2 bins
FAMILIES = {"mnli": "nli", "qnli": "nli", "rte": "nli", "wnli": "nli", "snli": "nli",
            "mrpc": "paraphrase", "qqp": "paraphrase", "stsb": "paraphrase",
            "sst2": "sentiment"}
CLASSES = {"mnli": 3, "snli": 3}
DIM = 16
CALIBRATE, HELD_OUT = "fm-1-roberta-base", "fm-1-roberta-large"


def stand_in(task: str, seed: int = 0, n: int = 600) -> TaskData:
    """A task's stand-in samples: its GLUE family's class means, shifted per task."""
    fams = sorted(set(FAMILIES.values()))
    rng = np.random.default_rng(seed)
    bases = {f: rng.normal(size=(3, DIM)) * 2.0 for f in fams}
    k = CLASSES.get(task, 2)
    tid = sorted(FAMILIES).index(task)
    return synthetic_task(task, DIM, k, n, seed + 1 + tid,
                          base=bases[FAMILIES[task]][:k], shift=0.3)


def measured_gains(trace: str) -> tuple[dict[str, float], dict[str, float]]:
    """Every measured pair's gain on one GPU (temporal ``A->B``, spatial ``A||B``)."""
    cl = cluster_from_arg("32:0:0")
    t, truth = resolve(trace, cl)
    assert isinstance(truth, FinetuneTruth)
    first: dict[str, Any] = {}
    for j in t.jobs:
        if j.finetune is not None:
            first.setdefault(j.finetune.task, j)
    tasks = sorted(first)
    gt = truth.gpu_type
    alone = {k: first[k].iterations / truth.rate(first[k], gt, 1) for k in tasks}
    data = truth.data(first[tasks[0]].finetune.backbone)
    temporal, spatial = {}, {}
    for a in tasks:
        for b in tasks:
            if a != b and f"{a},{b}" in data.transfer:
                warm = truth.rate(first[b], gt, 1, source=first[a])
                if warm > 0:
                    temporal[f"{a}->{b}"] = 1.0 - truth.rate(first[b], gt, 1) / warm
        for b in tasks:
            if a < b:
                r = truth.rate(first[a], gt, 1, members=(first[b],))
                if r > 0:
                    spatial[f"{a}||{b}"] = 1.0 - (first[a].iterations / r) / (alone[a] + alone[b])
    return temporal, spatial


def scores(tasks: list[str], task_data: Path | None, backbone: str
           ) -> tuple[dict[str, float], dict[str, float]]:
    """Task2Vec's temporal and spatial scores of every pair of ``tasks``."""
    data = []
    for t in tasks:
        f = Task2VecGains.task_file(task_data, backbone, t) if task_data else None
        data.append(load_task_data(f, t, f"task {t}") if f is not None else stand_in(t))
    est = TransferabilityEstimator(Task2VecProbe(DIM if task_data is None
                                                 else data[0].x.shape[1])).fit(data)
    tmp = {f"{a}->{b}": est.temporal_score(a, b) for a in tasks for b in tasks if a != b}
    sp = {f"{a}||{b}": est.spatial_score(a, b) for a in tasks for b in tasks if a < b}
    return tmp, sp


def _errors(gmap: GainMap, pts: list[tuple[float, float]]) -> dict[str, float]:
    if not pts:
        return {"pairs": 0}
    pred = np.array([gmap.predict(s) for s, _ in pts])
    meas = np.array([g for _, g in pts])
    return {"pairs": len(pts), "mae": round(float(np.abs(pred - meas).mean()), 4),
            "sign_agreement": round(float(((pred > 0) == (meas > 0)).mean()), 4),
            "predicted_pays": int((pred > 0).sum()), "measured_pays": int((meas > 0).sum()),
            "predicted_pays_and_does": int(((pred > 0) & (meas > 0)).sum())}


def calibrate(task_data: Path | None = None) -> dict[str, Any]:
    """Fit on RoBERTa-base's measured pairs (alternate ones held out too), report on
    RoBERTa-large's."""
    out: dict[str, Any] = {"stand_ins": task_data is None}
    pts: dict[str, dict[str, list[tuple[float, float, str]]]] = {}
    for trace in (CALIBRATE, HELD_OUT):
        bb = trace.split("-", 2)[2]
        tmp, sp = measured_gains(trace)
        tasks = sorted({k for key in list(tmp) + list(sp)
                        for k in key.replace("->", ",").replace("||", ",").split(",")})
        st, ss = scores(tasks, task_data, bb)
        pts[trace] = {"temporal": [(st[k], g, k) for k, g in sorted(tmp.items())],
                      "spatial": [(ss[k], g, k) for k, g in sorted(sp.items())]}
    base = pts[CALIBRATE]["temporal"] + pts[CALIBRATE]["spatial"]
    fit_on, alt = base[::2], base[1::2]
    gmap = GainMap().fit([s for s, _, _ in fit_on], [g for _, g, _ in fit_on])
    full = GainMap().fit([s for s, _, _ in base], [g for _, g, _ in base])
    out["map_half"] = {"intercept": round(float(gmap.intercept), 4),
                       "slope": round(float(gmap.slope), 4)}
    out["map"] = {"intercept": round(float(full.intercept), 4),
                  "slope": round(float(full.slope), 4)}
    out["calibration_fit"] = _errors(gmap, [(s, g) for s, g, _ in fit_on])
    out["held_out_alternate_base_pairs"] = _errors(gmap, [(s, g) for s, g, _ in alt])
    large = pts[HELD_OUT]["temporal"] + pts[HELD_OUT]["spatial"]
    out["held_out_roberta_large"] = _errors(full, [(s, g) for s, g, _ in large])
    out["held_out_roberta_large_by_kind"] = {
        k: _errors(full, [(s, g) for s, g, _ in pts[HELD_OUT][k]]) for k in pts[HELD_OUT]}
    out["default_map_on_large"] = _errors(GainMap(), [(s, g) for s, g, _ in large])
    same = [s for s, _, k in base if _family_pair(k)]
    other = [s for s, _, k in base if not _family_pair(k)]
    out["scores_same_family"] = [round(min(same), 4), round(max(same), 4)] if same else []
    out["scores_other_family"] = [round(min(other), 4), round(max(other), 4)] if other else []
    out["pairs"] = {tr: {k: [{"pair": key, "score": round(s, 4), "measured": round(g, 4)}
                             for s, g, key in v] for k, v in d.items()}
                    for tr, d in pts.items()}
    return out


def _family_pair(key: str) -> bool:
    a, b = key.replace("->", ",").replace("||", ",").split(",")
    return FAMILIES.get(a) == FAMILIES.get(b)


def write_task_data(folder: Path) -> list[Path]:
    """The stand-ins as ``<backbone>@<task>.npz`` for both RoBERTa backbones."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for bb in ("roberta-base", "roberta-large"):
        for task in sorted(FAMILIES):
            t = stand_in(task)
            p = folder / f"{bb}@{task}.npz"
            np.savez(p, x=t.x, y=t.y)
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--task-data", type=Path, default=None)
    ap.add_argument("--write-task-data", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.write_task_data is not None:
        for p in write_task_data(a.write_task_data):
            print(p)
        return
    res = calibrate(a.task_data)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "task2vec.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "pairs"}, indent=2))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
