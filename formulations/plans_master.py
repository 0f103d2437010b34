r"""The plans formulation at cluster scale: a master over options, packed onto nodes after.

The exact model (:func:`apportion.formulations.cells.build_cells_model`) places every
cell on node *classes*; it aggregates identical nodes only where that is exact (the
placement units form a divisibility chain and the CPUs and memory never bind before the
GPUs). Morphling's plans break both on Crius's 1,280 GPUs: ZeRO plans on 3 or 6 GPUs are
placement units of 3 on 4-GPU nodes, offloaded plans ask 8-16 CPUs per GPU where a V100
node has 6. Every node is then its own class and every cell gets a placement column per
node of its type: a 300-job round was 4.04 M columns and 49,510 rows (issue 43 item 4),
a 1,000-job round 4.9 M columns, 57,238 rows and 113 s to build.

The **master** keeps one column per option and aggregates the nodes of each GPU type:

    x_c in {0, 1}                                  option c chosen
    sum_{c in C_j} x_c <= 1                        one option per job            one[j]
    sum_{c of type t} gpus_c x_c <= GPUs_t         GPUs of each type             gpu[t]
    sum_{c of type t} gpus_c cpus_c x_c <= CPUs_t  CPUs of its nodes              cpu[t]
    sum_{c of type t} gpus_c mem_c x_c <= mem_t    host memory of its nodes       mem[t]
    sum_{c of type t, whole, gpus_c > C_t/2} x_c <= nodes_t                      big[t]
    quota and change-budget rows as the exact model's

``big[t]``: an option placed whole on one node (``single_node``) that takes more than half
of the largest node of its type shares that node with no other such option. Each row is a
sum of the exact model's node rows (or, for ``big``, a count every placement keeps), so
the master is a relaxation of it: **its LP bound bounds the exact model's optimum**. An
answer is placed node by node by :func:`pack` (the running jobs kept where they run first,
then first fit decreasing, whole cells on the best-fitting node, larger ones in
tensor-parallel groups on the emptiest nodes, CPUs and memory checked per node); an
option that does not fit is replaced by the job's next best one that does, else left out
(the answer is then worth less than the master said, and says so). The decoded answer is
what the round keeps, checked against the master's rows and by the validator; its gap is
measured against the master's bound, so it is honest.

The master has a column per option and a few rows per GPU type: its LP is solved by
column generation (:mod:`apportion.solvers.colgen`): ``meta["column_family"]`` names
each column's (job, type, count), whose best option starts the restricted master.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
from apportion.formulations.cells import (
    CellChoice,
    add_quota_and_change_rows,
    build_cells_model,
    natural_key,
    node_classes,
)
from apportion.formulations.model import LinearModel
from apportion.formulations.schema import (
    cells_of,
    job_node,
    jobs_in,
    member_nodes,
    name_of,
    node_node,
    node_vertices,
)

# Past this many placement columns the exact model is not built: the master is
# (:func:`plans_model`). The exact model's build is about 20 µs a column in Python.
EXACT_PLACEMENT_LIMIT = 20000
# Past this many columns a model's LP is solved by column generation (solvers.colgen)
# first: the chain's LARGE_MODEL_COLUMNS, past which LP rounding would go first
COLGEN_COLUMNS = 20000


def exact_columns(g: nx.DiGraph) -> int:
    """How many placement columns the exact model would have beside its one column per cell
    (an estimate from its node classes, without building it): one per cell and class of its
    type where its type has several classes."""
    classes = node_classes(g)
    per_type: dict[str, int] = {}
    for members in classes:
        t = g.nodes[members[0]]["gpu_type"]
        per_type[t] = per_type.get(t, 0) + 1
    total = 0
    for _, d in g.nodes(data=True):
        if d.get("kind") == "cell":
            k = per_type.get(d["gpu_type"], 0)
            total += k if k > 1 and not d.get("current") else 0
    return total


def plans_model(g: nx.DiGraph, max_changes: int | None = None,
                limit: int = EXACT_PLACEMENT_LIMIT) -> LinearModel:
    """The plans round's model, chosen by size: the exact model where it stays small (its
    node classes aggregate, or the round is small), else the master (:func:`build_master`)."""
    if exact_columns(g) > limit:
        return build_master(g, max_changes=max_changes)
    m = build_cells_model(g, max_changes=max_changes)
    if m.num_vars > COLGEN_COLUMNS:  # a wide exact model: its LP by column generation too
        fam: dict[tuple[str, str, int], int] = {}
        family = np.arange(m.num_vars, dtype=np.int64) + m.num_vars  # its own, by default
        for cn, x in m.meta["cell_cols"].items():
            d = g.nodes[cn]
            family[x] = fam.setdefault((d["job"], d["gpu_type"], int(d["gpus"])), len(fam))
        m.meta.update(column_family=family, solve_first="colgen")
    return m


def _pools(g: nx.DiGraph) -> dict[str, list[str]]:
    """The node vertices of each GPU type (with GPUs), in natural order."""
    out: dict[str, list[str]] = {}
    for nn in node_vertices(g):
        d = g.nodes[nn]
        if int(d.get("capacity", 0)) > 0:
            out.setdefault(d["gpu_type"], []).append(nn)
    return {t: sorted(v, key=natural_key) for t, v in out.items()}


def build_master(g: nx.DiGraph, value_attr: str = "value",
                 max_changes: int | None = None) -> LinearModel:
    """The master (see the module docstring): one binary column per option, rows per GPU
    type, decoded by :func:`pack`."""
    m = LinearModel(g.graph.get("formulation", "plans"), sense="max")
    pools = _pools(g)
    largest = {t: max(int(g.nodes[n]["capacity"]) for n in nodes) for t, nodes in pools.items()}
    gpu_rows: dict[str, dict[int, float]] = {}
    cpu_rows: dict[str, dict[int, float]] = {}
    mem_rows: dict[str, dict[int, float]] = {}
    big_rows: dict[str, dict[int, float]] = {}
    cell_cols: dict[str, int] = {}
    family: list[int] = []
    families: dict[tuple[str, str, int], int] = {}
    for jid in jobs_in(g):
        cols = []
        for cn in cells_of(g, jid):
            d = g.nodes[cn]
            t, gpus = d["gpu_type"], int(d["gpus"])
            if t not in pools or not g.succ[cn]:
                continue
            x = m.binary(("x", cn), obj=float(d[value_attr]))
            cell_cols[cn] = x
            cols.append(x)
            family.append(families.setdefault((jid, t, gpus), len(families)))
            gpu_rows.setdefault(t, {})[x] = float(gpus)
            cpu_rows.setdefault(t, {})[x] = gpus * float(d.get("cpus_per_gpu", 0.0))
            mem_rows.setdefault(t, {})[x] = gpus * float(d.get("host_mem_gib_per_gpu", 0.0))
            whole = bool(d.get("single_node")) or d.get("current") and len(g.succ[cn]) == 1
            if whole and 2 * gpus > largest[t]:
                big_rows.setdefault(t, {})[x] = 1.0
        if cols:
            m.add_row({c: 1.0 for c in cols}, ub=1.0, name=f"one[{jid}]")
    for t in sorted(gpu_rows):
        nodes = [g.nodes[n] for n in pools[t]]
        m.add_row(gpu_rows[t], ub=float(sum(int(n["capacity"]) for n in nodes)), name=f"gpu[{t}]")
        cpus = sum(float(n.get("cpus", math.inf)) for n in nodes)
        if math.isfinite(cpus) and any(cpu_rows[t].values()):
            m.add_row(cpu_rows[t], ub=cpus, name=f"cpu[{t}]")
        mem = sum(float(n.get("host_memory_gib", math.inf)) for n in nodes)
        if math.isfinite(mem) and any(mem_rows[t].values()):
            m.add_row(mem_rows[t], ub=mem, name=f"mem[{t}]")
        if t in big_rows:
            m.add_row(big_rows[t], ub=float(len(nodes)), name=f"big[{t}]")
    add_quota_and_change_rows(m, g, cell_cols, max_changes)

    def decode(xv: np.ndarray) -> list[CellChoice]:
        return pack(g, [cn for cn, xc in cell_cols.items() if xv[xc] > 0.5], m, cell_cols)

    m.decode = decode
    m.meta.update(cell_cols=cell_cols, place_cols={cn: [] for cn in cell_cols}, classes=[],
                  node_classes=len(pools), residual_mode=False, master=True,
                  solve_first="colgen",
                  column_family=np.asarray(family, np.int64))
    return m


class _Nodes:
    """Free GPUs, CPUs and host memory per node while an answer is packed."""

    def __init__(self, g: nx.DiGraph) -> None:
        self.g = g
        self.gpu = {nn: int(g.nodes[nn].get("capacity", 0)) for nn in node_vertices(g)}
        self.cpu = {nn: float(g.nodes[nn].get("cpus", math.inf)) for nn in node_vertices(g)}
        self.mem = {nn: float(g.nodes[nn].get("host_memory_gib", math.inf))
                    for nn in node_vertices(g)}
        self.type_of = {nn: g.nodes[nn].get("gpu_type") for nn in node_vertices(g)}
        # shapes that found no room: resources only shrink while an answer is packed, so
        # they never will (a search of the nodes saved)
        self.failed: set[tuple[object, ...]] = set()
        self.left: dict[str, int] = {}  # free GPUs per type (a quick test before a search)
        for nn, k in self.gpu.items():
            self.left[self.type_of[nn]] = self.left.get(self.type_of[nn], 0) + k

    def room(self, nn: str, unit: int, cpg: float, mpg: float) -> int:
        """Whole units of ``unit`` GPUs node ``nn`` can still hold."""
        k = self.gpu[nn] // unit
        if cpg > 0:
            k = min(k, int((self.cpu[nn] + 1e-9) // (unit * cpg)))
        if mpg > 0:
            k = min(k, int((self.mem[nn] + 1e-9) // (unit * mpg)))
        return max(0, k)

    def share(self, nn: str, what: str) -> float:
        """What is left of node ``nn``'s CPUs or host memory, as a share of all it has."""
        d = self.g.nodes[nn]
        if what == "cpu":
            return self.cpu[nn] / max(1e-9, float(d.get("cpus", math.inf)))
        return self.mem[nn] / max(1e-9, float(d.get("host_memory_gib", math.inf)))

    def take(self, nn: str, gpus: int, cpg: float, mpg: float, sign: int = 1) -> None:
        self.gpu[nn] -= sign * gpus
        self.left[self.type_of[nn]] -= sign * gpus
        self.cpu[nn] -= sign * gpus * cpg
        self.mem[nn] -= sign * gpus * mpg


