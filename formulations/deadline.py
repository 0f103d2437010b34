r"""Deadlines (Crius-DDL, ElasticFlow): admit a job only if some allocation meets it.

Applied on top of a candidate graph (cells or plans). For a job with deadline
``D`` (absolute seconds) at time ``now``, a cell *meets* the deadline when

    now + restart_s [if the job changes cell] + remaining_iterations * iter_time_c <= D

(iteration time from the cell's estimate; the restart term is zero for a
running job's present cell). The fewest GPUs of a job's meeting cells is its *minimum
satisfactory share* (ElasticFlow's): with elastic counts (:mod:`.counts`) a job that
meets its deadline only on 4x its request is offered that. Then, as ElasticFlow keeps
them:

* a job already **admitted** (admitted, or started once) keeps its guarantee: only
  meeting cells remain and placing it earns ``admitted_weight`` units (a soft
  lexicographic priority over everything else, so the model stays feasible even when
  the cluster shrank);
* a **new** job with meeting cells is admitted by being placed on one, and only meeting
  cells remain; admission earns ``new_weight`` units scaled by urgency (earliest deadline
  first);
* a **unit** is the largest value any cell of the round has before these priorities (at
  least 1): admitting a job outweighs any one job's speed, so spare GPUs go to the jobs
  that gain most (the objective's JCT seconds saved) only once every job that can be
  admitted has its minimum share;
* a job, new or admitted, with no meeting cell is refused (``deadline-unmeetable``) and,
  with ``drop`` (``apportion-deadline``), **dropped**, as ElasticFlow's admission
  control drops it (the decoder gives its pending entry ``Action.DROP``: the simulator
  and the store retire it; kept, it would wait for a deadline no allocation meets, and a
  replay would never end). Without ``drop`` (apportion's default policy, which honours
  deadlines whenever jobs carry them) it keeps its cells and runs best effort, after
  every job that can still meet its deadline: a user's job is never discarded by the
  default, and a late job still finishes (the vertex says ``deadline_missed``);
* jobs without deadlines are unchanged (best effort).

``deadline_projection`` reports, for a decision, the fraction of deadline
jobs placed on a meeting cell: the round's projected deadline satisfactory
ratio (the simulator measures the real one: ``deadline_ratio``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx
from apportion.formulations.schema import job_node

from apportion.decision import Reason
from apportion.jobs import JobSpec


@dataclass(frozen=True)
class DeadlineOptions:
    admitted_weight: float = 50.0
    new_weight: float = 5.0
    restart_s: float = 60.0
    drop: bool = True  # drop a job no allocation meets (False: it runs best effort)


def finish_time(job: JobSpec, cell: dict[str, Any], now_s: float, restart_s: float) -> float:
    lost = 0.0 if cell.get("current") else (restart_s if job.running else 0.0)
    return now_s + lost + job.remaining_iterations * float(cell["iter_time_s"])


def apply_deadlines(g: nx.DiGraph, jobs: list[JobSpec], now_s: float,
                    options: DeadlineOptions | None = None) -> None:
    """Filter and weight the candidate graph in place (see the module docstring)."""
    opt = options or DeadlineOptions()
    g.graph["deadlines"] = opt.__dict__.copy()
    slack = {j.id: j.deadline_s - now_s for j in jobs if j.deadline_s is not None}
    if not slack:
        return
    tightest = min((v for v in slack.values() if v > 0), default=1.0)
    unit = max([1.0] + [float(d["value"]) for _, d in g.nodes(data=True)
                        if d.get("kind") == "cell"])
    g.graph["deadlines"]["unit"] = unit
    for job in jobs:
        if job.deadline_s is None:
            continue
        jn = job_node(job.id)
        jd = g.nodes[jn]
        admitted = job.admitted or job.running is not None
        jd["deadline_s"] = job.deadline_s
        jd["admitted"] = admitted
        cells = list(g.successors(jn))
        meeting, late = [], []
        for cn in cells:
            t = finish_time(job, g.nodes[cn], now_s, opt.restart_s)
            g.nodes[cn]["finish_s"] = t
            (meeting if t <= job.deadline_s else late).append(cn)
        if not meeting:
            if not opt.drop and cells:  # best effort: every cell stays, no priority
                jd["deadline_missed"] = True
                continue
            g.remove_nodes_from(late)
            if jd.get("reason") is None:
                jd["reason"] = Reason.DEADLINE_UNMEETABLE.value
            continue
        g.remove_nodes_from(late)
        jd["min_share_gpus"] = min(int(g.nodes[cn]["gpus"]) for cn in meeting)
        urgency = tightest / max(tightest, slack[job.id])  # 1 for the most urgent job
        extra = unit * (opt.admitted_weight if admitted
                        else opt.new_weight * (0.5 + 0.5 * urgency))
        for cn in meeting:
            d = g.nodes[cn]
            d["bonus"] = float(d.get("bonus", 0.0)) + extra
            d["value"] = float(d["value"]) + extra


def deadline_projection(g: nx.DiGraph, placed: set[str]) -> dict[str, Any]:
    """Projected deadline satisfactory ratio of a round's decision (a job placed on a
    meeting cell; one running best effort past its deadline is not)."""
    jobs = [d for _, d in g.nodes(data=True) if d.get("kind") == "job" and "deadline_s" in d]
    met = [d["job"] for d in jobs if d["job"] in placed and not d.get("deadline_missed")]
    return {"deadline_jobs": len(jobs), "placed_on_time": len(met),
            "projected_satisfactory_ratio": (len(met) / len(jobs)) if jobs else None}
