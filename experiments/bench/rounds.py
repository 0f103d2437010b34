"""`apportion bench round`: the whole `solve-round` command, timed as an operator runs it.

Each case writes a held-out round (``experiments.bench.solve``'s generator, seed 1:
never the seed the code was tuned on) as the two YAML files an operator would
give, runs ``apportion solve-round --cluster C --jobs J --time-budget B --json OUT``
as a child process, and records the process's wall time, its CPU time (user +
system, children included: isolated solvers and POP's workers), the 1-minute load
average before it started, and from the decision: backend, status, objective,
bound and gap. The targets (issue 16):

* 1,000 jobs on 1,280 GPUs: the whole process within 2 s on a quiet machine, proven
  optimal or within 0.1 %;
* 10,000 jobs on 20,480 GPUs: within 30 s at no more than 1 % gap, on one machine;
* 20,480 GPUs / 10,000 jobs partitioned (POP, ``--partitions``, local processes or
  Ray tasks): within 60 s at no more than 2 % gap.

On a loaded machine the wall time is the CPU time stretched by the load: the CPU
time is the figure that carries over to a quiet machine.

**Side by side** (``--against PYTHON``): an interpreter whose environment holds another
apportion (the previous release, or a commit installed into a second virtual environment)
runs every case too, alternating with this one run by run (this, other, other, this, ...),
so both see the same load; :func:`ratios` gives each case's median wall and CPU time of
this code over the other's and whether their answers (objective, bound, backend) agree.
With ``--deterministic`` each solver's budget is counted in work, so both answer the same
round the same way on any machine and the times are the only difference.

The command runs as installed (in a scratch folder, so a checkout in the caller's folder
never shadows an interpreter's install), from compiled bytecode. A shell that sets
``PYTHONDONTWRITEBYTECODE`` (this project's sandbox does) would otherwise make every
run compile apportion's modules from source, about 0.1 s more than an operator's
install, where pip compiled them; the children run without it, after one untimed
small round that writes what the command imports (a first run that compiles all it
imports loses the LP relaxation's time to it: `LP relaxation: error (Time limit
reached)`, and HiGHS then answers from the greedy's start).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from apportion.experiments.bench.against import child_env, ratio
from apportion.experiments.bench.solve import synthetic_cluster, synthetic_jobs

from apportion.errors import InputError
from apportion.inputs import parse_count, parse_number
from apportion.memory_guard import check_round_fits

# (jobs, GPUs, GPU types, budget s, partitions, engine)
CASES: list[tuple[int, int, int, float, int, str]] = [
    (1000, 1280, 4, 2.0, 1, "local"),
    (10000, 20480, 4, 30.0, 1, "local"),
    (10000, 20480, 4, 60.0, 4, "local"),
]


#: bounds on a ``--case``: past them the instance alone exhausts memory (10^8 GPUs are
#: 10^8 graph nodes) or the case means nothing (a budget of 0, nan or a day)
MAX_CASE_JOBS = 100_000
MAX_CASE_GPUS = 200_000
MAX_CASE_PARTS = 64
MAX_CASE_BUDGET_S = 3600.0


def parse_cases(specs: list[str] | None) -> list[tuple[int, int, int, float, int, str]] | None:
    """``--case JOBS:GPUS:BUDGET[:PARTS[:ENGINE]]`` values as cases, each number bounded
    before an instance is generated (:class:`InputError` names the part and the limit);
    ``None`` (no ``--case``) is the targets."""
    if not specs:
        return None
    cases = []
    for c in specs:
        f = c.split(":")
        if not 3 <= len(f) <= 5 or f[4:5] not in ([], ["local"], ["ray"]):
            raise InputError("--case", "case", f"{c!r}: JOBS:GPUS:BUDGET[:PARTS[:ENGINE]] "
                             "(ENGINE local or ray)")
        jobs = parse_count(f[0], "--case", maximum=MAX_CASE_JOBS, what="JOBS")
        gpus = parse_count(f[1], "--case", maximum=MAX_CASE_GPUS, what="GPUS")
        budget = float(parse_number(f[2], "--case", "BUDGET", above=0.0,
                                    maximum=MAX_CASE_BUDGET_S))
        parts = parse_count(f[3], "--case", maximum=MAX_CASE_PARTS, what="PARTS") \
            if len(f) > 3 else 1
        check_round_fits(jobs, gpus, "--case", "case")
        cases.append((jobs, gpus, 4, budget, parts, f[4] if len(f) > 4 else "local"))
    return cases


def write_instance(jobs: int, gpus: int, types: int, seed: int, folder: Path) -> tuple[Path, Path]:
    """The round as an operator's two files (cluster and jobs YAML)."""
    cl = synthetic_cluster(gpus, types)
    groups = [{"prefix": g.prefix, "count": g.count, "gpu_type": g.gpu_type,
               "gpus_per_node": g.gpus_per_node, "cpus_per_node": g.cpus_per_node,
               "host_memory_gib": g.host_memory_gib, "intra_node_link": g.intra_node_link,
               "intra_node_bandwidth_GBps": g.intra_node_bandwidth_GBps,
               "inter_node_bandwidth_GBps": g.inter_node_bandwidth_GBps} for g in cl.groups]
    cpath = folder / f"cluster-{gpus}.yaml"
    jpath = folder / f"jobs-{jobs}-s{seed}.yaml"
    cpath.write_text(yaml.safe_dump({"name": cl.name, "node_groups": groups}, sort_keys=False))
    js = [{"id": j.id, "model": j.model, "global_batch_size": j.global_batch_size,
           "iterations": j.iterations, "requested_gpus": j.requested_gpus,
           "requested_gpu_type": j.requested_gpu_type, "submit_time_s": j.submit_time_s}
          for j in synthetic_jobs(jobs, cl.gpu_types, seed)]
    jpath.write_text(yaml.safe_dump({"now_s": 36000.0, "jobs": js}, sort_keys=False))
    return cpath, jpath


