"""How a round's decision is shown: the allocation table on stdout (stderr when the data
goes to stdout), the solver report on stderr; past 200 rows as plain aligned text, since
Rich spends longer laying out a big table than the solver took."""

from __future__ import annotations

import sys
from typing import Any

from rich.table import Table
from rich.text import Text

from apportion.console import printable, stderr_console, stdout_console


def _decision_table(decision: Any) -> Table:
    t = Table(title="apportion round decision", show_lines=False)
    for col in ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
                "est. throughput (samples/s)"):
        t.add_column(col, overflow="fold")
    for a in sorted(decision.allocations, key=lambda a: a.job):
        place = ", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))
        t.add_row(Text(printable(a.job, False)), a.action.value, a.gpu_type, str(a.gpus),
                  str(a.stages), a.plan.label(), printable(place), f"{a.est_throughput:.2f}")
    for p in sorted(decision.pending, key=lambda p: p.job):
        t.add_row(Text(printable(p.job, False)), (p.action.value if p.action else "pending"),
                  "-", "-", "-", "-", f"pending: {p.reason.value}", "-")
    return t


def _decision_rows(decision: Any) -> list[tuple[str, ...]]:
    rows = [(printable(a.job, False), a.action.value, a.gpu_type, str(a.gpus), str(a.stages),
             a.plan.label(), printable(", ".join(f"{n}:{k}" for n, k in sorted(a.placement.items()))),
             f"{a.est_throughput:.2f}") for a in sorted(decision.allocations, key=lambda a: a.job)]
    rows += [(printable(p.job, False), p.action.value if p.action else "pending", "-", "-", "-",
              "-", f"pending: {p.reason.value}", "-")
             for p in sorted(decision.pending, key=lambda p: p.job)]
    return rows


def _plain_decision(rows: list[tuple[str, ...]], stream: Any) -> None:
    """The decision table's columns as aligned plain text: for a big round (past 200 rows),
    where Rich spends longer laying the table out than the solver took."""
    head = ("job", "action", "GPU type", "GPUs", "stages", "plan", "placement",
            "est. throughput (samples/s)")
    width = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-2])]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, width)) + "  " + "  ".join(r[-2:])

    stream.write("apportion round decision\n" + line(head) + "\n"
                 + "".join(line(r) + "\n" for r in rows))
    stream.flush()


def _report_lines(decision: Any) -> str:
    r = decision.report
    gap = "n/a" if r.gap is None else f"{r.gap:.2%}"
    bound = "n/a" if r.bound is None else f"{r.bound:.4f}"
    obj = "n/a" if r.objective is None else f"{r.objective:.4f}"
    lines = [(f"solver: {r.backend}  status: {r.status}  objective: {obj}  bound: {bound}  "
              f"gap: {gap}  wall: {r.wall_s:.3f}s  fallback: {r.fallback}")]
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
    return printable("\n".join(lines))


def show_decision(decision: Any, data_on_stdout: bool) -> None:
    """The decision table on stdout (stderr when an output option is ``-``), the solver
    report on stderr."""
    rows = _decision_rows(decision)
    if len(rows) > 200:
        _plain_decision(rows, sys.stderr if data_on_stdout else sys.stdout)
    else:
        console = stderr_console() if data_on_stdout else stdout_console()
        console.print(_decision_table(decision))
    stderr_console().print(_report_lines(decision), highlight=False, markup=False)
