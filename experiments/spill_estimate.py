"""The spilled estimate against the spilled trainer's measured steps, on this machine's CPU.

For each catalog model the built-in trainer runs and each device budget it must spill
under, this runs the real worker (``runtime.workers.trainer.Worker``) three times on the
same batches: whole (``dp1``), whole with activation recomputation (``gc``: the estimate's
compute term ``T_c``) and spilled under the budget; and it measures the rate at which
this machine copies tensors (the CPU's stand-in for the host link ``W``: on a CPU a
promotion is a memory copy). The estimate is then ``estimation.models.spill.spill_estimate``
itself, given those two measured figures and the catalog's byte counts, so the table shows
how far the formula (its copies, its overlap, its shard count) is from the real spilled
steps, not how far the analytic model's FLOP rate is from a CPU.

Run ``python experiments/spill_estimate.py OUT_DIR``; it writes ``spill_cpu.json`` and
``spill_cpu.md`` there (``experiments/results/spill/`` holds this project's).
Steps are medians over the iterations after the first two (start-up); every configuration
runs ``REPEATS`` times, interleaved with the others, and keeps its fastest median: the
machine is shared, and interference only ever slows a step down.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from apportion.estimation.models.spill import spill_cut, spill_estimate
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.workers.trainer import LOSSES_FILE, Worker

from apportion.gpus import get_gpu
from apportion.models import get_model
from apportion.plans import ExecutionPlan

MiB = 2**20
CASES = (("gpt-tiny", 4, (8, 12, 24)), ("vit-tiny", 4, (8, 12, 24)), ("gpt-tiny", 16, (24, 48)))
ITERATIONS = 12
REPEATS = 3


def steps(model: str, batch: int, plan: ExecutionPlan) -> tuple[float, list[float], Any]:
    """Median step (s) of the worker on ``plan``, its losses, and the worker."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig("m", model, batch, ITERATIONS, plan.as_dict(), tmp, lr=3e-3)
        w = Worker(cfg, 0, 1)
        assert w.run() == 0
        recs = [json.loads(x) for x in (Path(tmp) / LOSSES_FILE).read_text().splitlines()]
    return statistics.median(r["time_s"] for r in recs[2:]), [r["loss"] for r in recs], w


def copy_rate(mib: int = 64, repeats: int = 5) -> float:
    """Bytes per second this machine copies one tensor into another (a CPU promotion)."""
    a = torch.randn(mib * MiB // 4)
    b = torch.empty_like(a)
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(best)


def main(out: Path) -> int:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    rate = copy_rate()
    cpu = replace(get_gpu("T4"), name="cpu", host_GBps=rate / 1e9)
    rows = []
    for model, batch, budgets in CASES:
        spec = get_model(model)
        plans = {"whole": ExecutionPlan(), "gc": ExecutionPlan(checkpointing=True)}
        plans.update({mib: ExecutionPlan(spill_shards=1, spill_budget_mib=mib) for mib in budgets})
        best: dict[Any, float] = {}
        seen: dict[Any, tuple[list[float], Any]] = {}
        for _ in range(REPEATS):
            for key, plan in plans.items():
                step, losses, worker = steps(model, batch, plan)
                best[key] = min(best.get(key, math.inf), step)
                seen[key] = (losses, worker)
        for mib in budgets:
            losses, worker = seen[mib]
            est = spill_estimate(spec, batch, cpu, best["gc"], mib * MiB)
            b = est.breakdown
            rows.append({
                "model": model, "batch": batch, "budget_mib": mib,
                "pilot_shards": worker.par.partition.boundaries,
                "pilot_double_buffer": worker.par.double_buffer,
                "estimate_shards": [a for a, _ in spill_cut(spec, batch, mib * MiB).shards],
                "whole_step_s": best["whole"], "gc_step_s": best["gc"],
                "spill_step_s": best[mib], "estimate_s": est.iter_time_s,
                "copy_s": b["copy_s"], "hidden_s": b["hidden_s"],
                "error": est.iter_time_s / best[mib] - 1.0,
                "unexplained_per_unit_s": (best[mib] - est.iter_time_s) /
                (2 * len(worker.par.partition.shards)),
                "losses_equal_whole": losses == seen["whole"][0]})
            print(json.dumps(rows[-1]), flush=True)
    data = {"copy_GBps": rate / 1e9, "threads": 1, "iterations": ITERATIONS,
            "repeats": REPEATS, "rows": rows,
            "torch": torch.__version__}
    (out / "spill_cpu.json").write_text(json.dumps(data, indent=1))
    lines = [("| model | batch | budget | shards (pilot / estimate) | whole step | T_c (gc step) "
              "| estimate | measured spilled step | error | unexplained per unit |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['budget_mib']} MiB | "
            f"{len(r['pilot_shards'])} / {len(r['estimate_shards'])} | "
            f"{r['whole_step_s'] * 1e3:.1f} ms | {r['gc_step_s'] * 1e3:.1f} ms | "
            f"{r['estimate_s'] * 1e3:.1f} ms | {r['spill_step_s'] * 1e3:.1f} ms | "
            f"{r['error']:+.0%} | {r['unexplained_per_unit_s'] * 1e3:.1f} ms |")
    (out / "spill_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "spill-out")))
