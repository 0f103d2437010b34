"""Reproduce Hydra's figure 6: random vs Sharded-LRTF vs a time-limited solver.

Hydra (section 5.3.3) simulates model-selection workloads on identical GPUs:
a *homogeneous* setting (identical models, 2 h per epoch, 2,000 shard units
each) and a *heterogeneous* one (30 min to 4 h per epoch, 100 to 10,000 units),
and reports makespans normalised to the best, averaged over 3 runs. The paper's
solver is Gurobi with a 100 s limit; here it is CP-SAT warm-started from
Sharded-LRTF (and the big-M MILP on HiGHS), with the budget a parameter.

Because the exact methods return the better of their answer and their LRTF
hint, the table also reports each solver's *own* makespan (``raw``), which is
what the paper's "MILP" bar measures. :func:`run_crossover` measures where
CP-SAT on the whole instance stops paying against Sharded-LRTF.

Run: ``python -m apportion.experiments.hydra_fig6 --out DIR --budget 2``.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from apportion.formulations.shards import ShardDevice, ShardModel, ShardProblem
from apportion.solvers.shards import solve

from apportion.errors import InputError
from apportion.tables import markdown_table

log = logging.getLogger(__name__)

METHODS = ("random", "lrtf", "cp-sat", "milp")
DEFAULT_CONFIGS = ((4, 2), (8, 4), (12, 8))  # (models, devices)


def homogeneous(models: int, devices: int, seed: int, units: int = 2000,
                epoch_s: float = 7200.0, epochs: int = 1) -> ShardProblem:
    """Identical models: ``epochs`` x ``units`` units of ``epoch_s / units`` seconds each
    (the seed is unused: the paper's homogeneous set is deterministic)."""
    del seed
    rt = (epoch_s / units,) * (units * epochs)
    return ShardProblem([ShardDevice(f"gpu{p}") for p in range(devices)],
                        [ShardModel(f"model{i}", rt) for i in range(models)])


def heterogeneous(models: int, devices: int, seed: int, epoch_s: tuple[float, float] = (1800, 14400),
                  units: tuple[int, int] = (100, 10_000), epochs: int = 1) -> ShardProblem:
    """Models differing in epoch time (uniform 30 min to 4 h) and unit count (100 to 10,000)."""
    rng = random.Random(seed)
    mods = []
    for i in range(models):
        n, t = rng.randint(*units), rng.uniform(*epoch_s)
        mods.append(ShardModel(f"model{i}", (t / n,) * (n * epochs)))
    return ShardProblem([ShardDevice(f"gpu{p}") for p in range(devices)], mods)


SETTINGS: dict[str, Callable[[int, int, int], ShardProblem]] = {
    "homogeneous": homogeneous, "heterogeneous": heterogeneous}


def run_instance(problem: ShardProblem, methods: Sequence[str], budget_s: float, seed: int
                 ) -> dict[str, dict[str, Any]]:
    """Solve one instance by each method; makespans, raw solver makespans, walls, statuses."""
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        sol = solve(problem, m, budget_s, seed=seed)
        out[m] = {"makespan": sol.makespan, "raw": sol.extra.get("solver_makespan", sol.makespan),
                  "status": sol.status.value, "wall_s": sol.wall_s,
                  "scheme": sol.extra.get("scheme"), "picked": sol.extra.get("picked")}
    return out


def run_fig6(out_dir: str | Path, budget_s: float = 2.0, seeds: Sequence[int] = (0, 1, 2),
             configs: Sequence[tuple[int, int]] = DEFAULT_CONFIGS,
             methods: Sequence[str] = METHODS, settings: Sequence[str] = tuple(SETTINGS),
             ) -> dict[str, Any]:
    """Run every setting x (models, devices) x seed x method; write summary.json,
    table.md and fig6.png under ``out_dir``; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for setting in settings:
        for models, devices in configs:
            for seed in seeds:
                problem = SETTINGS[setting](models, devices, seed)
                res = run_instance(problem, methods, budget_s, seed)
                best = min(r["makespan"] for r in res.values())
                lb = problem.lower_bound()
                for r in res.values():
                    r.update(normalised=r["makespan"] / best, raw_normalised=r["raw"] / best,
                             over_lb=r["makespan"] / lb)
                runs.append({"setting": setting, "models": models, "devices": devices, "seed": seed,
                             "units": problem.num_units, "lower_bound": lb, "results": res})
                log.info("%s %dx%d seed %d: %s", setting, models, devices, seed,
                         {m: round(r["normalised"], 4) for m, r in res.items()})
    summary = {"budget_s": budget_s, "seeds": list(seeds), "configs": [list(c) for c in configs],
               "methods": list(methods), "wall_s": time.perf_counter() - t0, "runs": runs,
               "table": _aggregate(runs, methods)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(_markdown(summary))
    _plot(summary, out / "fig6.png")
    return summary


def _aggregate(runs: list[dict[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r["setting"], r["models"], r["devices"]) for r in runs},
                  key=lambda k: (k[0] != "homogeneous", k[1], k[2]))
    for setting, models, devices in keys:
        group = [r for r in runs if (r["setting"], r["models"], r["devices"]) == (setting, models,
                                                                                   devices)]
        row: dict[str, Any] = {"setting": setting, "models": models, "devices": devices,
                               "units_mean": statistics.mean(r["units"] for r in group)}
        for m in methods:
            for field in ("normalised", "raw_normalised", "over_lb"):
                vals = [r["results"][m][field] for r in group]
                row[f"{m}.{field}.mean"] = statistics.mean(vals)
                row[f"{m}.{field}.std"] = statistics.pstdev(vals)
        rows.append(row)
    return rows


def _markdown(summary: dict[str, Any]) -> str:
    methods = summary["methods"]
    head = ["setting", "models x GPUs", "units"] + [f"{m}" for m in methods] + \
        [f"{m} raw" for m in methods if m in ("cp-sat", "milp")] + ["LRTF / LB"]
    intro = (f"Makespan normalised to the best method per instance (mean ± std over seeds "
             f"{summary['seeds']}); solver budget {summary['budget_s']} s. 'raw' is the solver's "
             "own schedule before the better-of-hint rule; LRTF / LB is Sharded-LRTF's makespan "
             "over the lower bound.")
    rows = []
    for row in summary["table"]:
        cells = [row["setting"], f"{row['models']} x {row['devices']}", f"{row['units_mean']:.0f}"]
        cells += [f"{row[f'{m}.normalised.mean']:.4f} ± {row[f'{m}.normalised.std']:.4f}"
                  for m in methods]
        cells += [f"{row[f'{m}.raw_normalised.mean']:.4f} ± {row[f'{m}.raw_normalised.std']:.4f}"
                  for m in methods if m in ("cp-sat", "milp")]
        if "lrtf" in methods:
            cells.append(f"{row['lrtf.over_lb.mean']:.5f}")
        rows.append(cells)
    return intro + "\n\n" + markdown_table(head, rows)


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({r["setting"] for r in summary["table"]}, key=lambda s: s != "homogeneous")
    bars = list(summary["methods"]) + [f"{m} raw" for m in summary["methods"]
                                       if m in ("cp-sat", "milp")]
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        rows = [r for r in summary["table"] if r["setting"] == setting]
        width = 0.8 / len(bars)
        for k, name in enumerate(bars):
            m, field = (name[:-4], "raw_normalised") if name.endswith(" raw") else (name, "normalised")
            xs = [x + k * width for x in range(len(rows))]
            ax.bar(xs, [r[f"{m}.{field}.mean"] for r in rows], width,
                   yerr=[r[f"{m}.{field}.std"] for r in rows], label=name, capsize=2)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
        ax.set_xticklabels([f"{r['models']} models\n{r['devices']} GPUs" for r in rows])
        ax.set_ylabel("makespan / best")
        top = max(r[f"{m}.{f}.mean"] for r in rows for m in summary["methods"]
                  for f in ("normalised", "raw_normalised"))
        ax.set_ylim(0.98, max(1.05, top * 1.02))
        ax.set_title(f"{setting} (budget {summary['budget_s']} s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_crossover(out_dir: str | Path, budget_s: float = 2.0,
                  sizes: Sequence[int] = (20, 50, 100, 200, 400, 800, 1600),
                  seeds: Sequence[int] = (0, 1, 2), models: int = 6, devices: int = 3
                  ) -> list[dict[str, Any]]:
    """CP-SAT on the whole instance vs Sharded-LRTF as the unit count grows.

    Instances: ``models`` chains of uneven lengths with unit runtimes uniform in
    [1, 10] s on ``devices`` devices of speeds 1 and 2. Reports each method's
    makespan over the lower bound; writes crossover.json and crossover.md.
    """
    from apportion.solvers.shards import CPSAT_DIRECT_MAX_UNITS  # noqa: F401 (documented limit)

    rows = []
    for size in sizes:
        for seed in seeds:
            rng = random.Random(1000 * size + seed)
            weights = [rng.uniform(0.3, 1.0) for _ in range(models)]
            counts = [max(1, round(size * w / sum(weights))) for w in weights]
            problem = ShardProblem(
                [ShardDevice(f"g{p}", 2.0 if p % 2 else 1.0) for p in range(devices)],
                [ShardModel(f"m{i}", tuple(rng.uniform(1, 10) for _ in range(n)))
                 for i, n in enumerate(counts)])
            lrtf = solve(problem, "lrtf", budget_s)
            cp = solve(problem, "cp-sat", budget_s, seed=seed, direct_max_units=10**9)
            lb = problem.lower_bound()
            rows.append({"units": problem.num_units, "seed": seed, "lrtf_over_lb": lrtf.makespan / lb,
                         "cpsat_raw_over_lb": cp.extra.get("solver_makespan", cp.makespan) / lb,
                         "cpsat_over_lb": cp.makespan / lb, "cpsat_status": cp.status.value,
                         "cpsat_wall_s": cp.wall_s})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossover.json").write_text(json.dumps({"budget_s": budget_s, "rows": rows}, indent=1))
    intro = (f"CP-SAT (whole instance, LRTF hint, {budget_s} s) vs Sharded-LRTF; makespan / "
             "lower bound, mean over seeds; 'improved' counts seeds where CP-SAT's own "
             "schedule beat LRTF.")
    table = []
    for size in sizes:
        grp = [r for r in rows if abs(r["units"] - size) <= models]
        if not grp:
            continue
        imp = sum(r["cpsat_raw_over_lb"] < r["lrtf_over_lb"] - 1e-9 for r in grp)
        opt = sum(r["cpsat_status"] == "optimal" for r in grp)
        table.append([str(size), f"{statistics.mean(r['lrtf_over_lb'] for r in grp):.4f}",
                      f"{statistics.mean(r['cpsat_raw_over_lb'] for r in grp):.4f}",
                      f"{imp}/{len(grp)}", f"{opt}/{len(grp)}"])
    lines = [intro, "", markdown_table(["units", "LRTF / LB", "CP-SAT raw / LB", "improved",
                                        "optimal"], table).rstrip("\n")]
    (out / "crossover.md").write_text("\n".join(lines) + "\n")
    return rows


cli = typer.Typer(add_completion=False, no_args_is_help=False,
                  help="Hydra figure 6: shard-unit schedulers on growing instances.")


@cli.command()
def fig6(out: Path = typer.Option(Path("experiments/results/hydra_fig6"), "--out",
                                  help="output folder"),
         budget: float = typer.Option(2.0, "--budget", help="solver seconds per instance"),
         seeds: str = typer.Option("0,1,2", "--seeds", help="comma-separated seeds"),
         crossover: bool = typer.Option(False, "--crossover",
                                        help="also run the CP-SAT/LRTF crossover")) -> None:
    """Run figure 6 (and optionally the crossover); print the markdown tables."""
    from apportion import outputs

    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{seeds!r}: give integers separated by commas",
                                 param_hint="--seeds") from None
    if not seed_list or not budget > 0:
        raise typer.BadParameter("need at least one seed and a positive budget")
    try:
        outputs.check_output_dir(out, "--out")
    except InputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    summary = run_fig6(str(out), budget, seed_list)
    print((out / "table.md").read_text())
    log.info("figure 6 done in %.1f s", summary["wall_s"])
    if crossover:
        run_crossover(str(out), budget, seeds=seed_list)
        print((out / "crossover.md").read_text())


def main(argv: Sequence[str] | None = None) -> None:
    cli(args=list(argv) if argv is not None else None,
        prog_name="python -m apportion.experiments.hydra_fig6")


if __name__ == "__main__":
    main()
