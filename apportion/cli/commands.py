"""Every command by name: the module and function that hold it, and the first paragraph of
its help, so the command line imports a command's module only when that command runs.

``apportion --help`` (and ``apportion bench --help``, completion of a command's name, a
typo's suggestion) reads this table alone; running a command, or asking for its own
``--help``, imports its module then (pip's ``commands_dict`` is the model). A command's
module imports what the command uses, and nothing any other command needs: ``apportion
--version`` imports none of them, and a one-off ``solve-round`` none but its own.
``tests/test_front_door.py`` checks that each summary here is its command's, and counts
what the front door imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

from apportion.batch_gc import collector_paused


@dataclass(frozen=True)
class Entry:
    """One command: its name, where its function lives (``module:function``, a module of
    :mod:`apportion.cli`), and the first paragraph of its help (the function's docstring)."""

    name: str
    target: str
    summary: str


ROOT = (
    Entry("solve-round", "cmd_round:solve_round",
          "Solve one scheduling round: read cluster and queue, decide, validate, report."),
    Entry("policies", "cmd_catalog:policies_cmd",
          "List every registered policy (usable with --policy on solve-round, run, simulate)."),
    Entry("executors", "cmd_catalog:executors_cmd",
          "List every executor run and serve take as --executor (plug-ins' too) and the run\n"
          "options each reads."),
    Entry("traces", "cmd_catalog:traces_cmd",
          "List the trace formats simulate and compare read (plug-ins' too) and the bundled "
          "traces."),
    Entry("models", "cmd_catalog:models",
          "List the model catalog with parameter counts and forward FLOPs per sample."),
    Entry("gpus", "cmd_catalog:gpus",
          "List the GPU catalog (vendor data-sheet figures; SXM, PCIe and NVL boards apart)."),
    Entry("schema", "cmd_catalog:schema_cmd",
          "JSON Schema of every file apportion reads (cluster, jobs, tenants, settings, ...) "
          "and\nwrites (the decision, summaries, status, indexes, plots.json)."),
    Entry("submit", "cmd_store:submit",
          "Add the jobs of a queue file (YAML or JSON lines) to the state store, all or "
          "nothing."),
    Entry("cancel", "cmd_store:cancel",
          "Cancel a job: it is dropped and its GPUs are free for the next round."),
    Entry("status", "cmd_store:status",
          "Jobs and their lifecycle states (a waiting job with its reason), the queue, cluster "
          "use\nand node health. Needs only read access to the store."),
    Entry("history", "cmd_store:history", "Committed rounds with their solver reports."),
    Entry("simulate", "cmd_replay:simulate_cmd",
          "Replay a trace on a simulated cluster under one policy; print and write the "
          "summary."),
    Entry("compare", "cmd_replay:compare_cmd",
          "Replay a trace under many policies and seeds in parallel; write CSV, markdown, "
          "plots."),
    Entry("profile", "cmd_research:profile_cmd",
          "Profile a model's DP-only and TP-only stage shards (per-layer torch, or JAX "
          "compile)."),
    Entry("estimate", "cmd_research:estimate_cmd",
          "Estimate one cell with the estimators and tune it (Crius 5.1-5.2)."),
    Entry("solve-shards", "cmd_research:solve_shards_cmd",
          "Hydra: schedule shard units of several models on devices (makespan job shop)."),
    Entry("solve-finetune", "cmd_research:solve_finetune_cmd",
          "YMIR: choose normal / temporal / spatial modes and GPUs to minimise total JCT."),
    Entry("run", "cmd_ops:run_cmd",
          "Run rounds every interval: solve, apply through an executor, poll progress back."),
    Entry("serve", "cmd_ops:serve_cmd",
          "The rounds of `run`, and beside them an HTTP server: REST API (/api/v1, "
          "/openapi.json),\n/healthz and /readyz, Prometheus /metrics, and a dashboard at /."),
)
BENCH = (
    Entry("sim", "cmd_bench:bench_sim_cmd",
          "Replay speed: a two-week Philly window (10,000+ jobs) on Crius's 1,280-GPU "
          "cluster."),
    Entry("estimate", "cmd_bench:bench_estimate_cmd",
          "Estimator accuracy against measured iteration times (Morphling, Crius, or this "
          "machine)."),
    Entry("solve", "cmd_bench:bench_solve_cmd",
          "Solve time and gap of the cell round vs jobs, GPUs and GPU types, per backend."),
    Entry("round", "cmd_bench:bench_round_cmd",
          "The whole solve-round command on held-out rounds: wall, CPU, memory, gap, load."),
    Entry("decide", "cmd_bench:bench_decide_cmd",
          "Submit to decision through a running serve with a queue in the store: p50, p99, "
          "max."),
    Entry("rates", "cmd_bench:bench_rates_cmd",
          "Accuracy of the estimated mode's rates per estimator, on the cells a policy is "
          "offered."),
)
CLUSTER = (
    Entry("import", "cmd_ops:cluster_import_cmd",
          "Write a cluster YAML from a Slurm, Ray or Kubernetes cluster, real node names "
          "kept."),
)
EXPORT = (
    Entry("k8s", "cmd_ops:export_k8s_cmd",
          "One TrainJob / JobSet / PyTorchJob per allocation, pinned to the decision's nodes."),
    Entry("kueue", "cmd_ops:export_kueue_cmd",
          "ResourceFlavors, a Topology, ClusterQueues and LocalQueues (named after the "
          "tenants)."),
    Entry("slurm", "cmd_ops:export_slurm_cmd",
          "One sbatch script per allocation, #SBATCH lines and all: what the Slurm executor\n"
          "submits, to read and resubmit (sbatch DIR/JOB.sbatch)."),
)
#: the groups of commands below the top level, by name
GROUPS = {"bench": BENCH, "cluster": CLUSTER, "export": EXPORT}


def function(entry: Entry) -> Callable[..., Any]:
    """The command's function, its module imported (with the collector paused, and what the
    import made frozen after, as the command line's own imports are: apportion.batch_gc)."""
    module, _, name = entry.target.partition(":")
    with collector_paused(freeze_after=True):
        return getattr(importlib.import_module(f"apportion.cli.{module}"), name)


class LazyCommand(TyperCommand):
    """A command listed by its summary and built from its function when it runs: every use
    of a command goes through :meth:`make_context` (running it, its ``--help``, completing
    its options), which hands over to the command Typer builds from the function."""

    def __init__(self, entry: Entry) -> None:
        super().__init__(entry.name, help=entry.summary)
        self.entry = entry
        self._loaded: Any = None

    def load(self) -> Any:
        """The command itself (a Typer command; built once)."""
        if self._loaded is None:
            one = typer.Typer(add_completion=False)
            one.command(self.entry.name)(function(self.entry))
            self._loaded = typer.main.get_command(one)
        return self._loaded

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        return self.load().make_context(info_name, args, parent=parent, **extra)


class LazyGroup(TyperGroup):
    """A group whose commands are :data:`table`'s, listed first, then those Typer registers
    (the groups below it)."""

    table: ClassVar[Sequence[Entry]] = ()

    def __init__(self, *, commands: Mapping[str, Any] | None = None, **attrs: Any) -> None:
        lazy: dict[str, Any] = {e.name: LazyCommand(e) for e in self.table}
        super().__init__(commands={**lazy, **(commands or {})}, **attrs)


def lazy_group(table: Sequence[Entry]) -> type[LazyGroup]:
    """A :class:`LazyGroup` class for ``table`` (Typer's ``cls=`` of a group)."""
    return type("LazyGroup", (LazyGroup,), {"table": tuple(table)})


def command_names() -> list[str]:
    """Every command, as typed: ``solve-round``, ..., ``bench sim``, ``export k8s``."""
    return [e.name for e in ROOT] + [f"{g} {e.name}" for g, table in GROUPS.items()
                                     for e in table]


def entry(path: str) -> Entry:
    """The table's entry for a command as typed (``"serve"``, ``"bench sim"``)."""
    group, _, name = path.rpartition(" ")
    table = GROUPS[group] if group else ROOT
    return next(e for e in table if e.name == name)


__all__ = ["BENCH", "CLUSTER", "EXPORT", "GROUPS", "ROOT", "Entry", "LazyCommand",
           "LazyGroup", "command_names", "entry", "function", "lazy_group"]