def _heavy(free: _Nodes, edges: list[tuple[str, int]], g: nx.DiGraph, gpus: int, cpg: float,
           mpg: float) -> str | None:
    """"cpu" or "mem" where the cell asks a larger share of a node's CPUs or memory than of
    its GPUs (the first node it may use stands for its nodes), else None."""
    for succ, _ in edges:
        for nn in member_nodes(g, succ):
            d = g.nodes[nn]
            gs = gpus / max(1, int(d.get("capacity", 1)))
            cs = gpus * cpg / max(1e-9, float(d.get("cpus", math.inf)))
            ms = gpus * mpg / max(1e-9, float(d.get("host_memory_gib", math.inf)))
            if max(cs, ms) > gs + 1e-9:
                return "cpu" if cs >= ms else "mem"
            return None
    return None


def _share(g: nx.DiGraph, cn: str) -> float:
    """A cell's largest share of a node of its type: GPUs, CPUs or host memory."""
    d = g.nodes[cn]
    gpus = int(d["gpus"])
    for succ in g.succ[cn]:
        for nn in member_nodes(g, succ):
            n = g.nodes[nn]
            return max(gpus / max(1, int(n.get("capacity", 1))),
                       gpus * float(d.get("cpus_per_gpu", 0.0)) / max(1e-9, float(n.get("cpus", math.inf))),
                       gpus * float(d.get("host_mem_gib_per_gpu", 0.0))
                       / max(1e-9, float(n.get("host_memory_gib", math.inf))))
    return 0.0


