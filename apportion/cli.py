"""The command line: wires commands to the round loop and to the areas, nothing more.

Data goes to files and stdout; progress and logs go to stderr. Any bad input
exits with code 2 and a message naming the file and the field, and nothing is
written.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from apportion.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="apportion: joint resource allocation and execution planning for DL training.")
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
log = logging.getLogger("apportion")

EXIT_BAD_INPUT = 2


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _check_output_path(path: Optional[Path], option: str) -> None:
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(str(path), option, "is a directory; give a file name")
    if not parent.exists():
        raise InputError(str(path), option, f"directory {parent} does not exist")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _decision_table(decision: Any) -> Table:
    t = Table(title="apportion round decision", show_lines=False)
    for col in ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
                "est. throughput (samples/s)"):
        t.add_column(col, overflow="fold")
    for a in sorted(decision.allocations, key=lambda a: a.job):
        place = ", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))
        t.add_row(a.job, a.action.value, a.gpu_type, str(a.gpus), str(a.stages), a.plan.label(),
                  place, f"{a.est_throughput:.2f}")
    for p in sorted(decision.pending, key=lambda p: p.job):
        t.add_row(p.job, (p.action.value if p.action else "pending"), "-", "-", "-", "-",
                  f"pending: {p.reason.value}", "-")
    return t


def _report_lines(decision: Any) -> str:
    r = decision.report
    gap = "n/a" if r.gap is None else f"{r.gap:.2%}"
    bound = "n/a" if r.bound is None else f"{r.bound:.4f}"
    obj = "n/a" if r.objective is None else f"{r.objective:.4f}"
    lines = [f"solver: {r.backend}  status: {r.status}  objective: {obj}  bound: {bound}  "
             f"gap: {gap}  wall: {r.wall_s:.3f}s  fallback: {r.fallback}"]
    if r.fallback_reason:
        lines.append(f"fallback reason: {r.fallback_reason}")
    for a in r.attempts:
        lines.append(f"  tried {a['backend']}: {a['status']} objective={a['objective']} "
                     f"wall={a['wall_s']}s {a.get('message', '')}")
    ms = r.model_size
    if ms:
        lines.append(f"model: {ms.get('variables')} variables, {ms.get('rows')} rows; "
                     f"{ms.get('jobs')} jobs, {ms.get('cells')} cells, {ms.get('nodes')} nodes "
                     f"in {ms.get('node_classes')} classes")
    return "\n".join(lines)


@app.command("solve-round")
def solve_round(
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster YAML (default: Crius's testbed)"),
    jobs: Optional[Path] = typer.Option(None, "--jobs", help="jobs YAML (default: a dozen Crius jobs)"),
    time_budget: float = typer.Option(10.0, "--time-budget", min=0.01, help="solver wall-clock budget, s"),
    backend: str = typer.Option("auto", "--backend", help="auto | cp-sat | highs | greedy"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the decision JSON here"),
    dump_problem: Optional[Path] = typer.Option(None, "--dump-problem",
                                                help="write the candidates and estimates as JSON"),
    search_depth: int = typer.Option(3, "--search-depth", min=0, help="greedy local-search depth"),
    max_changes: Optional[int] = typer.Option(None, "--max-changes", min=0,
                                              help="at most this many running jobs changed"),
    formulation: str = typer.Option("cells", "--formulation", help="cells"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Solve one scheduling round: read cluster and queue, decide, validate, report."""
    _setup_logging(verbose)
    from apportion.config import default_cluster, default_jobs, load_cluster, load_jobs
    from apportion.round import RoundConfig, run_round

    try:
        if backend not in ("auto", "cp-sat", "highs", "greedy"):
            raise InputError("--backend", "backend", f"{backend!r} is not one of auto, cp-sat, "
                                                     "highs, greedy")
        if formulation != "cells":
            raise InputError("--formulation", "formulation",
                             f"{formulation!r} is not available; available: cells")
        _check_output_path(json_out, "--json")
        _check_output_path(dump_problem, "--dump-problem")
        cl = load_cluster(cluster) if cluster else default_cluster()
        jb, now = load_jobs(jobs) if jobs else default_jobs()
    except InputError as exc:
        _fail(exc)
        return
    cfg = RoundConfig(backend=backend, time_budget_s=time_budget, search_depth=search_depth,
                      max_changes=max_changes)
    result = run_round(cl, jb, now, cfg)
    out.print(_decision_table(result.decision))
    err.print(_report_lines(result.decision), highlight=False, markup=False)
    if json_out:
        write_json_atomic(json_out, result.decision.as_dict())
    if dump_problem:
        write_json_atomic(dump_problem, result.problem)


@app.command("models")
def models() -> None:
    """List the model catalog with parameter counts and forward FLOPs per sample."""
    from apportion.models import MODEL_NAMES, get_model

    t = Table(title="model catalog")
    for col in ("name", "family", "params (B)", "fwd GFLOP/sample", "layers"):
        t.add_column(col)
    for name in MODEL_NAMES:
        m = get_model(name)
        t.add_row(name, m.family, f"{m.params / 1e9:.3f}", f"{m.flops_per_sample / 1e9:.1f}",
                  str(len(m.layers)))
    out.print(t)


@app.command("gpus")
def gpus() -> None:
    """List the GPU catalog (vendor data-sheet figures)."""
    from apportion.gpus import gpu_catalog

    t = Table(title="GPU catalog")
    for col in ("name", "arch", "memory GiB", "16-bit TFLOP/s", "fp32 TFLOP/s", "HBM GB/s", "link"):
        t.add_column(col)
    for g in gpu_catalog().values():
        t.add_row(g.name, g.architecture, f"{g.memory_gib:g}", f"{g.half_tflops:g}",
                  f"{g.fp32_tflops:g}", f"{g.hbm_GBps:g}", f"{g.link} {g.link_GBps:g} GB/s")
    out.print(t)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
