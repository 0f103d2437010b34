"""The candidate graph's schema lives apart from its builders (DESIGN.md, "Habits").

Heuristics and decoders read the graph through :mod:`apportion.formulations.schema`,
never through a builder: structurally (no formulation or solver imports a schema
name from :mod:`apportion.formulations.candidates`; the schema imports no other
formulation module, so reading a graph never loads a builder) and behaviourally
(the accessors agree with a graph the builder made).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
from apportion.formulations import schema
from apportion.formulations.candidates import build_candidates

from apportion.cluster import Cluster
from apportion.config import default_cluster, default_jobs
from apportion.jobs import JobSpec, RunningState

REPO = Path(__file__).resolve().parents[1]
BUILDER = "apportion.formulations.candidates"
# the schema's names, and those the builder still re-exports for compatibility
SCHEMA_NAMES = set(schema.__all__)


def _readers() -> list[Path]:
    """Every module under solvers/ and formulations/ but the builder and the schema."""
    skip = {REPO / "formulations" / "candidates.py", REPO / "formulations" / "schema.py"}
    return sorted(p for d in ("solvers", "formulations") for p in (REPO / d).rglob("*.py")
                  if p not in skip)


def _builder_reads(path: Path) -> list[str]:
    """``line: name`` for each schema name ``path`` takes from the builder module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_formulations = path.parent == REPO / "formulations"
    aliases: set[str] = set()  # names bound to the builder module itself
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 and in_formulations:  # from .candidates import ... / from . import
                module = f"apportion.formulations.{module}".rstrip(".")
            for a in node.names:
                if module == BUILDER and a.name in SCHEMA_NAMES:
                    found.append(f"{node.lineno}: {a.name}")
                elif f"{module}.{a.name}" == BUILDER:
                    aliases.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == BUILDER and a.asname:
                    aliases.add(a.asname)
    for node in ast.walk(tree):  # candidates.cells_of(...) through a module alias
        if (isinstance(node, ast.Attribute) and node.attr in SCHEMA_NAMES
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_readers_take_the_schema_from_the_schema_module() -> None:
    readers = _readers()
    assert len(readers) > 10  # the walk found the areas' modules
    offenders = {str(p.relative_to(REPO)): hits for p in readers if (hits := _builder_reads(p))}
    assert not offenders, ("import these from apportion.formulations.schema, not from the "
                           f"builder: {offenders}")


def test_the_check_sees_a_builder_import(tmp_path: Path) -> None:
    """The structural check is not vacuous: it flags both ways of reaching the builder."""
    probe = tmp_path / "probe.py"
    probe.write_text("from apportion.formulations.candidates import cells_of, build_candidates\n"
                     "from apportion.formulations import candidates as c\n"
                     "x = c.jobs_in\n")
    hits = _builder_reads(probe)
    assert [h.split(": ", 1)[1] for h in hits] == ["cells_of", "c.jobs_in"]


def test_schema_imports_only_networkx_and_the_standard_library() -> None:
    path = REPO / "formulations" / "schema.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "schema.py uses no relative imports"
            modules.add(node.module or "")
        elif isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
    assert not [m for m in modules if m.startswith("apportion")], modules
    tops = {m.split(".")[0] for m in modules}
    assert tops <= {"networkx", "__future__"} | set(sys.stdlib_module_names), tops


def test_reading_the_schema_loads_no_builder() -> None:
    code = ("import sys, apportion.formulations.schema\n"
            "print(sorted(m for m in sys.modules if m.startswith('apportion.formulations.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "['apportion.formulations.schema']"


def test_the_builder_still_re_exports_the_old_names() -> None:
    from apportion.formulations import candidates

    for name in ("job_node", "node_node", "group_node", "member_nodes", "cells_of", "jobs_in"):
        assert getattr(candidates, name) is getattr(schema, name)
        assert name in candidates.__all__


Built = tuple[Cluster, list[JobSpec], float, nx.DiGraph]


@pytest.fixture(scope="module")
def default_graph() -> Built:
    """The embedded default cluster and queue, and their candidate graph (read only)."""
    cluster = default_cluster()
    jobs, now = default_jobs()
    return cluster, jobs, now, build_candidates(cluster, jobs, now)


def test_accessors_agree_with_the_built_graph(default_graph: Built) -> None:
    cluster, jobs, _, g = default_graph
    assert schema.jobs_in(g) == [j.id for j in jobs]
    kinds = {v: schema.kind_of(g, v) for v in g.nodes}
    assert set(kinds.values()) == {"job", "cell", "group", "node"}
    for j in jobs:
        jn = schema.job_node(j.id)
        assert schema.kind_of(g, jn) == "job" and schema.name_of(jn) == j.id
        for cn in schema.cells_of(g, j.id):
            assert schema.kind_of(g, cn) == "cell" and g.nodes[cn]["job"] == j.id
    assert sum(len(schema.cells_of(g, j.id)) for j in jobs) == len(schema.cell_vertices(g)) > 0
    assert set(schema.cell_vertices(g)) == {v for v, k in kinds.items() if k == "cell"}

    assert sorted(schema.name_of(n) for n in schema.node_vertices(g)) == sorted(cluster.nodes)
    for n in schema.node_vertices(g):
        assert schema.node_node(schema.name_of(n)) == n and schema.kind_of(g, n) == "node"
    groups = schema.group_vertices(g)
    assert sorted(groups) == sorted(schema.group_node(grp.prefix) for grp in cluster.groups)
    for gv in groups:
        members = schema.member_nodes(g, gv)
        assert members and all(g.nodes[n]["group"] == gv for n in members)
        assert {g.nodes[n]["gpu_type"] for n in members} == {g.nodes[gv]["gpu_type"]}

    for cn in schema.cell_vertices(g):
        d = g.nodes[cn]
        assert not schema.is_current(g, cn) and schema.pinned_nodes(g, cn) == []
        for s in g.successors(cn):
            assert schema.kind_of(g, s) == "group"
            nodes = schema.member_nodes(g, s)
            assert all(schema.kind_of(g, n) == "node" for n in nodes)
            assert {g.nodes[n]["gpu_type"] for n in nodes} == {d["gpu_type"]}
            cap = int(g.edges[cn, s]["max_gpus"])
            assert 0 < cap <= int(d["gpus"]) and cap % int(d["tp"]) == 0
    assert schema.current_cells(g) == []


def test_a_running_jobs_present_cell_is_pinned_to_its_nodes(default_graph: Built) -> None:
    cluster, jobs, now, g = default_graph
    job = jobs[0]
    cn = next(c for c in schema.cells_of(g, job.id) if g.nodes[c]["gpu_type"] == "A40"
              and int(g.nodes[c]["gpus"]) <= 2)
    d = g.nodes[cn]
    running = RunningState(d["gpu_type"], int(d["gpus"]), int(d["stages"]),
                           {"a40-3": int(d["gpus"])}, tp=int(d["tp"]))
    g2 = build_candidates(cluster, [replace(job, running=running), *jobs[1:]], now)
    (cur,) = schema.current_cells(g2)
    assert g2.nodes[cur]["job"] == job.id and schema.is_current(g2, cur)
    assert cur in schema.cells_of(g2, job.id)
    assert schema.pinned_nodes(g2, cur) == [schema.node_node("a40-3")]
    assert list(g2.successors(cur)) == schema.pinned_nodes(g2, cur)  # no group edges: it stays
    assert schema.member_nodes(g2, schema.node_node("a40-3")) == [schema.node_node("a40-3")]
    assert int(g2.edges[cur, schema.node_node("a40-3")]["max_gpus"]) == int(d["gpus"])
    others = [c for c in schema.cell_vertices(g2) if c != cur]
    assert not any(schema.is_current(g2, c) or schema.pinned_nodes(g2, c) for c in others)
