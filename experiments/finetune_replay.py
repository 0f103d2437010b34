"""YMIR's evaluation replayed in the one simulator: fine-tuning traces, every policy alike.

    python -m apportion.experiments.finetune_replay [--seeds 3] [--out DIR] [--quick]

Each run is :class:`apportion.experiments.simulator.Simulator` through the one round
pipeline, on YMIR's fine-tuning workloads (Titan's FMTrace samples ``FM-{1,1.5,2}``
for RoBERTa-base and RoBERTa-large, plus YMIR's generated-workload recipe with three
seeds), a 32-GPU V100 cluster (8 servers x 4, the profiles' topology), 60-s rounds
and the backbone's measured context switch as every start's and restart's cost
(:data:`apportion.experiments.simulator.PROFILES` ``ymir``). Ground truth:
:class:`apportion.experiments.finetune_truth.FinetuneTruth`.

Policies: the registered baselines ``fcfs``, ``srtf``, ``tiresias`` (on the requested
GPUs) and ``sia`` (elastic, goodput), and YMIR's ``ymir-normal`` (its elastic SRTF,
no transfer), ``ymir-spatial`` (merging only), ``ymir-temporal`` (transfer from finished
siblings only) and ``ymir`` (both: the task merger chooses each job's mode), and
``apportion``, whose round model offers the same modes as options (transfer cells, merged
cells: :mod:`apportion.formulations.siblings`), honoured by the simulator alike.
Both information modes: ``oracle`` (deterministic: one run per trace) and
``estimated`` (seeded profiling noise: ``--seeds`` runs, mean and Student-t 95 % CI).
Writes ``summary.json`` and ``summary.md`` under ``experiments/results/finetune/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from apportion.experiments.finetune_truth import reference_avg_jct
from apportion.experiments.harness import ci95, cluster_from_arg, resolve
from apportion.policies import make_policy
from apportion.experiments.simulator import PROFILES, Simulator

log = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results" / "finetune"
CLUSTER = "32:0:0"  # 8 servers x 4 V100-32GB
TRACES = ("fm-1-roberta-base", "fm-1.5-roberta-base", "fm-2-roberta-base",
          "fm-1-roberta-large", "fm-1.5-roberta-large", "fm-2-roberta-large")
GENERATED = "fm-generated:120"
POLICIES = ("fcfs", "srtf", "tiresias", "sia", "ymir-normal", "ymir-spatial", "ymir-temporal",
            "ymir", "apportion")
#: average JCT (s) of the separate fine-tuning simulator this replaces (commit 24e2f4c,
#: experiments/results/finetune/summary.json; requested GPUs for srtf/tiresias, 32 GPUs)
SEPARATE_SIMULATOR = {
    "fm-1-roberta-base": {"srtf": 1018.0, "tiresias": 1036.2, "ymir-normal": 570.9,
                          "ymir-temporal": 310.4, "ymir": 310.3},
    "fm-1.5-roberta-base": {"srtf": 1282.1, "tiresias": 1300.7, "ymir-normal": 1080.6,
                            "ymir-temporal": 419.0, "ymir": 415.1},
    "fm-2-roberta-base": {"srtf": 1828.4, "tiresias": 1946.1, "ymir-normal": 2188.6,
                          "ymir-temporal": 891.9, "ymir": 891.6},
    "fm-1-roberta-large": {"srtf": 1960.5, "tiresias": 2004.5, "ymir-normal": 750.7,
                           "ymir-temporal": 434.6, "ymir": 434.6},
}
#: the shipped Titan result tables next to each policy (titan[multi-task-transfer])
SHIPPED = {"srtf": "srtf", "tiresias": "tiresias", "ymir-temporal": "titan[False-True]",
           "ymir": "titan[True-True]"}


def run(trace: str, policy: str, information: str, seed: int) -> dict[str, Any]:
    """One replay; the summary row (trace seed = run seed for generated workloads)."""
    cl = cluster_from_arg(CLUSTER)
    t, truth = resolve(trace, cl, seed=seed)
    backbone = next(j.finetune.backbone for j in t.jobs if j.finetune is not None)
    switch = truth.switch_s(backbone)
    cfg = replace(PROFILES["ymir"], information=information, seed=seed,
                  restart_cost_s=switch, start_cost_s=switch)
    t0 = time.perf_counter()
    res = Simulator(cl, t, make_policy(policy), truth, cfg).run()
    s = res.summary
    return {"trace": trace if trace != GENERATED else "fm-generated-roberta-base-120",
            "trace_name": t.name, "policy": policy, "information": information, "seed": seed,
            "jobs": s["jobs"], "finished": s["finished"], "avg_jct_s": s["avg_jct_s"],
            "p99_jct_s": s["p99_jct_s"], "avg_queue_s": s["avg_queue_s"],
            "avg_restarts": s["avg_restarts"], "switch_s": switch,
            "wall_s": round(time.perf_counter() - t0, 2)}


def _run(args: tuple[str, str, str, int]) -> dict[str, Any]:
    return run(*args)


def plan(seeds: int, quick: bool = False) -> list[tuple[str, str, str, int]]:
    """Every (trace, policy, mode, seed): oracle once per FM trace, estimated per seed;
    the generated workload draws a new trace per seed, in both modes."""
    traces = TRACES[:1] if quick else TRACES
    jobs = []
    for p in POLICIES:
        for tr in traces:
            jobs.append((tr, p, "oracle", 0))
            jobs.extend((tr, p, "estimated", s) for s in range(seeds))
        if not quick:
            for s in range(seeds):
                jobs.append((GENERATED, p, "oracle", s))
                jobs.append((GENERATED, p, "estimated", s))
    return jobs


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95 % CI per (trace, mode, policy) over seeds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["information"], r["policy"]), []).append(r)
    out = []
    for (trace, mode, pol), rs in groups.items():
        v = [r["avg_jct_s"] for r in rs if r["avg_jct_s"] is not None]
        out.append({"trace": trace, "information": mode, "policy": pol, "seeds": len(rs),
                    "finished": min(r["finished"] for r in rs), "jobs": rs[0]["jobs"],
                    "avg_jct_s": round(sum(v) / len(v), 1) if v else None,
                    "avg_jct_ci95": round(ci95(v), 1),
                    "per_seed": [r["avg_jct_s"] for r in sorted(rs, key=lambda x: x["seed"])]})
    return out


def markdown(agg: list[dict[str, Any]]) -> str:
    cell = {(a["trace"], a["information"], a["policy"]): a for a in agg}
    traces = list(dict.fromkeys(a["trace"] for a in agg))
    lines = []
    for tr in traces:
        ref = reference_avg_jct(tr.replace("fm-", "FM-", 1)) if tr.startswith("fm-1-") else {}
        old = SEPARATE_SIMULATOR.get(tr, {})
        lines += [f"### {tr}", "", ("| policy | oracle avg JCT (s) | estimated avg JCT (s), "
                                    "mean ± 95 % CI | separate simulator (old) | shipped Titan "
                                    "table |"), "|---|---|---|---|---|"]
        for pol in POLICIES:
            o, e = cell.get((tr, "oracle", pol)), cell.get((tr, "estimated", pol))
            if o is None and e is None:
                continue

            def fmt(a: dict[str, Any] | None) -> str:
                if a is None or a["avg_jct_s"] is None:
                    return "-"
                ci = f" ± {a['avg_jct_ci95']:.0f}" if a["seeds"] > 1 else ""
                n = f" ({a['seeds']} seeds)" if a["seeds"] > 1 else ""
                fin = "" if a["finished"] == a["jobs"] else f" [{a['finished']}/{a['jobs']} done]"
                return f"{a['avg_jct_s']:.0f}{ci}{n}{fin}"

            ship = SHIPPED.get(pol)
            sv = f"{ship}: {ref[ship]:.0f}" if ship and ship in ref else "-"
            ov = f"{old[pol]:.0f}" if pol in old else "-"
            lines.append(f"| {pol} | {fmt(o)} | {fmt(e)} | {ov} | {sv} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="FM-1-roberta-base only")
    a = ap.parse_args(argv)
    jobs = plan(a.seeds, a.quick)
    with mp.get_context("spawn").Pool(max(1, a.workers)) as pool:
        rows = pool.map(_run, jobs, chunksize=1)
    agg = aggregate(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps({"runs": rows, "summary": agg}, indent=2) + "\n")
    head = (f"YMIR's setting in the one simulator: {CLUSTER} (32 V100), 60-s rounds, the "
            "backbone's measured context switch per start; `oracle` deterministic, `estimated` "
            f"over {a.seeds} seeds (mean ± Student-t 95 % CI). Generated: YMIR's recipe, a new "
            "trace per seed.\n\n")
    (a.out / "summary.md").write_text(head + markdown(agg))
    print(head + markdown(agg))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
