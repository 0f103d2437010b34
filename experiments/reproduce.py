"""The reproductions, one command each; each writes a markdown table and its JSON under
``--out DIR`` (default ``results/reproduce`` in the current folder; the committed tables
are in ``experiments/results/``: refresh them with ``--out experiments/results``), and
the runs' CSVs under ``DIR/runs``. Nothing is written into the installed package.

    python -m apportion.experiments.reproduce crius     [--days 1] [--budget 2] [--out DIR]
    python -m apportion.experiments.reproduce morphling [--budget 2] [--out DIR]
    python -m apportion.experiments.reproduce ablation  [--days 1] [--budget 2] [--out DIR]
    python -m apportion.experiments.reproduce gavel     [--out DIR]

* ``crius`` — Crius section 8.4: Crius's 1,280-GPU cluster (table 1), a Philly
  window (the two-week ~13,000-job window of ``apportion bench sim``, first
  ``--days`` of it), adapted as Crius 8.1; FCFS, Gandiva, Gavel, ElasticFlow-LS,
  Crius greedy and apportion's solver policy; avg JCT, avg/peak throughput.
  Paper (figure 17): Crius lowers avg JCT by 81.3 % vs FCFS, 75.8 % vs
  ElasticFlow-LS, 80.1 % vs Gandiva, 66.4 % vs Gavel; up to 1.54x average and
  1.57x peak throughput.
* ``morphling`` — Morphling section 7.3 on 64 A800 GPUs: base, multi-tenant and
  best-plan workloads (406 jobs each); Sia-like, Synergy, AntMan (MT), the slope
  algorithm; avg JCT, P99 JCT, makespan (table 4). The solver policy needs
  apportion's catalog models and the analytic estimator; it is included.
* ``ablation`` — Crius figure 20: apportion without GPU-count scaling (-na) and
  without heterogeneity scaling (-nh).
* ``gavel`` — the fidelity runs (max_min_fairness.trace, 8:8:8).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import typer
from apportion.experiments.bench.sim import bench_trace
from apportion.experiments.harness import (
    crius_cluster,
    run_one,
    to_markdown,
    write_run,
)
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator

DEFAULT_OUT = Path("results") / "reproduce"
_OUT: list[Path] = [DEFAULT_OUT]  # set by the command line (--out); the library default


def out_dir() -> Path:
    return _OUT[0]


def _h(x: Any) -> float | None:
    return None if x is None else round(float(x) / 3600.0, 3)


def _table(rows: list[dict[str, Any]], name: str, header: str) -> Path:
    from apportion import outputs

    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    path = out / f"{name}.md"
    outputs.write_text(path, header.strip() + "\n\n" + to_markdown(df), "--out")
    outputs.write_text(out / f"{name}.json", json.dumps(rows, indent=2, default=str) + "\n",
                       "--out")
    return path


def crius(days: float = 1.0, budget: float = 2.0,
          policies: tuple[str, ...] = ("fcfs", "gandiva", "gavel", "elasticflow-ls", "crius-greedy",
                                       "apportion"), name: str = "crius_8_4") -> Path:
    trace, truth = bench_trace(14.0)
    trace = trace.window(0.0, days * 86400.0)
    rows = []
    for p in policies:
        opts = {"time_budget_s": budget} if p.startswith("apportion") else {}
        t0 = time.perf_counter()
        res = Simulator(crius_cluster(), trace, make_policy(p, **opts), truth, SimConfig()).run()
        write_run(res, out_dir() / "runs" / f"{name}-{p}")
        s = res.summary
        rows.append({"policy": p, "jobs": s["jobs"], "finished": s["finished"],
                     "avg_jct_h": _h(s["avg_jct_s"]), "p99_jct_h": _h(s["p99_jct_s"]),
                     "avg_queue_h": _h(s["avg_queue_s"]),
                     "avg_thr_samples_s": s["avg_throughput_samples_s"],
                     "peak_thr_samples_s": s["peak_throughput_samples_s"],
                     "avg_restarts": s["avg_restarts"], "wall_s": round(time.perf_counter() - t0, 1)})
    return _table(rows, name, f"""
