"""The catalogs a user picks names from: policies, executors, models, GPU types, trace
formats."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from apportion import outputs
from apportion.cli.common import print_json, user_input
from apportion.console import stdout_console
from apportion.errors import InputError


def policies_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List every registered policy (usable with --policy on solve-round, run, simulate)."""
    from apportion.policies import POLICIES, load_plugins

    load_plugins()  # what installed packages register appears here too

    if as_json:
        import json

        sys.stdout.write(json.dumps(POLICIES, indent=2, sort_keys=True) + "\n")
        return
    t = Table(title="policies")
    t.add_column("name")
    t.add_column("what it does")
    for name, doc in sorted(POLICIES.items()):
        t.add_row(name, doc)
    stdout_console().print(t)


def executors_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")
                  ) -> None:
    """List every executor run and serve take as --executor (plug-ins' too) and the run
    options each reads."""
    from apportion.runtime.executors.registry import RUN_OPTIONS, executors, from_plugin

    found = {k.name: {"what": k.doc, "options": [RUN_OPTIONS[r] for r in k.reads],
                      "needs": k.needs, "plugin": from_plugin(k.name)}
             for k in executors().values()}
    if as_json:
        print_json({"executors": found})
        return
    t = Table(title="executors (run --executor NAME, serve --executor NAME)")
    for col in ("name", "what it does", "reads", "needs"):
        t.add_column(col, overflow="fold")
    for name, e in found.items():  # a plug-in's words are text, never markup
        t.add_row(escape(name + (" (plug-in)" if e["plugin"] else "")), escape(e["what"]),
                  " ".join(e["options"]), escape(e["needs"]))
    stdout_console().print(t)


def traces_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")
               ) -> None:
    """List the trace formats simulate and compare read (plug-ins' too) and the bundled traces."""
    from apportion.experiments.trace_catalog import BUNDLED, GENERATED
    from apportion.experiments.traces import formats
    from apportion.experiments.traces.base import data_root

    fmts = {f.name: {"what": f.doc, "detected_by": f.described(), "truth": f.truth_name(),
                     "truths": list(f.truths) if f.truths is not None else None,
                     "priority": f.priority, "generated": f.generated}
            for f in sorted(formats().values(), key=lambda f: (-f.priority, f.name))}
    root = data_root()
    bundled = {n: {"path": str(root / rel), "present": (root / rel).exists()}
               for n, rel in BUNDLED.items()}
    if as_json:
        print_json({"formats": fmts, "bundled": bundled, "generated": dict(GENERATED)})
        return
    t = Table(title="trace formats (a file is detected by its content; most specific first)")
    for col in ("name", "recognised by", "ground truth", "what it is"):
        t.add_column(col)
    for name, f in fmts.items():
        t.add_row(name, f["detected_by"], f["truth"], f["what"])
    stdout_console().print(t)
    b = Table(title=f"bundled traces (files under {root}; APPORTION_DATA moves it)")
    for col in ("name", "file"):
        b.add_column(col)
    for name, info in bundled.items():
        b.add_row(name, info["path"] + ("" if info["present"] else " (missing)"))
    for name, what in GENERATED.items():
        b.add_row(name, what)
    stdout_console().print(b)


