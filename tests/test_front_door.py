"""The front door (issue 63 item 7): ``apportion --version`` and ``--help`` import no
command and no heavy library, a one-off command imports its own module and no other
command's, and every summary ``apportion --help`` lists is its command's own. Counted in
modules (``sys.modules`` when the command exits), never timed: ``python -m apportion.experiments.bench.startup``
times it beside ``python -c pass``."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
from apportion.experiments.bench.startup import modules
from typer.main import get_command

from apportion.cli import app
from apportion.cli.commands import GROUPS, ROOT, LazyCommand, command_names, entry, function

#: what a command's work needs and the front door must not pay for (pydantic is typer's
#: own: it coerces the options of a command that runs, and of none that ``--help`` shows)
HEAVY = {"numpy", "scipy", "networkx", "pandas", "ortools", "highspy", "cvxpy", "yaml",
         "matplotlib", "torch", "jax", "ray", "fastapi", "uvicorn", "kubernetes",
         "threadpoolctl"}
#: apportion's modules the front door reads: the app, its table, the error handler's parts
FRONT = {"apportion", "apportion.batch_gc", "apportion.cli", "apportion.cli.app",
         "apportion.cli.commands", "apportion.cli.exits", "apportion.console", "apportion.env",
         "apportion.errors", "apportion.protected"}


@pytest.mark.parametrize("args", [["--version"], ["--help"], [], ["bench", "--help"],
                                  ["export"]], ids=" ".join)
def test_the_front_door_imports_no_command_and_no_heavy_library(args: list[str],
                                                                tmp_path: Path) -> None:
    mods = modules(sys.executable, args, str(tmp_path))
    assert "apportion.cli.app" in mods, mods  # it ran
    assert not {m.split(".")[0] for m in mods} & HEAVY, sorted(
        m for m in mods if m.split(".")[0] in HEAVY)
    assert {m for m in mods if m.startswith("apportion")} <= FRONT
    if args[:1] in (["--version"], ["--help"]):
        assert "pydantic" not in mods


def test_a_one_off_solve_round_imports_its_own_command_only(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    mods = modules(sys.executable, ["solve-round", "--time-budget", "1", "--deterministic",
                                    "--json", str(out)], str(tmp_path))
    assert out.is_file()  # it decided
    commands = {m for m in mods if m.startswith("apportion.cli.cmd_")}
    assert commands == {"apportion.cli.cmd_round"}, commands
    assert not [m for m in mods if m.startswith(("apportion.experiments", "apportion.serve",
                                                 "apportion.runtime.executors"))]
    assert not {m.split(".")[0] for m in mods} & {"matplotlib", "pandas", "torch", "ray"}


def test_every_listed_summary_is_its_commands_own() -> None:
    """The table's summary is the first paragraph of the command's help, so ``--help``
    lists what the command says of itself; and the table is every command there is."""
    for name in command_names():
        e = entry(name)
        assert inspect.getdoc(function(e)).split("\n\n")[0] == e.summary, name
    group = get_command(app)
    listed = group.commands  # type: ignore[attr-defined]
    assert list(listed) == [e.name for e in ROOT] + list(GROUPS)
    for name, table in GROUPS.items():
        assert list(listed[name].commands) == [e.name for e in table]
    assert all(isinstance(listed[e.name], LazyCommand) for e in ROOT)