# Crius 8.4 on apportion's simulator: 1,280 GPUs (Crius table 1), Philly, {days} day(s)

Trace: the first {days} day(s) of the 14-day ~13,000-job Philly window, adapted as Crius 8.1
(seed 0); ground truth: Crius's measured prof_database (interpolated where missing).
Paper (fig. 17): Crius's avg JCT is 81.3 % below FCFS, 75.8 % below ElasticFlow-LS,
80.1 % below Gandiva, 66.4 % below Gavel; up to 1.54x avg and 1.57x peak throughput.""")


def morphling(budget: float = 2.0) -> Path:
    rows = []
    plan = {"base": ["sia", "synergy", "morphling", "apportion"],
            "bp": ["sia", "synergy", "morphling", "apportion"],
            "mt": ["antman", "morphling", "apportion"]}
    for variant, pols in plan.items():
        for p in pols:
            # Morphling's plans use 3- and 6-stage pipelines: offer every divisor
            opts = ({"time_budget_s": budget, "stage_counts": "divisors"}
                    if p.startswith("apportion") else {})
            t0 = time.perf_counter()
            res = run_one(f"morphling-{variant}", "morphling-64", p, policy_options=opts)
            write_run(res, out_dir() / "runs" / f"morphling-{variant}-{p}")
            s = res.summary
            rows.append({"trace": variant, "policy": p, "finished": s["finished"],
                         "avg_jct_h": _h(s["avg_jct_s"]), "p99_jct_h": _h(s["p99_jct_s"]),
                         "makespan_h": _h(s["makespan_s"]), "wall_s": round(time.perf_counter() - t0, 1)})
    return _table(rows, "morphling_7_3", """
# Morphling 7.3 on apportion's simulator: 64 A800 GPUs, 406-job workloads

Ground truth: Morphling's measured iteration times per plan and placement (A800).
Paper (table 4), avg JCT / P99 / makespan in hours: base — Morphling 0.96 / 7.1 / 15.3,
Sia 2.5 / 12.2 / 18.8, Synergy 3.1 / 13.5 / 21.5; BP — Sia 1.8 / 9 / 16.5, Synergy
2.3 / 10.8 / 20.5; MT — Morphling 1.1 / 11.4 / 17.9, AntMan 1.75 / 13.4 / 19.6.
JCTs are over finished jobs (the `finished` column). Global batches per model come from the
artifact's validation scripts; apportion's candidates include every stage-count divisor, as
Morphling's 3- and 6-stage plans need. apportion runs its cell formulation here; on MT it keeps
the guaranteed jobs' SLAs (no quotas are given: every guaranteed job is within its tenant's).""")


def ablation(days: float = 1.0, budget: float = 2.0) -> Path:
    return crius(days, budget, ("apportion", "apportion-na", "apportion-nh"), "ablation_fig20")


def gavel() -> Path:
    """Each Gavel policy replayed under the ``gavel`` profile, beside Gavel's own figure
    (``gavel_reference``): with Gavel's information (``oracle``: its simulator hands the
    policy the measured throughputs) and with the project's default (``estimated``)."""
    from apportion.experiments.gavel_reference import GAVEL, VARIANTS

    variant_of = {v["policy"]: (k, v) for k, v in VARIANTS.items()}
    rows = []
    for p in ("fifo", "gavel-max-min-fairness", "gavel-max-sum-throughput", "gandiva"):
        s = run_one("gavel-max-min-fairness", "8:8:8", p, profile="gavel",
                    sim_options={"information": "oracle"}).summary
        e = run_one("gavel-max-min-fairness", "8:8:8", p, profile="gavel",
                    sim_options={"information": "estimated"}).summary
        g = GAVEL[p]
        row = {"policy": p, "finished": s["finished"], "avg_jct_h": _h(s["avg_jct_s"]),
               "gavel_avg_jct_h": _h(g["avg_jct_s"]),
               "ratio": round(s["avg_jct_s"] / g["avg_jct_s"], 3),
               "avg_jct_h_estimated": _h(e["avg_jct_s"]),
               "ratio_estimated": round(e["avg_jct_s"] / g["avg_jct_s"], 3),
               "makespan_h": _h(s["makespan_s"]), "gavel_makespan_h": _h(g["makespan_s"]),
               "utilization": s["utilization"], "gavel_utilization": g["utilization"],
               "gavel_variant": None, "gavel_variant_avg_jct_h": None,
               "ratio_to_variant": None}
        if p in variant_of:
            name, v = variant_of[p]
            row.update(gavel_variant=name, gavel_variant_avg_jct_h=_h(v["avg_jct_s"]),
                       ratio_to_variant=round(s["avg_jct_s"] / v["avg_jct_s"], 3))
        rows.append(row)
    return _table(rows, "gavel_fidelity", """
# Gavel fidelity: max_min_fairness.trace (96 jobs) on 8:8:8 (V100:P100:K80), profile gavel, seed 0

apportion's replay (`--information oracle`, as Gavel's simulator: the policy sees the measured
throughputs) against Gavel's own simulator on the same trace, cluster and seed
(`apportion.experiments.gavel_reference`: the command and versions). `ratio` = apportion /
Gavel average JCT; `_estimated`: the project's default information mode. `gavel_variant`: Gavel
with one mechanism changed to measure a deviation (fifo-drawn-type: Gavel's FIFO uses the type it
draws; gandiva-no-packing: Gavel's Gandiva never co-locates). Mechanism and every deviation:
GAVEL_FIDELITY.md.""")