def _place(g: nx.DiGraph, cn: str, free: _Nodes) -> dict[str, int] | None:
    """A placement of cell ``cn`` on the free nodes (taken from ``free``), or None."""
    d = g.nodes[cn]
    gpus, tp = int(d["gpus"]), max(1, int(d.get("tp", 1)))
    cpg, mpg = float(d.get("cpus_per_gpu", 0.0)), float(d.get("host_mem_gib_per_gpu", 0.0))
    if free.left.get(d["gpu_type"], 0) < gpus:
        return None
    if d.get("current"):  # kept where it runs, or not at all
        place = {name_of(nn): int(ea["max_gpus"]) for nn, ea in g.succ[cn].items()}
        if sum(place.values()) != gpus:
            return None
        if any(free.room(nn, k, cpg, mpg) < 1 for nn, k in
               ((nn, int(ea["max_gpus"])) for nn, ea in g.succ[cn].items())):
            return None
        for nn, ea in g.succ[cn].items():
            free.take(nn, int(ea["max_gpus"]), cpg, mpg)
        return place
    edges = [(succ, int(ea["max_gpus"])) for succ, ea in g.succ[cn].items()]
    shape = (gpus, tp, bool(d.get("single_node")), cpg, mpg, tuple(edges))
    if shape in free.failed:
        return None
    got = _search(g, d, edges, free, gpus, tp, cpg, mpg)
    if got is None:
        free.failed.add(shape)
    return got


