"""Accuracy scoring shared by the estimation benchmarks (``bench estimate``): relative
errors, their summaries, rank agreement, and Morphling's per-row scoring."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from apportion.estimation.morphling import MorphlingEstimator, MorphlingSample


def summarize(errors: Iterable[float]) -> dict[str, float]:
    e = list(errors)
    if not e:
        return {"n": 0, "mean_error": float("nan"), "max_error": float("nan")}
    return {"n": len(e), "mean_error": float(statistics.fmean(e)), "max_error": float(max(e))}


def rel_err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho (average ranks for ties): :func:`scipy.stats.spearmanr`; NaN when a
    side is constant."""
    from scipy.stats import spearmanr

    if len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def score_morphling(est: MorphlingEstimator, rows: list[tuple[str, MorphlingSample]]
                     ) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    fams: dict[str, list[float]] = {}
    detail = []
    for fam, s in rows:
        assert s.arch is not None and s.nodes is not None
        p = est.predict_config(s.arch, s.job.global_batch_size, s.plan, s.nodes, s.cpus,
                               s.gpu_type)["T_iter"]
        e = rel_err(p, s.iter_time_s)
        fams.setdefault(fam, []).append(e)
        detail.append({"family": fam, "plan": s.plan.label(),
                       "placement": "".join(str(k) for k in s.nodes),
                       "measured_s": s.iter_time_s, "predicted_s": p, "error": e})
    return fams, detail