cli = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The papers' experiments on apportion's simulator.")
OUT_HELP = "output folder (tables, JSON, runs/); default results/reproduce"


def _run(out: Path, make: Any) -> None:
    from apportion import outputs
    from apportion.console import Progress
    from apportion.errors import InputError

    try:
        outputs.check_output_dir(out, "--out")
    except InputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    _OUT[0] = out
    with Progress("reproduce", heartbeat=True):
        path = make()
    print(path.read_text())


@cli.command("crius")
def crius_cmd(days: float = typer.Option(1.0, "--days", min=0.01),
              budget: float = typer.Option(2.0, "--budget", min=0.01),
              out: Path = typer.Option(DEFAULT_OUT, "--out", help=OUT_HELP)) -> None:
    """Crius 8.4: 1,280 GPUs, a Philly window, six policies."""
    _run(out, lambda: crius(days, budget))


@cli.command("morphling")
def morphling_cmd(budget: float = typer.Option(2.0, "--budget", min=0.01),
                  out: Path = typer.Option(DEFAULT_OUT, "--out", help=OUT_HELP)) -> None:
    """Morphling 7.3: 64 A800 GPUs, the base, best-plan and multi-tenant workloads."""
    _run(out, lambda: morphling(budget))


@cli.command("ablation")
def ablation_cmd(days: float = typer.Option(1.0, "--days", min=0.01),
                 budget: float = typer.Option(2.0, "--budget", min=0.01),
                 out: Path = typer.Option(DEFAULT_OUT, "--out", help=OUT_HELP)) -> None:
    """Crius figure 20: apportion without GPU-count or heterogeneity scaling."""
    _run(out, lambda: ablation(days, budget))


@cli.command("gavel")
def gavel_cmd(out: Path = typer.Option(DEFAULT_OUT, "--out", help=OUT_HELP)) -> None:
    """Gavel's fidelity runs: max_min_fairness.trace on 8:8:8."""
    _run(out, gavel)


def main() -> None:
    cli(prog_name="python -m apportion.experiments.reproduce")


if __name__ == "__main__":
    main()