def _search(g: nx.DiGraph, d: dict, edges: list[tuple[str, int]], free: _Nodes, gpus: int,
            tp: int, cpg: float, mpg: float) -> dict[str, int] | None:
    """:func:`_place` for a cell that may go anywhere its edges lead."""
    if d.get("single_node"):  # whole, on one node (see :func:`_share` for which)
        heavy = _heavy(free, edges, g, gpus, cpg, mpg)
        best, score = None, None
        for succ, cap in edges:
            if cap < gpus:
                continue
            for nn in member_nodes(g, succ):
                if nn not in free.gpu or free.room(nn, gpus, cpg, mpg) < 1:
                    continue
                # a CPU- or memory-heavy cell goes where most of that is left (spread out,
                # so the GPUs beside it keep CPUs for others); any other where fewest GPUs
                # are left (best fit: whole nodes stay free for large cells)
                s_ = (-free.share(nn, heavy), nn) if heavy else (free.gpu[nn], -free.cpu[nn], nn)
                if score is None or s_ < score:
                    best, score = nn, s_
        if best is None:
            return None
        free.take(best, gpus, cpg, mpg)
        return {name_of(best): gpus}
    # in TP groups, on the emptiest nodes first (fewest nodes: the estimate's placement)
    place: dict[str, int] = {}
    left = gpus
    for succ, cap in edges:
        nodes = sorted((nn for nn in member_nodes(g, succ) if nn in free.gpu),
                       key=lambda nn: (-free.gpu[nn], natural_key(nn)))
        budget = min(cap, left)
        for nn in nodes:
            if budget < tp:
                break
            k = min(free.room(nn, tp, cpg, mpg), budget // tp) * tp
            if k > 0:
                free.take(nn, k, cpg, mpg)
                place[name_of(nn)] = place.get(name_of(nn), 0) + k
                budget -= k
                left -= k
        if left == 0:
            break
    if left:
        for name, k in place.items():  # give back what was taken
            free.take(node_node(name), k, cpg, mpg, sign=-1)
        return None
    return place


def pack(g: nx.DiGraph, chosen: list[str], model: LinearModel | None = None,
         cell_cols: dict[str, int] | None = None) -> list[CellChoice]:
    """The chosen cells placed on nodes (see the module docstring): running jobs kept first,
    then the others largest unit first; a cell that does not fit is replaced by its job's
    next most valuable cell that fits and keeps ``model``'s rows, else left out."""
    free = _Nodes(g)
    out: dict[str, CellChoice] = {}
    missed: list[str] = []

    def unit(cn: str) -> int:
        d = g.nodes[cn]
        return int(d["gpus"]) if d.get("single_node") else max(1, int(d.get("tp", 1)))

    # running jobs first; then cells in TP groups (largest first), then whole cells by their
    # largest share of a node (first fit decreasing over GPUs, CPUs and memory)
    order = sorted(chosen, key=lambda cn: (not g.nodes[cn].get("current"),
                                           bool(g.nodes[cn].get("single_node")), -unit(cn),
                                           -_share(g, cn), -float(g.nodes[cn]["value"]), cn))
    for cn in order:
        place = _place(g, cn, free)
        if place is None:
            missed.append(cn)
        else:
            out[cn] = CellChoice(g.nodes[cn]["job"], cn, place)
    if missed and model is not None and cell_cols is not None:
        # the jobs left out (their option did not fit, or the model chose none) take their
        # most valuable option that still fits the nodes and the model's rows; the jobs
        # whose option failed first, the most valuable first
        rows = _RowCheck(model, [cell_cols[cn] for cn in out])
        placed = {c.job for c in out.values()}
        failed = [g.nodes[cn]["job"] for cn in
                  sorted(missed, key=lambda cn: -float(g.nodes[cn]["value"]))]
        rest = sorted((j for j in jobs_in(g) if j not in placed and j not in set(failed)),
                      key=lambda j: -max((float(g.nodes[c]["value"]) for c in
                                          g.successors(job_node(j)) if c in cell_cols),
                                         default=0.0))
        for job in failed + rest:
            others = sorted((c for c in g.successors(job_node(job))
                             if c not in missed and c in cell_cols),
                            key=lambda c: -float(g.nodes[c]["value"]))
            for alt in others:
                d = g.nodes[alt]
                if float(d["value"]) <= 0 or free.left.get(d["gpu_type"], 0) < int(d["gpus"]) \
                        or not rows.fits(cell_cols[alt]):
                    continue
                place = _place(g, alt, free)
                if place is not None:
                    rows.add(cell_cols[alt])
                    out[alt] = CellChoice(job, alt, place)
                    break
    return [out[cn] for cn in sorted(out, key=lambda c: (g.nodes[c]["job"], c))]


class _RowCheck:
    """A model's row activities for a set of chosen binary columns, one column at a time."""

    def __init__(self, model: LinearModel, cols: list[int]) -> None:
        csc = model.matrix().tocsc()
        x = np.zeros(model.num_vars)
        x[cols] = 1.0
        self.act = model.activity(x).tolist()
        self.hi = model.row_bounds()[1].tolist()
        # plain lists: a column touches a handful of rows, numpy's overhead would dominate
        self.ptr, self.idx, self.val = (csc.indptr.tolist(), csc.indices.tolist(),
                                        csc.data.tolist())

    def fits(self, j: int) -> bool:
        """Whether column ``j`` keeps every upper bound (the coefficients are positive: a
        lower bound, the change budget's, only gains)."""
        act, hi, idx, val = self.act, self.hi, self.idx, self.val
        return all(act[idx[k]] + val[k] <= hi[idx[k]] + 1e-6
                   for k in range(self.ptr[j], self.ptr[j + 1]))

    def add(self, j: int) -> None:
        for k in range(self.ptr[j], self.ptr[j + 1]):
            self.act[self.idx[k]] += self.val[k]

__all__ = ["EXACT_PLACEMENT_LIMIT", "build_master", "exact_columns", "pack", "plans_model"]
