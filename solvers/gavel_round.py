"""One round of Gavel: the allocation LP on the candidate graph, rounded to whole GPUs.

Throughputs ``T[m, j]`` come from the candidate graph (job m's best cell of type
j at its requested GPU count, samples/s); scale factors are the requested
counts. The LP (``apportion.formulations.gavel``) gives time fractions; a
single round has no history, so every job's priority is its allocation itself
(Gavel's allocation / rounds-received with no rounds received yet, ties by
allocation): jobs are visited by their largest fraction, each on the types it
was allotted, largest share first, and placed whole when its GPUs are free.
The simulator's Gavel baseline runs the full multi-round mechanism.
"""

from __future__ import annotations

import time
from typing import Any

import networkx as nx
import numpy as np

from apportion.formulations.candidates import cells_of, job_node, jobs_in
from apportion.formulations.cells import CellChoice
from apportion.formulations.gavel import (check_allocation, isolated_max_min, max_min_fairness,
                                          max_sum_throughput)
from apportion.solvers.cvx import solve_cvxpy
from apportion.solvers.greedy import place

VARIANTS = ("max-sum-throughput", "max-min-fairness")


def gavel_round(g: nx.DiGraph, variant: str = "max-min-fairness"
                ) -> tuple[list[CellChoice], dict[str, Any]]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown Gavel variant {variant!r}; choose {', '.join(VARIANTS)}")
    t0 = time.perf_counter()
    jobs = [j for j in jobs_in(g) if cells_of(g, j)]
    types = sorted({d["gpu_type"] for _, d in g.nodes(data=True) if d.get("kind") == "group"})
    cap = np.array([sum(d["capacity"] for _, d in g.nodes(data=True)
                        if d.get("kind") == "group" and d["gpu_type"] == t) for t in types], float)
    best: dict[tuple[str, str], str] = {}
    T = np.zeros((len(jobs), len(types)))
    sf = np.ones(len(jobs))
    for i, j in enumerate(jobs):
        req = int(g.nodes[job_node(j)]["requested_gpus"])
        sf[i] = req
        for cn in cells_of(g, j):
            d = g.nodes[cn]
            if int(d["gpus"]) != req:
                continue
            k = types.index(d["gpu_type"])
            if d["est_throughput"] > T[i, k]:
                T[i, k] = d["est_throughput"]
                best[(j, d["gpu_type"])] = cn
    info: dict[str, Any] = {"variant": variant, "jobs": len(jobs), "types": types}
    if not jobs:
        return [], {**info, "solver": "none", "objective": 0.0, "wall_s": 0.0}
    if variant == "max-sum-throughput":
        X, solver = solve_cvxpy(*max_sum_throughput(T, sf, cap))
        objective = float(np.sum(T * X))
    else:
        w = np.ones(len(jobs))
        x_iso, _ = solve_cvxpy(*isolated_max_min(sf, cap, w, T.shape))
        X, solver = solve_cvxpy(*max_min_fairness(T, sf, cap, w, x_iso))
        iso = np.maximum(np.sum(T * x_iso, axis=1), 1e-12)
        objective = float(np.min(sf * np.sum(T * X, axis=1) / iso))
    info.update(solver=solver, objective=objective, lp_feasible=check_allocation(X, sf, cap))
    free = {n: int(d["capacity"]) for n, d in g.nodes(data=True) if d.get("kind") == "node"}
    gfree = {v: int(d["capacity"]) for v, d in g.nodes(data=True) if d.get("kind") == "group"}
    group_of = {n: d["group"] for n, d in g.nodes(data=True) if d.get("kind") == "node"}
    choices = []
    order = sorted(range(len(jobs)), key=lambda i: (-X[i].max(), jobs[i]))
    for i in order:
        for k in np.argsort(-X[i]):
            cn = best.get((jobs[i], types[k]))
            if X[i, k] <= 1e-6 or cn is None:
                continue
            p = place(g, cn, free, gfree)
            if p is None:
                continue
            for nn, c in p.items():
                free[nn] -= c
                gfree[group_of[nn]] -= c
            choices.append(CellChoice(jobs[i], cn, {nn.split(":", 1)[1]: c for nn, c in p.items()}))
            break
    info["wall_s"] = time.perf_counter() - t0
    info["allocation"] = {jobs[i]: {types[k]: round(float(X[i, k]), 6) for k in range(len(types))
                                    if X[i, k] > 1e-6} for i in range(len(jobs))}
    return choices, info
