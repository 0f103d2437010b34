"""The house's dependency direction, proven on the installed package: every import of every
module of ``apportion`` (those inside functions too) is walked; no module reaches a layer
above its own, and no two modules import each other through any path.

    core <- estimation <- formulations <- solvers <- policies <- experiments, runtime
         <- testing (the conformance checks plug-in authors run), serve <- cli

``apportion.round`` (the pipeline) is core: it imports no policy. The core is the files
directly in ``apportion/``, and it imports no area; every floor above it is a folder (a
room) of its own, never a file in the core's folder.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import networkx as nx
import pytest

import apportion

LAYERS = {"core": 0, "estimation": 1, "formulations": 2, "solvers": 3, "policies": 4,
          "experiments": 5, "runtime": 5, "testing": 6, "serve": 6, "cli": 7}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "core"


def modules() -> dict[str, Path]:
    """Every module of the installed package; the areas are mapped from their own folders
    (setuptools' package-dir), so each is walked from its own ``__path__``."""
    found = {"apportion": Path(apportion.__file__)}
    roots = [apportion]
    for area in LAYERS:
        try:
            roots.append(importlib.import_module(f"apportion.{area}"))
        except ImportError:  # an area not built yet (serve)
            continue
    for pkg in roots:
        found[pkg.__name__] = Path(pkg.__file__)
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), pkg.__name__ + "."):
            spec = info.module_finder.find_spec(info.name, None)  # type: ignore[call-arg]
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                found[info.name] = Path(spec.origin)
    return found


def imports(mods: dict[str, Path]) -> nx.DiGraph:
    """Module -> module it imports (the package itself where a name is not a module)."""
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("apportion"):
                    g.add_edge(name, t, line=node.lineno)
                    break
    return g


@pytest.fixture(scope="module")
def mods() -> dict[str, Path]:
    return modules()


@pytest.fixture(scope="module")
def graph(mods: dict[str, Path]) -> nx.DiGraph:
    return imports(mods)


def test_the_walk_sees_every_area(graph: nx.DiGraph) -> None:
    seen = {layer(m) for m in graph}
    assert {"core", "estimation", "formulations", "solvers", "policies", "experiments",
            "runtime", "cli"} <= seen, seen
    assert "apportion.round" in graph and "apportion.policies.registry" in graph


def test_no_import_circles(graph: nx.DiGraph) -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == [], circles


def test_no_arrow_runs_back_up(graph: nx.DiGraph) -> None:
    up = [f"{a} -> {b} (line {d['line']})" for a, b, d in graph.edges(data=True)
          if LAYERS[layer(b)] > LAYERS[layer(a)]]
    assert up == [], "\n".join(up)


def test_the_pipeline_imports_only_the_core(graph: nx.DiGraph) -> None:
    assert {layer(b) for b in graph.successors("apportion.round")} <= {"core"}


def test_the_core_imports_no_area(graph: nx.DiGraph) -> None:
    """The domain types, the store, admission, the validator and the pipeline: nothing of
    theirs reaches estimation, formulations, solvers, policies or anything above."""
    out = [f"{a} -> {b} (line {d['line']})" for a, b, d in graph.edges(data=True)
           if layer(a) == "core" and layer(b) != "core"]
    assert out == [], "\n".join(out)


def test_the_core_folder_holds_only_the_core(mods: dict[str, Path]) -> None:
    """A module in ``apportion/`` itself is core; what sits above the core (the conformance
    checks, the service, the command line) has a room of its own."""
    core_dir = Path(apportion.__file__).parent
    misplaced = sorted(m for m, p in mods.items() if p.parent == core_dir and layer(m) != "core")
    assert misplaced == [], misplaced
    for area in LAYERS:
        if area != "core" and f"apportion.{area}" in mods:
            assert mods[f"apportion.{area}"].name == "__init__.py", f"apportion.{area}"