def installed_env(folder: Path, pythons: tuple[str, ...] = ()) -> dict[str, str]:
    """The children's environment, bytecode allowed, after one untimed small round (in
    ``folder``) by each interpreter (this one and ``pythons``) has compiled what the
    command imports, the solvers' child included."""
    env = child_env()
    c, j = write_instance(40, 64, 2, 0, folder)
    for python in (sys.executable, *pythons):
        for parts in ("1", "2"):
            subprocess.run([python, "-m", "apportion.cli", "solve-round", "--cluster", str(c),
                            "--jobs", str(j), "--time-budget", "1", "--partitions", parts],
                           env=env, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=folder)
    return env


def time_round(cluster: Path, jobs: Path, budget: float, partitions: int = 1,
               engine: str = "local", extra: list[str] | None = None,
               env: dict[str, str] | None = None, python: str | None = None) -> dict[str, Any]:
    """Run the command once (by ``python``, default this interpreter); its wall and CPU
    time and what it decided."""
    with tempfile.TemporaryDirectory(prefix="ap-bench-") as tmp:
        out = Path(tmp) / "decision.json"
        cmd = [python or sys.executable, "-m", "apportion.cli", "solve-round",
               "--cluster", str(cluster),
               "--jobs", str(jobs), "--time-budget", str(budget), "--json", str(out),
               "--partitions", str(partitions), "--engine", engine, *(extra or [])]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        # run where no checkout's ``apportion`` folder shadows the interpreter's install
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=tmp)
        assert proc.stderr is not None
        err = proc.stderr.read()
        # this command's own usage (its chain child's included): CPU, and the peak resident
        # memory of the largest of its processes
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        wall = time.perf_counter() - t0
        cpu = usage.ru_utime + usage.ru_stime
        row: dict[str, Any] = {"budget_s": budget, "partitions": partitions, "engine": engine,
                               "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                               "peak_rss_mib": round(usage.ru_maxrss / 1024.0, 1),
                               "load_before": round(load, 2), "exit": proc.returncode}
        if proc.returncode != 0 or not out.exists():
            row["error"] = err.strip().splitlines()[-3:]
            return row
        rep = json.loads(out.read_text())["solver"]
        row.update({k: rep.get(k) for k in ("backend", "status", "objective", "bound", "gap",
                                            "fallback")})
        row["solver_wall_s"] = rep.get("wall_s")
        row["columns"] = (rep.get("model_size") or {}).get("variables")
        row["attempts"] = [(a["backend"], a["status"], a.get("wall_s")) for a in rep["attempts"]]
        return row


