"""What Morphling's fitted model claims, per plan family and placement: the worst error on
rows its fits did not see.

The model is scored on the Morphling artifact's A800 traces under the ``covering``
protocol (``apportion bench estimate --against morphling``; protocol and rows in
``experiments/results/estimation/README.md``). A mean error hides the rows a job may land
on: there, the worst held-out row of a (plan family, scope) is up to 68 % off (ViT's
ZeRO-DP step across eight single-GPU nodes). Such rows are not a parameter the fit got
wrong: the same plan on the same number of GPUs runs up to 2.2x faster or slower on
placements of one link class (ViT's DP step on ``17`` against ``1111112``), which the
appendix-A link model (one bottleneck bandwidth per link, measured offline) cannot tell
apart.

So the model claims a (plan family, scope) only where its worst held-out row is within
:data:`CLAIM_THRESHOLD`; every other one is outside its claims, with its measured error,
and ``--estimator auto`` does not take Morphling's figure there
(:class:`~apportion.estimation.registry.AutoEstimator`). The table ships in
``apportion/data/morphling_claims.json``, written from the benchmark's result by
``python -m apportion.experiments.bench.estimate_morphling --claims PATH``; a (family,
scope) no held-out row measured is not claimed either.

Plan families are the benchmark's (Morphling's table 2 columns): ``DP``, ``GC``,
``ZeRO-DP+GA``, ``ZeRO-Offload``, ``ZeRO-Offload+GC``, ``TP+PP`` (no data parallelism)
and ``DP+TP+PP``; the scope is ``single-node`` or ``multi-node`` (every link class across
nodes together: a cluster's description does not always say how a node's GPUs share its
network adapters, which separates them on Morphling's testbed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from apportion.plans import ExecutionPlan

#: the worst held-out relative error a (plan family, scope) may show to be claimed
CLAIM_THRESHOLD = 0.10
SCOPES = ("single-node", "multi-node")
FAMILIES = ("DP", "GC", "ZeRO-DP+GA", "ZeRO-Offload", "ZeRO-Offload+GC", "TP+PP", "DP+TP+PP")


def plan_family(plan: ExecutionPlan) -> str:
    """A plan's family, as the benchmark labels its rows."""
    if plan.tp > 1 or plan.pp > 1:
        return "TP+PP" if plan.dp == 1 else "DP+TP+PP"
    if plan.offload:
        return "ZeRO-Offload+GC" if plan.checkpointing else "ZeRO-Offload"
    if plan.zero_stage >= 1:
        return "ZeRO-DP+GA"
    return "GC" if plan.checkpointing else "DP"


def placement_scope(nodes: Sequence[int]) -> str:
    """``single-node`` where every GPU is on one node, else ``multi-node``."""
    return "single-node" if sum(1 for g in nodes if g > 0) <= 1 else "multi-node"


@dataclass(frozen=True)
class Claim:
    """A (plan family, scope) and what the benchmark measured there: rows scored, mean and
    worst error; ``claimed`` when rows were scored and the worst is within the threshold."""

    family: str
    scope: str
    n: int = 0
    mean_error: float | None = None
    max_error: float | None = None
    claimed: bool = False

    def describe(self) -> str:
        where = f"{self.family} on {'one node' if self.scope == 'single-node' else 'several nodes'}"
        if not self.n or self.max_error is None:
            return f"{where}: no held-out row measured"
        return (f"{where}: worst held-out error {100 * self.max_error:.1f} % (mean "
                f"{100 * (self.mean_error or 0):.1f} %, {self.n} rows of Morphling's covering "
                "protocol)")

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, "scope": self.scope, "n": self.n,
                "mean_error": self.mean_error, "max_error": self.max_error,
                "claimed": self.claimed}


def claims_from_rows(rows: Sequence[Mapping[str, Any]],
                     threshold: float = CLAIM_THRESHOLD) -> list[Claim]:
    """The claims table from a protocol's scored rows (``family``, ``kind``, ``error``;
    rows marked ``excluded`` are skipped): every family x scope, measured or not."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get("excluded"):
            continue
        scope = "single-node" if r["kind"] == "single-node" else "multi-node"
        acc.setdefault((r["family"], scope), []).append(float(r["error"]))
    out = []
    for fam in FAMILIES:
        for scope in SCOPES:
            errs = acc.get((fam, scope), [])
            if not errs:
                out.append(Claim(fam, scope))
                continue
            worst = max(errs)
            out.append(Claim(fam, scope, len(errs), sum(errs) / len(errs), worst,
                             worst <= threshold))
    return out


@lru_cache(maxsize=1)
def shipped_claims() -> dict[tuple[str, str], Claim]:
    """The claims table shipped in ``apportion/data/morphling_claims.json``."""
    text = resources.files("apportion").joinpath("data/morphling_claims.json").read_text()
    data = json.loads(text)
    return {(c["family"], c["scope"]): Claim(c["family"], c["scope"], int(c["n"]),
                                             c["mean_error"], c["max_error"], bool(c["claimed"]))
            for c in data["claims"]}


def claim_for(plan: ExecutionPlan, nodes: Sequence[int]) -> Claim:
    """The shipped claim of ``plan``'s family in ``nodes``' scope (unmeasured: not claimed)."""
    fam, scope = plan_family(plan), placement_scope(nodes)
    return shipped_claims().get((fam, scope), Claim(fam, scope))
