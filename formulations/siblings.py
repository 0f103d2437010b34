"""Fine-tuning siblings in the cell model: transfer options and merged cells (YMIR's modes
as options of apportion's own round).

Fine-tuning jobs that share a backbone can help each other (the YMIR paper, section 3):
a job started from a finished sibling's weights needs less work to reach its target
(**temporal transfer**), and two siblings trained as one merged job (one backbone, a head
each, the batches added) may both reach their targets sooner than apart (**spatial
merging**). Here both are cells of the same round's model as every other cell:

* a **transfer option** is a cell whose work is cut: a job that never started and has a
  finished sibling predicted to help gets its cells rated from that sibling's weights
  (``source``: the sibling's id, ``transfer_gain``: the predicted gain). Its throughput is
  counted in the job's own normal iterations, so the cut work shows as speed and the
  objective (the JCT seconds the job saves) needs nothing new. The normal cell of the
  same GPUs is dominated (same GPUs, slower: :func:`~apportion.formulations.candidates.
  prune_dominated`'s rule), so the transfer cell takes its place;
* a **merged cell** is one column serving several jobs: a cell of its lead (``job``) with
  ``members``, which its lead's and each member's ``one[...]`` rows both hold (each job
  at most one column), on the capacity rows as usual. Its ``value`` is the JCT seconds
  saved by every job it serves: the lead's and each member's, each weighed as the
  objective weighs that job (each member's share is valued on a transient copy of the
  cell under the member's job, then folded into the lead's cell: ``member_values``).
  ``merge_option`` marks a pair not merged yet (a choice of this round); a lead already
  merged keeps ``members`` on every cell (the mode is fixed at the first start) and its
  members have no cells of their own.

A job whose mode was fixed when it started (a source, or members) has every cell rated
in that mode. What the round offers, and the rates, come from the policy
(:class:`SiblingOptions`): this module only turns them into graph vertices, so the model,
the decoder and the validator read nothing new but ``members`` (the cell model's rows:
:func:`member_cover`) and the decision's ``meta`` (``transfer``, ``merged``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from apportion.formulations.candidates import cell_edges
from apportion.formulations.schema import cells_of, job_node

from apportion.cluster import Cluster
from apportion.decision import Reason
from apportion.plans import ExecutionPlan

#: (gpu type, gpus) -> iterations/s in the job's own normal iterations (0: cannot run)
Rate = Callable[[str, int], float]


@dataclass
class SiblingOptions:
    """What a round offers fine-tuning siblings, from the policy that remembers them.

    ``modes``: jobs whose mode was fixed at their first start, with the rate of that mode;
    ``members``: merged leads already running (or stopped) with the jobs inside them;
    ``transfers``: job -> (finished source, predicted gain, the rate from its weights);
    ``merges``: (lead, member, the merged job's rate in the lead's iterations), pairs of
    queued siblings predicted to gain; ``waits``: job -> (running sibling, its predicted
    end), a queued job that finishes sooner by waiting for that sibling's weights than by
    starting now (the paper's temporal mode A->B with B queued behind A: it takes no cell
    this round); ``remaining`` and ``batch``: every job's iterations
    left and global batch (a member's share of a merged cell is its own work done in the
    lead's time)."""

    modes: dict[str, Rate] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transfers: dict[str, tuple[str, float, Rate]] = field(default_factory=dict)
    merges: list[tuple[str, str, Rate]] = field(default_factory=list)
    waits: dict[str, tuple[str, float]] = field(default_factory=dict)
    remaining: dict[str, float] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.modes or self.members or self.transfers or self.merges or self.waits)


def _rated(d: dict[str, Any], rate: float, batch: int, ref: float | None = None) -> None:
    """A cell's speed as ``rate`` iterations/s of a job of ``batch`` samples, and its
    normalised throughput over the job's reference ``ref`` (what the objective reads)."""
    d["est_throughput"] = rate * batch
    d["iter_time_s"] = 1.0 / rate if rate > 0 else math.inf
    if ref is not None:
        d["normalized"] = d["est_throughput"] / ref if ref > 0 else 0.0


def _ref(g: nx.DiGraph, jid: str) -> float:
    return float(g.nodes[job_node(jid)].get("ref_throughput") or 0.0)