def models(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout")) -> None:
    """List the model catalog with parameter counts and forward FLOPs per sample."""
    from apportion.models import MODEL_NAMES, get_model

    rows = []
    for name in MODEL_NAMES:
        m = get_model(name)
        rows.append({"name": name, "family": m.family, "params": m.params,
                     "flops_per_sample": m.flops_per_sample, "layers": len(m.layers)})
    if as_json:
        print_json({"models": rows})
        return
    t = Table(title="model catalog")
    for col in ("name", "family", "params (B)", "fwd GFLOP/sample", "layers"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["family"], f"{r['params'] / 1e9:.3f}",
                  f"{r['flops_per_sample'] / 1e9:.1f}", str(r["layers"]))
    stdout_console().print(t)


def gpus(as_json: bool = typer.Option(False, "--json", help="print JSON on stdout"),
         aliases: bool = typer.Option(False, "--aliases", help="every name each entry accepts: "
                                      "apportion's aliases, GPU Feature Discovery's "
                                      "gpu.product (and GKE's, AMD's labels), Slurm GRES types, "
                                      "Ray accelerator types")) -> None:
    """List the GPU catalog (vendor data-sheet figures; SXM, PCIe and NVL boards apart)."""
    from apportion.gpus import ambiguous_names, gpu_catalog

    if aliases:
        rows_a = [{"name": g.name, "form_factor": g.form_factor, **{k: list(v) for k, v in
                                                                   g.names().items()}}
                  for g in gpu_catalog().values()]
        shared = ambiguous_names()
        if as_json:
            print_json({"gpus": rows_a, "ambiguous": shared})
            return
        t = Table(title="names each GPU type accepts (case-insensitive; vendor prefixes, '_' "
                        "and blanks optional)")
        for col in ("name", "form", "aliases", "GFD gpu.product / GKE / AMD", "Slurm GRES",
                    "Ray accelerator"):
            t.add_column(col, overflow="fold")
        for r in rows_a:
            t.add_row(r["name"], r["form_factor"], ", ".join(r["aliases"]),
                      ", ".join(r["products"]), ", ".join(r["slurm"]), ", ".join(r["ray"]))
        console = stdout_console()
        console.print(t)
        for a in shared:
            console.print(f"{a['name']}: taken as {a['taken_as']}; may be "
                          f"{' or '.join(a['also'])} ({a['why']})", highlight=False,
                          markup=False)
        return
    rows = [{"name": g.name, "architecture": g.architecture, "memory_gib": g.memory_gib,
             "half_tflops": g.half_tflops, "fp32_tflops": g.fp32_tflops, "hbm_GBps": g.hbm_GBps,
             "link": g.link, "link_GBps": g.link_GBps, "form_factor": g.form_factor,
             "interconnect": g.interconnect, "vendor": g.vendor}
            for g in gpu_catalog().values()]
    if as_json:
        print_json({"gpus": rows})
        return
    t = Table(title="GPU catalog")
    for col in ("name", "arch", "form", "memory GiB", "16-bit TFLOP/s", "fp32 TFLOP/s",
                "HBM GB/s", "link"):
        t.add_column(col)
    for g in rows:
        t.add_row(g["name"], g["architecture"], g["form_factor"], f"{g['memory_gib']:g}",
                  f"{g['half_tflops']:g}", f"{g['fp32_tflops']:g}", f"{g['hbm_GBps']:g}",
                  f"{g['link']} {g['link_GBps']:g} GB/s")
    stdout_console().print(t)


def _schema_names(incomplete: str) -> list[tuple[str, str]]:
    from apportion.cli.schemas import FORMATS

    return [(f.name, f"{f.kind}: {f.doors}") for f in FORMATS if f.name.startswith(incomplete)]


def schema_cmd(
    name: Optional[str] = typer.Argument(None, help="one format (apportion schema --list "
                                         "names them); default: every one",
                                         autocompletion=_schema_names),
    list_names: bool = typer.Option(False, "--list", help="the formats, what reads or writes "
                                    "each"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the JSON here instead of "
                                       "stdout"),
) -> None:
    """JSON Schema of every file apportion reads (cluster, jobs, tenants, settings, ...) and
    writes (the decision, summaries, status, indexes, plots.json)."""
    from apportion.cli.schemas import BY_NAME, FORMATS, all_schemas

    with user_input():
        outputs.check_output(out, "--out")
        if name is not None and name not in BY_NAME:
            raise InputError("NAME", "name", f"unknown format {name!r}; one of "
                             f"{', '.join(BY_NAME)}")
    if list_names:
        t = Table(title="file formats (apportion schema NAME)")
        for col in ("name", "kind", "read or written by"):
            t.add_column(col, overflow="fold")
        for f in FORMATS:
            t.add_row(f.name, f.kind, f.doors)
        stdout_console().print(t)
        return
    doc = BY_NAME[name].json_schema() if name is not None else all_schemas()
    if out is None or outputs.is_stdout(out):
        print_json(doc)
    else:
        outputs.write_json(out, doc, "--out")