def main(cases: list[tuple[int, int, int, float, int, str]] | None = None, seed: int = 1,
         repeat: int = 1, formulation: str = "cells", against: str | None = None,
         deterministic: bool = False) -> list[dict[str, Any]]:
    """Each case's round timed ``repeat`` times; ``formulation`` (cells, plans, ...) is the
    command's ``--formulation`` (plans: Morphling's plans x GPUs, CPUs and memory, whose
    targets are issue 43 item 4's: 1,000 jobs on 1,280 GPUs within 10 s, within 1 %);
    ``against``: another install's interpreter, run alternately with this one (each row's
    ``code`` says which: ``this`` or ``against``); ``deterministic``: the command's
    ``--deterministic`` (budgets counted in work)."""
    rows = []
    extra = [] if formulation == "cells" else ["--formulation", formulation]
    if deterministic:
        extra.append("--deterministic")
    with tempfile.TemporaryDirectory(prefix="ap-rounds-") as tmp:
        env = installed_env(Path(tmp), (against,) if against else ())
        for jobs, gpus, types, budget, parts, engine in cases or CASES:
            c, j = write_instance(jobs, gpus, types, seed, Path(tmp))
            for k in range(repeat):
                order = [("this", None)] if against is None else \
                    [("this", None), ("against", against)][::1 if k % 2 == 0 else -1]
                for code, python in order:
                    row = time_round(c, j, budget, parts, engine, extra, env=env, python=python)
                    row.update({"jobs": jobs, "gpus": gpus, "types": types, "seed": seed,
                                "formulation": formulation, "deterministic": deterministic})
                    if against is not None:
                        row.update({"code": code, "python": python or sys.executable})
                    rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case of a side-by-side run: the median wall and CPU time of each code, this
    code's over the other's, the load around them, and whether every run of both answered
    alike (same backend, objective and bound to ten significant digits: a deterministic
    run's answers repeat, and the same LP solved by another path may differ in its last
    bits)."""
    out = []
    by_case: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if "code" in r:
            key = (r["jobs"], r["gpus"], r["budget_s"], r["partitions"], r["engine"])
            by_case.setdefault(key, []).append(r)
    for (jobs, gpus, budget, parts, engine), rs in by_case.items():
        med = {}
        for code in ("this", "against"):
            mine = [r for r in rs if r["code"] == code and r["exit"] == 0]
            med[code] = ({k: statistics.median(r[k] for r in mine) for k in ("wall_s", "cpu_s")}
                         if mine else None)
        answers = {(r.get("backend"), _digits(r.get("objective")), _digits(r.get("bound")))
                   for r in rs}
        row: dict[str, Any] = {"jobs": jobs, "gpus": gpus, "budget_s": budget,
                               "partitions": parts, "engine": engine,
                               "runs": len(rs) // 2, "answers_agree": len(answers) == 1,
                               "load": [min(r["load_before"] for r in rs),
                                        max(r["load_before"] for r in rs)]}
        for code in ("this", "against"):
            for k in ("wall_s", "cpu_s"):
                row[f"{code}_{k}"] = None if med[code] is None else round(med[code][k], 3)
        for k in ("wall_s", "cpu_s"):
            row[f"ratio_{k.split('_')[0]}"] = ratio(row[f"this_{k}"], row[f"against_{k}"])
        out.append(row)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    side = ratios(rows)
    return _rows_markdown(rows) + ("" if not side else "\n" + ratios_markdown(side))


def ratios_markdown(side: list[dict[str, Any]]) -> str:
    """:func:`ratios` as a table: this code's median time over the other's, per case."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    return ("This code against `--against` (medians; a ratio below 1: this code is faster):\n\n"
            "| jobs | GPUs | budget s | runs each | wall s (this / against) | ratio | "
            "CPU s (this / against) | ratio | load | answers agree |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n" + "".join(
                f"| {r['jobs']} | {r['gpus']} | {r['budget_s']:g} | {r['runs']} | "
                f"{fmt(r['this_wall_s'])} / {fmt(r['against_wall_s'])} | {fmt(r['ratio_wall'])} | "
                f"{fmt(r['this_cpu_s'])} / {fmt(r['against_cpu_s'])} | {fmt(r['ratio_cpu'])} | "
                f"{r['load'][0]}-{r['load'][1]} | {'yes' if r['answers_agree'] else 'no'} |\n"
                for r in side))


def _rows_markdown(rows: list[dict[str, Any]]) -> str:
    coded = any("code" in r for r in rows)
    head = (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; `load` is the 1-minute load average before the run; "
            "`CPU s` is user + system time of the process and its children.\n\n"
            "`peak MiB` is the peak resident memory of the largest of its processes.\n\n"
            "| jobs | GPUs | budget s | parts | engine | " + ("code | " if coded else "")
            + "wall s | CPU s | peak MiB | load | backend | status | objective | bound | gap |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if coded else "")
            + "\n")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    return head + "".join(
        f"| {r['jobs']} | {r['gpus']} | {r['budget_s']:g} | {r['partitions']} | {r['engine']} | "
        + (f"{r.get('code', '-')} | " if coded else "") +
        f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {fmt(r.get('peak_rss_mib'), '.0f')} | "
        f"{r['load_before']} | {r.get('backend', '-')} | "
        f"{r.get('status', r.get('error'))} | {fmt(r.get('objective'), '.6g')} | "
        f"{fmt(r.get('bound'), '.6g')} | {fmt(r.get('gap'), '.3%')} |\n" for r in rows)


def _digits(value: float | None) -> float | None:
    """``value`` to ten significant digits (None stays None): what two answers must share."""
    return None if value is None else float(f"{value:.10g}")


__all__ = ["CASES", "installed_env", "main", "markdown", "ratios",
           "ratios_markdown", "time_round", "write_instance"]