def apply_sibling_options(g: nx.DiGraph, opts: SiblingOptions, cluster: Cluster,
                          merged_plan: Callable[[str, str, str, int], ExecutionPlan | None]
                          | None = None) -> dict[str, int]:
    """The round's transfer options, merged cells and fixed modes in the candidate graph
    ``g`` (in place; before the objective is applied: :func:`fold_member_values` after
    it). ``merged_plan(lead, member, gpu type, gpus)``: the merged job's plan on that
    many GPUs (None: it does not fit); default the data-parallel plan. Returns counts of
    what was added (``transfer_cells``, ``merged_cells``), also kept in
    ``g.graph["siblings"]``."""
    added = {"transfer_cells": 0, "merged_cells": 0, "mode_cells": 0}
    members_inside = {m for ms in opts.members.values() for m in ms}
    for jid, rate in opts.modes.items():  # a fixed mode rates every cell of the job
        if job_node(jid) not in g:
            continue
        for cn in cells_of(g, jid):
            d = g.nodes[cn]
            _rated(d, rate(d["gpu_type"], int(d["gpus"])), opts.batch.get(jid, 1), _ref(g, jid))
            if d["est_throughput"] <= 0:
                g.remove_node(cn)
                continue
            added["mode_cells"] += 1
            ms = opts.members.get(jid)
            if ms:
                d["members"] = list(ms)
        jd = g.nodes[job_node(jid)]
        if not cells_of(g, jid) and jd.get("reason") is None:
            jd["reason"] = Reason.NO_FIT_MEMORY.value
    for m in members_inside:  # a member trains inside its lead: no cell of its own
        if job_node(m) in g:
            g.remove_nodes_from(cells_of(g, m))
            g.nodes[job_node(m)]["merged_into"] = next(
                lead for lead, ms in opts.members.items() if m in ms)
    for jid, (src, gain, rate) in opts.transfers.items():
        if job_node(jid) not in g:
            continue
        for cn in cells_of(g, jid):
            d = g.nodes[cn]
            r = rate(d["gpu_type"], int(d["gpus"]))
            if r <= 0:
                continue
            _rated(d, r, opts.batch.get(jid, 1), _ref(g, jid))
            d["source"] = src
            d["transfer_gain"] = round(float(gain), 6)
            added["transfer_cells"] += 1
    for jid, (src, eta) in opts.waits.items():  # waits for a running sibling's weights
        if job_node(jid) in g:
            g.remove_nodes_from(cells_of(g, jid))
            g.nodes[job_node(jid)]["awaits"] = [src, round(float(eta), 3)]
            added["waiting"] = added.get("waiting", 0) + 1
    for lead, member, rate in opts.merges:
        added["merged_cells"] += _add_merged_cells(g, lead, member, rate, opts, cluster,
                                                  merged_plan)
    add_member_shares(g, opts)
    g.graph["siblings"] = added
    return added


def _merged_counts(g: nx.DiGraph, lead: str, member: str) -> dict[str, list[int]]:
    """GPU counts offered to a merged pair per type: each member's own counts and the sums
    of them (the merged batch is the sum of both, so its data-parallel limit is too)."""
    per: dict[str, tuple[set[int], set[int]]] = {}
    for i, jid in enumerate((lead, member)):
        for cn in cells_of(g, jid):
            d = g.nodes[cn]
            per.setdefault(d["gpu_type"], (set(), set()))[i].add(int(d["gpus"]))
    return {t: sorted(a | b | {x + y for x in a for y in b}) for t, (a, b) in per.items()
            if a and b}


def _add_merged_cells(g: nx.DiGraph, lead: str, member: str, rate: Rate,
                      opts: SiblingOptions, cluster: Cluster,
                      merged_plan: Callable[[str, str, str, int], ExecutionPlan | None] | None
                      ) -> int:
    """The merged cells of one pair: each count whose merged rate beats every smaller one
    (a slower larger cell is dominated), with a transient copy under the member's job
    for :func:`fold_member_values`."""
    if job_node(lead) not in g or job_node(member) not in g:
        return 0
    caps = cluster.capacity_by_type()
    rem_lead = max(1e-9, opts.remaining.get(lead, 0.0))
    share = opts.remaining.get(member, 0.0) / rem_lead  # member iterations per lead iteration
    bonus = g.nodes[job_node(lead)].get("queue_bonus", 0.0)
    vertices: list[tuple[str, dict[str, Any]]] = []
    edges: list[tuple[str, str, dict[str, Any]]] = []
    for t, counts in sorted(_merged_counts(g, lead, member).items()):
        best = 0.0
        for n in counts:
            if n > caps.get(t, 0):
                continue
            r = rate(t, n)
            if r <= best * (1 + 1e-9):
                continue
            plan = merged_plan(lead, member, t, n) if merged_plan else ExecutionPlan(dp=n)
            if plan is None:
                continue
            best = r
            single = n <= cluster.max_gpus_per_node(t)
            cn = f"cell:{lead}||{member}@{t}x{n}"
            d = {"kind": "cell", "job": lead, "gpu_type": t, "gpus": n, "stages": plan.pp,
                 "dp": plan.dp, "tp": plan.tp, "micro_batches": plan.micro_batches,
                 "mem_per_gpu": 0.0, "normalized": 0.0, "bonus": bonus, "value": 0.0,
                 "current": False, "single_node": single, "members": [member],
                 "merge_option": True}
            _rated(d, r, opts.batch.get(lead, 1), _ref(g, lead))
            vertices.append((cn, d))
            edges.append((job_node(lead), cn, {}))
            edges += cell_edges(g, cn, cluster, t, n, plan.tp, single, None)
            # the member's share, valued as the objective values the member's cells
            sd = dict(d, job=member, members=[], merge_option=False, shadow_of=cn)
            _rated(sd, r * share, opts.batch.get(member, 1), _ref(g, member))
            sd["bonus"] = g.nodes[job_node(member)].get("queue_bonus", 0.0)
            vertices.append((f"{cn}#share:{member}", sd))
    g.add_nodes_from(vertices)
    g.add_edges_from(edges)
    return sum(1 for _, d in vertices if d.get("merge_option"))


