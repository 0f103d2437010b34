"""apportion's own policies in the registry: :class:`apportion.round.FormulationPolicy`.

``apportion`` (cells), ``apportion-plans`` (Morphling's plans x multi-resource
formulation, tenants, quotas and SLAs), ``apportion-deadline`` (Crius-DDL /
ElasticFlow admission), ``crius-greedy`` (Crius's algorithm 1: the cells
greedy alone) and the ablations ``apportion-na`` (no GPU-count scaling) and
``apportion-nh`` (no heterogeneity: every job on its requested type), all one
class. In a replay they re-solve on events and at least every
``resolve_every`` rounds (Crius's algorithm 1 is triggered by arrivals and
departures); a cell on which a job made no progress is dropped from its
candidates (runtime feedback).

Options given by name override the :class:`~apportion.round.RoundConfig` a
driver passes (``solve-round`` and ``run`` pass the operator's flags).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from apportion.formulations.candidates import CandidateOptions
from apportion.round import FormulationPolicy, RoundConfig

# Crius's objective (normalised throughput, a queue bonus, Gavel's normalisation): what
# the crius-greedy baseline optimises whatever apportion's defaults become
CRIUS_OBJECTIVE: dict[str, Any] = {"objective": "normalized", "place_bonus": 0.0,
                                   "normalize": "requested", "keep_bonus": 0.3,
                                   "queue_weight": 0.25, "scales": (0.5, 1.0, 2.0),
                                   "amortize_s": None, "scale_up_when_full": True}


def Optimising(config: RoundConfig | None = None, formulation: str = "cells",  # noqa: N802
               backend: str | None = None, time_budget_s: float | None = None,
               search_depth: int | None = None, max_changes: int | None = None,
               no_scaling: bool = False, no_hetero: bool = False,
               stage_counts: str | None = None, resolve_every: int | None = 12,
               estimator: Any = None, name: str | None = None,
               mip_gap: float | None = None, deterministic: bool | None = None,
               **objective: Any) -> FormulationPolicy:
    """A formulation policy from a driver's config and the registry's fixed options.

    ``objective``: :class:`CandidateOptions` fields (``objective``, ``place_bonus``,
    ``remaining_exponent``, ``weight_bounds``, ``normalize``, ``keep_bonus``, ...) over the
    config's; the plans formulation takes the same (``PlanOptions.like``). Crius's greedy
    (``backend="greedy"``, the ``crius-greedy`` baseline) keeps Crius's objective
    (:data:`CRIUS_OBJECTIVE`) unless told otherwise.
    """
    cfg = replace(config) if config is not None else RoundConfig(time_budget_s=5.0)
    cfg.formulation = formulation
    if backend is not None:
        cfg.backend = backend
    if time_budget_s is not None:
        cfg.time_budget_s = time_budget_s
    if search_depth is not None:
        cfg.search_depth = search_depth
    if mip_gap is not None:
        cfg.mip_gap = mip_gap
    if deterministic is not None:
        cfg.deterministic = deterministic
    if max_changes is not None:
        cfg.max_changes = max_changes
    if estimator is not None:
        cfg.estimator = estimator
    opts = cfg.candidates
    if stage_counts is not None:
        opts = replace(opts, stage_counts=stage_counts)
    if no_scaling:
        opts = replace(opts, scales=(1.0,))
    opts = opts if isinstance(opts, CandidateOptions) else CandidateOptions()
    unknown = set(objective) - {f.name for f in fields(CandidateOptions)}
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
    if cfg.backend == "greedy" and formulation == "cells":
        opts = replace(opts, **CRIUS_OBJECTIVE)
    cfg.candidates = replace(opts, **objective)
    suffix = "-na" if no_scaling else "-nh" if no_hetero else ""
    base = {"cells": "apportion", "plans": "apportion-plans",
            "deadline": "apportion-deadline"}[formulation]
    if cfg.backend == "greedy" and formulation == "cells":
        base = "crius-greedy"
    return FormulationPolicy(cfg, name=name or f"{base}{suffix}", resolve_every=resolve_every,
                             no_hetero=no_hetero)
