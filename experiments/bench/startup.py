"""The front door's cost: ``apportion --version``, ``apportion --help`` and a command's own
``--help``, each beside a bare ``python -c pass`` on the same machine (and beside the import
of Typer with its rich help, the floor any Typer application's ``--help`` stands on), and
the modules each imports.

The cases run in turn, run after run (pass, --version, --help, ..., pass, --version, ...),
so every case sees the same load; each case's figure is its median over the runs, and the
cost of the front door is its median over ``python -c pass``'s. The target (issue 63 item
7): ``--version`` and ``--help`` within 0.15 s of ``python -c pass``. On a loaded machine
the wall time is the CPU time stretched by the load: the CPU time (user + system) is the
figure that carries over to a quiet machine, and the 1-minute load average is recorded
beside. The modules a case imports are those in ``sys.modules`` when it exits,
``python -c pass``'s own included.

**Side by side** (``--against PYTHON``): the interpreter of another install (the previous
commit in a second virtual environment) runs every case too, alternating with this one, and
its ``apportion`` script (beside that interpreter) is the one timed.

The commands run as installed: from a scratch folder (a checkout in the caller's folder
never shadows an install), with bytecode (after one untimed run of each case, which writes
it: a shell that sets ``PYTHONDONTWRITEBYTECODE``, as this project's sandbox does, would
otherwise time the compilation of apportion's modules too).

    python -m apportion.experiments.bench.startup --runs 15 [--against OTHER/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: case -> the ``apportion`` arguments, or the Python code ``python -c`` runs: the bare
#: interpreter, and the floor any Typer application's ``--help`` stands on (Typer and the
#: rich help it renders with) for comparison
CASES: dict[str, list[str] | str] = {
    "python -c pass": "pass",
    "python: import typer + its rich help": "import typer, typer.rich_utils",
    "apportion --version": ["--version"],
    "apportion --help": ["--help"],
    "apportion solve-round --help": ["solve-round", "--help"],
}
#: what ``--version`` and ``--help`` may cost over ``python -c pass`` (issue 63 item 7)
TARGET_S = 0.15


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["COLUMNS"] = "100"
    return env


def _command(python: str, args: list[str] | str) -> list[str]:
    if isinstance(args, str):
        return [python, "-c", args]
    return [str(Path(python).parent / "apportion"), *args]


def _time(cmd: list[str], cwd: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   env=_env(), cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def modules(python: str, args: list[str] | str, cwd: str | None = None) -> list[str]:
    """The modules a case has imported when it exits (``sys.modules``, sorted), the
    interpreter's own at startup included."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", dir=cwd) as out:
        dump = (f"import atexit, json, sys; atexit.register(lambda: json.dump(sorted("
                f"sys.modules), open({out.name!r}, 'w')))")
        run = f"; {args}" if isinstance(args, str) else (
            f"; sys.argv = ['apportion', *{args!r}]; from apportion.cli import main; main()")
        subprocess.run([python, "-c", dump + run], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=_env(), cwd=cwd or tempfile.gettempdir(),
                       check=False)  # a command's exit status is not what is counted
        return list(json.loads(out.read() or "[]"))


def measure(runs: int = 15, against: str | None = None) -> dict[str, Any]:
    """Each case's median wall and CPU seconds, its cost over ``python -c pass`` and the
    modules it imports, per interpreter; the load average before and after."""
    pythons = {"this": sys.executable} | ({"other": against} if against else {})
    with tempfile.TemporaryDirectory(prefix="apportion-startup-") as cwd:
        for python in pythons.values():  # one untimed run each: bytecode written
            for args in CASES.values():
                _time(_command(python, args), cwd)
        load_before = os.getloadavg()[0]
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for i in range(runs):
            order = list(pythons.items())
            for label, python in order if i % 2 == 0 else order[::-1]:
                for case, args in CASES.items():
                    times.setdefault((label, case), []).append(_time(_command(python, args),
                                                                     cwd))
        load_after = os.getloadavg()[0]
        out: dict[str, Any] = {"runs": runs, "load_1min": [round(load_before, 2),
                                                           round(load_after, 2)],
                               "target_over_pass_s": TARGET_S, "cases": {}}
        for label, python in pythons.items():
            base_wall = statistics.median(w for w, _ in times[(label, "python -c pass")])
            base_cpu = statistics.median(c for _, c in times[(label, "python -c pass")])
            rows = {}
            for case, args in CASES.items():
                wall = statistics.median(w for w, _ in times[(label, case)])
                cpu = statistics.median(c for _, c in times[(label, case)])
                rows[case] = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                              "wall_over_pass_s": round(wall - base_wall, 4),
                              "cpu_over_pass_s": round(cpu - base_cpu, 4),
                              "modules": len(modules(python, args, cwd))}
            out["cases"][label] = {"python": python, "rows": rows}
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [(f"{res['runs']} runs a case, 1-minute load {res['load_1min'][0]} before, "
              f"{res['load_1min'][1]} after; medians"), "",
             "| install | case | wall s | over pass | CPU s | over pass | modules |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for label, block in res["cases"].items():
        for case, r in block["rows"].items():
            lines.append(f"| {label} | {case} | {r['wall_s']:.3f} | {r['wall_over_pass_s']:.3f}"
                         f" | {r['cpu_s']:.3f} | {r['cpu_over_pass_s']:.3f} | {r['modules']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m apportion.experiments.bench.startup",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=15, help="runs of each case (default 15)")
    ap.add_argument("--against", help="another install's python, timed alternately")
    ap.add_argument("--json", type=Path, help="write the result JSON here")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    res = measure(args.runs, args.against)
    print(markdown(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