def add_member_shares(g: nx.DiGraph, opts: SiblingOptions) -> None:
    """Each running merged lead's cells get a transient copy per member (the member's
    share, valued by the objective as the member's: :func:`fold_member_values`)."""
    for lead, ms in opts.members.items():
        if job_node(lead) not in g:
            continue
        rem_lead = max(1e-9, opts.remaining.get(lead, 0.0))
        for cn in cells_of(g, lead):
            d = g.nodes[cn]
            for m in ms:
                if job_node(m) not in g:
                    continue
                share = opts.remaining.get(m, 0.0) / rem_lead
                sd = {k: v for k, v in d.items() if k not in ("members", "plan")}
                sd.update(job=m, shadow_of=cn, current=False,
                          bonus=g.nodes[job_node(m)].get("queue_bonus", 0.0))
                it = float(d["est_throughput"]) / max(1, opts.batch.get(lead, 1))
                _rated(sd, it * share, opts.batch.get(m, 1), _ref(g, m))
                g.add_node(f"{cn}#share:{m}", **sd)


def fold_member_values(g: nx.DiGraph) -> int:
    """After the objective: each member's share added to its merged cell's ``value``
    (``member_values`` keeps them apart), the transient copies removed. The count folded."""
    shares = [(v, d) for v, d in g.nodes(data=True) if d.get("shadow_of") is not None]
    for v, d in shares:
        owner = g.nodes[d["shadow_of"]]
        got = owner.setdefault("member_values", {})
        got[d["job"]] = float(d["value"])
        owner["value"] = float(owner["value"]) + float(d["value"])
    g.remove_nodes_from([v for v, _ in shares])
    return len(shares)


def member_cover(g: nx.DiGraph, cells: list[str] | None = None) -> dict[str, list[str]]:
    """Each member job and the merged cells that serve it (its ``one[...]`` row holds them
    beside its own cells). ``cells``: the cell vertices to look at (default: every one)."""
    out: dict[str, list[str]] = {}
    it = ((cn, g.nodes[cn]) for cn in cells) if cells is not None else \
        ((cn, d) for cn, d in g.nodes(data=True) if d.get("kind") == "cell")
    for cn, d in it:
        for m in d.get("members") or ():
            out.setdefault(m, []).append(cn)
    return out


def sibling_meta(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The decision's ``meta`` for the chosen cells (job -> the chosen cell's attributes):
    ``transfer`` {job: source} and ``merged`` {lead: [members]}, what the simulator and an
    executor read (YMIR's keys)."""
    transfer: dict[str, str] = {}
    merged: dict[str, list[str]] = {}
    for jid, d in cells.items():
        if d.get("source") is not None:
            transfer[jid] = str(d["source"])
        if d.get("members"):
            merged[jid] = list(d["members"])
    return {"transfer": transfer, "merged": merged}


def sibling_keys(g: nx.DiGraph, dump: dict[str, Any]) -> dict[str, Any]:
    """The problem dump with each candidate's ``source`` and ``members`` where it has them
    (a merged candidate covers its members' rows too: enough to re-solve the round)."""
    for job in dump.get("jobs", []):
        cells = cells_of(g, job["job"]) if job_node(job["job"]) in g else []
        for cand, cn in zip(job.get("candidates", []), cells):
            d = g.nodes[cn]
            if d.get("source") is not None:
                cand["source"] = d["source"]
                cand["transfer_gain"] = d.get("transfer_gain")
            if d.get("members"):
                cand["members"] = list(d["members"])
                cand["member_values"] = dict(d.get("member_values") or {})
        merged_into = g.nodes[job_node(job["job"])].get("merged_into") \
            if job_node(job["job"]) in g else None
        if merged_into is not None:
            job["merged_into"] = merged_into
    return dump
