"""Help that answers: every option and argument of every command has a help text, `apportion
--help` names every environment variable apportion reads and docs/environment.md describes
each, and docs/cli.md names, for every command, the extra it needs and how long it runs
when that is minutes. Each is discovered (the typer application, the source), never a
hand-picked list."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from apportion.cli import app
from apportion.env import SET_FOR_WORKLOADS, VARIABLES

ROOT = Path(__file__).resolve().parent.parent
AREAS = ("apportion", "formulations", "solvers", "estimation", "runtime", "experiments")


def _commands() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append((" ".join(path), cmd))
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"apportion {path} {p.opts[0] if p.opts else p.name}"
               for path, cmd in _commands() for p in cmd.params
               if p.name != "help" and not (getattr(p, "help", None) or "").strip()]
    assert not missing, missing


def _read_in_source() -> set[str]:
    """Every APPORTION_* name the package's code spells out, and every envvar= of an
    option."""
    names: set[str] = set()
    for area in AREAS:
        for f in (ROOT / area).rglob("*.py"):
            text = f.read_text()
            names |= {n for n in re.findall(r"APPORTION_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])", text)}
            names |= set(re.findall(r'envvar="([A-Z][A-Z0-9_]*[A-Z0-9])"', text))
    return names


def test_every_environment_variable_is_named_and_described() -> None:
    found = _read_in_source()
    assert {"APPORTION_STATE", "APPORTION_LOG_FORMAT", "RAY_ADDRESS"} <= found
    unknown = found - set(VARIABLES) - set(SET_FOR_WORKLOADS)
    assert not unknown, f"read by the code, missing from apportion.env.VARIABLES: {unknown}"
    help_text = " ".join(CliRunner().invoke(app, ["--help"], terminal_width=400)
                         .stdout.replace("│", " ").split())
    page = (ROOT / "docs" / "environment.md").read_text()
    for var in VARIABLES:
        assert var in help_text, var
        assert f"`{var}`" in page, var
    for var in SET_FOR_WORKLOADS:
        assert f"`{var}`" in page, var


def _cli_table() -> dict[str, tuple[str, str]]:
    """docs/cli.md's table of commands: command -> (extra, duration)."""
    page = (ROOT / "docs" / "cli.md").read_text()
    section = page[page.index("## What each command needs"):]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`apportion ([^`]+)`\s*\|([^|]*)\|([^|]*)\|", line)
        if m:
            rows[m.group(1).strip()] = (m.group(2).strip(), m.group(3).strip())
    return rows


def test_docs_name_each_commands_extra_and_duration() -> None:
    rows = _cli_table()
    leaves = [path for path, cmd in _commands()
              if path and not getattr(cmd, "commands", None)]
    assert not [c for c in leaves if c not in rows], [c for c in leaves if c not in rows]
    for cmd, (extra, duration) in rows.items():
        assert extra and duration, cmd
        for name in re.findall(r"\[(\w+)\]", extra):
            assert name in ("torch", "jax", "ray", "deepspeed", "k8s", "serve", "dev", "all"), \
                (cmd, name)
    # the ones the issue named
    assert "[k8s]" in rows["cluster import"][0]
    assert "minutes" in rows["bench estimate"][1]
    assert "[serve]" in rows["serve"][0]
