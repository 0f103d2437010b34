"""`apportion bench round`: the whole `solve-round` command, timed as an operator runs it.

Each case writes a held-out round (``experiments.bench.solve``'s generator, seed 1:
never the seed the code was tuned on) as the two files an operator would give (the
cluster YAML, and the queue as YAML up to :data:`YAML_CASE_JOBS` jobs, as JSON lines
past it: docs/formats.md), runs ``apportion solve-round --cluster C --jobs J
--time-budget B --json OUT`` as a child process, and records the process's wall time,
its CPU time (user + system, children included: isolated solvers and POP's workers),
its memory (the peak resident set of the largest of its processes, and the peak of
the proportional set size summed over its whole process tree, sampled twice a second:
a Ray instance's workers included), the 1-minute load average before it started, and
from the decision: backend, status, objective, bound and gap. With ``store`` the same
queue goes through the state store instead: ``apportion submit J --state DB`` (timed
on its own), then ``solve-round --state DB``, which reads the queue from the store and
commits the round to it. The targets (issue 16):

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
round the same way on any machine and the times are the only difference; a partitioned
case (``PARTS`` > 1) too, each part with its share of the work (solvers/partition.py),
so POP's parts on Ray and the unpartitioned round are compared on fixed answers.

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
import threading
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
#: 10^8 graph nodes) or the case means nothing (a budget of 0, nan or a day); below them
#: the memory guard refuses a case this machine cannot hold (apportion.memory_guard)
MAX_CASE_JOBS = 1_000_000
MAX_CASE_GPUS = 2_000_000
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


#: the largest case whose queue is written as YAML; past it, JSON lines (the reader's
#: 4 MB of YAML hold about 26,000 jobs, and 100,000 jobs of YAML took 83 s to write and
#: 36 s to parse: experiments/results/bench/speed.md)
YAML_CASE_JOBS = 20_000
QUEUE_FORMATS = ("auto", "yaml", "jsonl")


def write_instance(jobs: int, gpus: int, types: int, seed: int, folder: Path,
                   queue: str = "auto") -> tuple[Path, Path]:
    """The round as an operator's two files: the cluster YAML, and the queue as YAML or
    JSON lines (``queue``: ``auto`` is YAML up to :data:`YAML_CASE_JOBS` jobs)."""
    cl = synthetic_cluster(gpus, types)
    groups = [{"prefix": g.prefix, "count": g.count, "gpu_type": g.gpu_type,
               "gpus_per_node": g.gpus_per_node, "cpus_per_node": g.cpus_per_node,
               "host_memory_gib": g.host_memory_gib, "intra_node_link": g.intra_node_link,
               "intra_node_bandwidth_GBps": g.intra_node_bandwidth_GBps,
               "inter_node_bandwidth_GBps": g.inter_node_bandwidth_GBps} for g in cl.groups]
    lines = queue == "jsonl" or (queue == "auto" and jobs > YAML_CASE_JOBS)
    cpath = folder / f"cluster-{gpus}.yaml"
    jpath = folder / f"jobs-{jobs}-s{seed}.{'jsonl' if lines else 'yaml'}"
    cpath.write_text(yaml.safe_dump({"name": cl.name, "node_groups": groups}, sort_keys=False))
    js = [{"id": j.id, "model": j.model, "global_batch_size": j.global_batch_size,
           "iterations": j.iterations, "requested_gpus": j.requested_gpus,
           "requested_gpu_type": j.requested_gpu_type, "submit_time_s": j.submit_time_s}
          for j in synthetic_jobs(jobs, cl.gpu_types, seed)]
    if lines:  # the header declares the count and the clock (docs/formats.md)
        with jpath.open("w") as fh:
            fh.write(json.dumps({"format": "apportion-jobs", "jobs": len(js),
                                 "now_s": 36000.0}) + "\n")
            fh.writelines(json.dumps(j) + "\n" for j in js)
    else:
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


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree(pid: int) -> dict[int, float]:
    """``pid`` and every process below it (from ``/proc``: each process's parent), each
    with the CPU seconds it has used so far (user + system)."""
    kids: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        kids.setdefault(int(fields[1]), []).append(int(name))
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) / _TICK
    out: dict[int, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        out[p] = cpu.get(p, 0.0)
        todo.extend(kids.get(p, ()))
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeMemory:
    """The peak, over a command's life, of the proportional set size (PSS: a page shared
    by n processes counts 1/n in each) summed over its process tree, sampled every
    ``every_s``: what the command holds of the machine, its solver children and a Ray
    instance's workers included, which the largest single process (``ru_maxrss``)
    understates; and the tree's CPU seconds (each process's last sample: a process's
    last half second before it ends is missed), which counts a Ray instance's workers
    that ``wait4``'s usage may not. Linux only (``/proc``); elsewhere it reports
    nothing."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.pid, self.every_s, self.peak_kib = pid, every_s, 0
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            tree = _tree(self.pid)
            self.cpu.update(tree)
            with_pss = sum(_pss_kib(p) for p in tree)
            self.peak_kib = max(self.peak_kib, with_pss)
            self._stop.wait(self.every_s)

    @property
    def cpu_s(self) -> float | None:
        return round(sum(self.cpu.values()), 1) if self.cpu else None

    def __enter__(self) -> TreeMemory:
        if os.path.isdir("/proc/self"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def peak_mib(self) -> float | None:
        return round(self.peak_kib / 1024.0, 1) if self.peak_kib else None


def _run_timed(cmd: list[str], env: dict[str, str] | None, cwd: str) -> dict[str, Any]:
    """Run ``cmd`` once: its exit code, stderr, wall and CPU time (its children's
    included), the peak resident memory of its largest process and its tree's peak PSS
    (:class:`TreeMemory`)."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    # run where no checkout's ``apportion`` folder shadows the interpreter's install
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd)
    assert proc.stderr is not None
    with TreeMemory(proc.pid) as mem:
        err = proc.stderr.read()
        # this command's own usage (its chain child's included): CPU, and the peak
        # resident memory of the largest of its processes
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    return {"exit": proc.returncode, "err": err, "wall_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024.0, 1),
            "tree_pss_mib": mem.peak_mib, "tree_cpu_s": mem.cpu_s,
            "load_before": round(load, 2)}


def time_round(cluster: Path, jobs: Path, budget: float, partitions: int = 1,
               engine: str = "local", extra: list[str] | None = None,
               env: dict[str, str] | None = None, python: str | None = None,
               store: bool = False) -> dict[str, Any]:
    """Run the command once (by ``python``, default this interpreter); its wall and CPU
    time, memory and what it decided. ``store``: the queue submitted to a fresh state
    store first (its ``submit_*`` figures), then the round solved from the store and
    committed to it."""
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="ap-bench-") as tmp:
        out = Path(tmp) / "decision.json"
        queue = ["--jobs", str(jobs)]
        row: dict[str, Any] = {"budget_s": budget, "partitions": partitions, "engine": engine,
                               "door": "store" if store else "jobs",
                               "queue": "jsonl" if jobs.suffix == ".jsonl" else "yaml",
                               "queue_mb": round(jobs.stat().st_size / 1e6, 2)}
        if store:
            db = Path(tmp) / "bench.db"
            sub = _run_timed([python, "-m", "apportion.cli", "submit", str(jobs), "--state",
                              str(db)], env, tmp)
            row.update({f"submit_{k}": sub[k] for k in ("wall_s", "cpu_s", "peak_rss_mib")})
            if sub["exit"] != 0:
                row.update({k: sub[k] for k in ("wall_s", "cpu_s", "peak_rss_mib",
                                                "tree_pss_mib", "tree_cpu_s", "load_before",
                                                "exit")})
                row["error"] = sub["err"].strip().splitlines()[-3:]
                return row
            queue = ["--state", str(db)]
        cmd = [python, "-m", "apportion.cli", "solve-round", "--cluster", str(cluster),
               *queue, "--time-budget", str(budget), "--json", str(out),
               "--partitions", str(partitions), "--engine", engine, *(extra or [])]
        ran = _run_timed(cmd, env, tmp)
        err = ran.pop("err")
        row.update(ran)
        if ran["exit"] != 0 or not out.exists():
            row["error"] = err.strip().splitlines()[-3:]
            return row
        decision = json.loads(out.read_text())
        rep = decision["solver"]
        # where the round's time went, stage by stage (admit, candidates, ..., validate)
        row["stages"] = {k: round(float(v), 3) for k, v in
                         (decision.get("meta") or {}).get("stages", {}).items()}
        row.update({k: rep.get(k) for k in ("backend", "status", "objective", "bound", "gap",
                                            "fallback")})
        row["solver_wall_s"] = rep.get("wall_s")
        row["columns"] = (rep.get("model_size") or {}).get("variables")
        row["attempts"] = [(a["backend"], a["status"], a.get("wall_s")) for a in rep["attempts"]]
        row["messages"] = [str(a.get("message", ""))[:400] for a in rep["attempts"]]
        return row


def main(cases: list[tuple[int, int, int, float, int, str]] | None = None, seed: int = 1,
         repeat: int = 1, formulation: str = "cells", against: str | None = None,
         deterministic: bool = False, queue: str = "auto",
         store: bool = False) -> list[dict[str, Any]]:
    """Each case's round timed ``repeat`` times; ``formulation`` (cells, plans, ...) is the
    command's ``--formulation`` (plans: Morphling's plans x GPUs, CPUs and memory, whose
    targets are issue 43 item 4's: 1,000 jobs on 1,280 GPUs within 10 s, within 1 %);
    ``against``: another install's interpreter, run alternately with this one (each row's
    ``code`` says which: ``this`` or ``against``); ``deterministic``: the command's
    ``--deterministic`` (budgets counted in work); ``queue``: the queue file's format
    (:data:`QUEUE_FORMATS`); ``store``: through the state store (:func:`time_round`)."""
    rows = []
    extra = [] if formulation == "cells" else ["--formulation", formulation]
    if deterministic:
        extra.append("--deterministic")
    with tempfile.TemporaryDirectory(prefix="ap-rounds-") as tmp:
        env = installed_env(Path(tmp), (against,) if against else ())
        for jobs, gpus, types, budget, parts, engine in cases or CASES:
            c, j = write_instance(jobs, gpus, types, seed, Path(tmp), queue)
            for k in range(repeat):
                order = [("this", None)] if against is None else \
                    [("this", None), ("against", against)][::1 if k % 2 == 0 else -1]
                for code, python in order:
                    row = time_round(c, j, budget, parts, engine, extra, env=env, python=python,
                                     store=store)
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
            "`peak MiB` is the peak resident memory of the largest of its processes; "
            "`tree MiB` the peak proportional set size of its whole process tree (solver "
            "children and a Ray instance's workers included), `tree CPU s` that tree's CPU "
            "time, sampled twice a second; `door` the queue's way in "
            "(`jobs`: `--jobs FILE`, of the `queue` format; `store`: `submit` then "
            "`--state`, whose submit seconds are the `submit s` column).\n\n"
            "| jobs | GPUs | budget s | parts | engine | door | queue | submit s | "
            + ("code | " if coded else "")
            + "wall s | CPU s | tree CPU s | peak MiB | tree MiB | load | backend | status | "
            "objective | bound | gap |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            + ("---|" if coded else "") + "\n")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    return head + "".join(
        f"| {r['jobs']} | {r['gpus']} | {r['budget_s']:g} | {r['partitions']} | {r['engine']} | "
        f"{r.get('door', 'jobs')} | {r.get('queue', 'yaml')} | "
        f"{fmt(r.get('submit_wall_s'), '.2f')} | "
        + (f"{r.get('code', '-')} | " if coded else "") +
        f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {fmt(r.get('tree_cpu_s'), '.1f')} | "
        f"{fmt(r.get('peak_rss_mib'), '.0f')} | "
        f"{fmt(r.get('tree_pss_mib'), '.0f')} | {r['load_before']} | {r.get('backend', '-')} | "
        f"{r.get('status', r.get('error'))} | {fmt(r.get('objective'), '.6g')} | "
        f"{fmt(r.get('bound'), '.6g')} | {fmt(r.get('gap'), '.3%')} |\n" for r in rows)


def _digits(value: float | None) -> float | None:
    """``value`` to ten significant digits (None stays None): what two answers must share."""
    return None if value is None else float(f"{value:.10g}")


__all__ = ["CASES", "QUEUE_FORMATS", "YAML_CASE_JOBS", "TreeMemory", "installed_env", "main",
           "markdown", "ratios", "ratios_markdown", "time_round", "write_instance"]
