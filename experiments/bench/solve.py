"""`apportion bench solve`: solve time and gap of the cell round at scale.

Instances: a cluster of G GPUs over T types (Crius table 1's four types and
node shapes, plus H100 and L4 for five and six types; the 1,280-GPU Crius
cluster itself at G=1280, T=4) and J queued jobs drawn from Crius table 2
(models, batch sizes) with requested GPUs 1-16 (Philly-like mix, seeded).
Each backend and the chain solve the same model: the round runs first (``run_round``,
the cell formulation's policy, backend ``auto``: the ``chain`` row), and each backend
row then solves the model the policy's recipe builds from that round's candidate graph
(the graph the chain solved: admitted jobs, the round's objective, full rounds trimmed
to the requests), hinted with the greedy's answer on it; the ``variables`` column is
the same in every row of an instance. What differs, and only this: the chain's budget
covers its whole round (candidates, the greedy, the chain, decoding and validation), a
backend's covers its solve alone, so the chain's ``wall_s`` is the round's and a
backend's its solver's. Each row records wall time, objective, best bound, gap and the
greedy's objective.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from apportion.cluster import Cluster, NodeGroup
from apportion.config import resolve_cluster
from apportion.formulations.cells import hint_from_choices
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round
from apportion.policies.recipes import RECIPES
from apportion.formulations.decode import to_decision
from apportion.decision import SolveReport
from apportion.solvers.chain import backends_for
from apportion.solvers.greedy import GreedyCells
from apportion.validator import validate

log = logging.getLogger(__name__)

# (gpu type, GPUs per node, link, intra GB/s, inter GB/s): Crius table 1 order, then extras
TYPE_SHAPES = [("A100-40GB", 4, "nvlink", 300, 12.5), ("A40", 2, "pcie", 32, 12.5),
               ("A10", 2, "pcie", 32, 25), ("V100-32GB", 16, "nvlink", 150, 12.5),
               ("H100-80GB", 8, "nvlink", 900, 50), ("L4", 4, "pcie", 32, 12.5)]
CRIUS_MODELS = {"wresnet": (["wresnet-0.5b", "wresnet-1b", "wresnet-2b", "wresnet-4b",
                             "wresnet-6.8b"], [256, 512, 1024]),
                "bert": (["bert-0.76b", "bert-1.3b", "bert-2.6b", "bert-6.7b"], [128, 256, 512]),
                "moe": (["moe-0.69b", "moe-1.3b", "moe-2.4b", "moe-10b", "moe-27b"],
                        [256, 512, 1024])}
GPU_MIX = [(1, 0.35), (2, 0.2), (4, 0.2), (8, 0.15), (16, 0.1)]


def synthetic_cluster(gpus: int, types: int) -> Cluster:
    if (gpus, types) == (1280, 4):
        return resolve_cluster("crius-sim")
    per_type = gpus // types
    groups = []
    for name, per_node, link, intra, inter in TYPE_SHAPES[:types]:
        groups.append(NodeGroup(name.split("-")[0].lower(), max(1, per_type // per_node), name,
                                per_node, intra_node_link=link, intra_node_bandwidth_GBps=intra,
                                inter_node_bandwidth_GBps=inter))
    return Cluster(f"bench-{gpus}g-{types}t", groups)


def synthetic_jobs(n: int, types: list[str], seed: int = 0) -> list[JobSpec]:
    rng = random.Random(seed)
    jobs = []
    sizes, weights = zip(*GPU_MIX)
    for i in range(n):
        fam = rng.choice(sorted(CRIUS_MODELS))
        models, batches = CRIUS_MODELS[fam]
        jobs.append(JobSpec(
            id=f"j{i}", model=rng.choice(models), global_batch_size=rng.choice(batches),
            iterations=rng.randint(1000, 50000), requested_gpus=rng.choices(sizes, weights)[0],
            requested_gpu_type=rng.choice(types), submit_time_s=float(rng.randint(0, 36000))))
    return jobs


@dataclass
class BenchRow:
    jobs: int
    gpus: int
    types: int
    backend: str
    wall_s: float
    objective: float | None
    bound: float | None
    gap: float | None
    greedy_objective: float
    status: str
    valid: bool
    candidates_s: float
    variables: int

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def bench_one(jobs_n: int, gpus: int, types: int, backends: list[str], budget_s: float,
              seed: int = 0) -> list[BenchRow]:
    """One instance: the round (the ``chain`` row, where asked) and each backend on the
    model that round solved (see the module's docstring)."""
    cluster = synthetic_cluster(gpus, types)
    jobs = synthetic_jobs(jobs_n, cluster.gpu_types, seed)
    now = 36000.0
    cfg = RoundConfig(backend="auto", time_budget_s=budget_s)
    t1 = time.perf_counter()
    r = run_round(cluster, jobs, now, cfg)
    chain_wall = time.perf_counter() - t1
    g = r.graph  # the candidate graph the chain's round solved
    specs = g.graph["specs"]
    rep = r.decision.report
    cand_s = float(rep.model_size.get("candidates_s") or 0.0)
    greedy, gobj, _ = GreedyCells().solve(g)
    recipe = RECIPES[cfg.formulation]
    rows = []
    for name in backends:
        if name == "chain":
            rows.append(BenchRow(jobs_n, cluster.total_gpus, types, "chain", chain_wall,
                                 rep.objective, rep.bound, rep.gap, gobj, rep.status,
                                 validate(r.decision, cluster, jobs).ok, cand_s,
                                 int(rep.model_size.get("variables", 0))))
            continue
        m = recipe.model(g, cfg)  # the model the chain solved, built afresh
        m.set_hint(hint_from_choices(m, greedy))
        be = backends_for(name)[0]
        res = be.solve(m, budget_s)
        valid = False
        if res.x is not None and m.decode is not None:
            dec = to_decision(g, m.decode(res.x), cluster, specs,
                              SolveReport(name, res.status.value, None, None, None, 0, False))
            valid = validate(dec, cluster, specs).ok
        rows.append(BenchRow(jobs_n, cluster.total_gpus, types, name, res.wall_s, res.objective,
                             res.bound, res.gap, gobj, res.status.value, valid, cand_s, m.num_vars))
    return rows


DEFAULT_GRID = [(10, 64, 2), (100, 256, 3), (300, 512, 4), (1000, 1280, 4), (2000, 2560, 5),
                (5000, 5120, 6)]
QUICK_GRID = [(10, 64, 1), (100, 256, 2), (1000, 1280, 4)]


def run_bench(grid: list[tuple[int, int, int]], backends: list[str], budget_s: float,
              seed: int = 0) -> list[dict[str, Any]]:
    out = []
    for jobs_n, gpus, types in grid:
        for row in bench_one(jobs_n, gpus, types, backends, budget_s, seed):
            log.info("%s", row)
            out.append(row.as_dict())
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    from apportion.tables import markdown_table

    fmt = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    pct = lambda v: "-" if v is None else f"{v:.3%}"
    return markdown_table(
        ["jobs", "GPUs", "types", "backend", "status", "wall s", "objective", "bound", "gap",
         "greedy", "valid"],
        [[str(r["jobs"]), str(r["gpus"]), str(r["types"]), str(r["backend"]), str(r["status"]),
          f"{r['wall_s']:.2f}", fmt(r["objective"]), fmt(r["bound"]), pct(r["gap"]),
          f"{r['greedy_objective']:.4g}", str(r["valid"])] for r in rows])