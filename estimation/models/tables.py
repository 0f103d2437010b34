"""Measured lookup tables with interpolation.

Estimators read measurements through two table types:

* :class:`Curve` -- one measured function ``y(x)`` (seconds against bytes,
  seconds against samples per device, throughput against GPU count),
  interpolated piecewise-linearly in log-log space between measured points and
  extrapolated along the end segments' *linear* law (a time proportional to
  size beyond the largest point; the smallest measured time below the smallest
  point). Log-log because collectives on real transports are not one
  alpha-beta line: gloo's all-gather bandwidth halves above ~16 MB and a
  least-squares alpha goes negative, while a piecewise fit in log-log space
  follows every regime the measurement saw.
* :class:`CommTables` -- the communication tables: one :class:`Curve` per
  ``(collective, link, ranks)``, with lookups for rank counts that were not
  measured scaled by the ring-collective factor, and an alpha-beta fallback
  (:mod:`apportion.estimation.models.comm`) for links that were never measured, so a
  cluster of GPUs can be estimated before anything is measured on it.

:func:`Curve.leave_one_out` reports the interpolation error at each interior
point when that point is withheld: the honest accuracy of the table.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.estimation.models.comm import Link, allgather_time, allreduce_time, p2p_time

log = logging.getLogger(__name__)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class Curve:
    """Measured points ``(x, y)`` with ``x > 0``, ``y > 0``, sorted by ``x``."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]]) -> Curve:
        """Build from points; equal ``x`` values are averaged (repeat measurements)."""
        acc: dict[float, list[float]] = {}
        for x, y in points:
            x, y = float(x), float(y)
            if not (x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)):
                raise ValueError(f"table points must be positive and finite, got ({x}, {y})")
            acc.setdefault(x, []).append(y)
        if not acc:
            raise ValueError("a table needs at least one point")
        xs = tuple(sorted(acc))
        return cls(xs, tuple(sum(acc[x]) / len(acc[x]) for x in xs))

    def __call__(self, x: float) -> float:
        return self.at(x)

    def at(self, x: float) -> float:
        """Interpolated value at ``x`` (see the module docstring for the rules)."""
        xs, ys = self.xs, self.ys
        if x <= 0:
            return 0.0
        if len(xs) == 1:
            return ys[0] * x / xs[0] if x > xs[0] else ys[0]
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1]  # linear in size beyond the largest measurement
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if xs[mid] <= x:
                lo = mid
            else:
                hi = mid
        lx0, lx1 = math.log(xs[lo]), math.log(xs[hi])
        ly0, ly1 = math.log(ys[lo]), math.log(ys[hi])
        t = (math.log(x) - lx0) / (lx1 - lx0)
        return math.exp(ly0 + t * (ly1 - ly0))

    def leave_one_out(self) -> list[float]:
        """Relative error ``|pred - y| / y`` at each interior point when it is withheld."""
        errs: list[float] = []
        for i in range(1, len(self.xs) - 1):
            rest = Curve(self.xs[:i] + self.xs[i + 1:], self.ys[:i] + self.ys[i + 1:])
            errs.append(abs(rest.at(self.xs[i]) - self.ys[i]) / self.ys[i])
        return errs

    def as_dict(self) -> dict[str, list[float]]:
        return {"x": list(self.xs), "y": list(self.ys)}


def _key(collective: str, link: str, ranks: int) -> str:
    return f"{collective}|{link}|{ranks}"


def _ring_factor(collective: str, n: int) -> float:
    """Per-byte traffic of a ring collective over ``n`` ranks (relative units)."""
    if n <= 1:
        return 0.0
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


@dataclass
class CommTables:
    """Measured collective times, ``seconds = table(bytes)`` per collective, link and ranks.

    ``bytes`` is the total tensor size of the collective (the all-reduced
    buffer; the gathered output; the reduce-scatter input; the message).
    """

    curves: dict[str, Curve] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, collective: str, link: str, ranks: int, points: Iterable[tuple[float, float]]
            ) -> None:
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {COLLECTIVES}")
        self.curves[_key(collective, link, int(ranks))] = Curve.from_points(points)

    def links(self) -> set[str]:
        return {k.split("|")[1] for k in self.curves}

    def has(self, collective: str, link: str) -> bool:
        return any(k.startswith(f"{collective}|{link}|") for k in self.curves)

    def time(self, collective: str, nbytes: float, ranks: int, link: Link | str) -> float:
        """Seconds for one collective of ``nbytes`` over ``ranks`` ranks on ``link``.

        Exact rank count when measured; otherwise the nearest measured rank
        count scaled by the ring factor; otherwise the alpha-beta model of
        ``link`` (a :class:`Link`; a bare link name gets the catalog default).
        """
        if nbytes <= 0 or (ranks <= 1 and collective != "send_recv"):
            return 0.0
        kind = link.kind if isinstance(link, Link) else str(link)
        ranks_measured = sorted(int(k.split("|")[2]) for k in self.curves
                                if k.startswith(f"{collective}|{kind}|"))
        if ranks_measured:
            n = ranks
            if n in ranks_measured:
                return self.curves[_key(collective, kind, n)].at(nbytes)
            near = min(ranks_measured, key=lambda r: (abs(math.log(max(r, 1) / max(n, 1))), r))
            base = self.curves[_key(collective, kind, near)]
            fn, fr = _ring_factor(collective, n), _ring_factor(collective, near)
            scale = fn / fr if fr > 0 else 1.0
            # bandwidth term scales with the ring factor; treat the whole curve so
            return base.at(nbytes * scale) if scale > 0 else 0.0
        lk = link if isinstance(link, Link) else Link(kind, _DEFAULT_GBPS.get(kind, 25.0))
        if collective == "all_reduce":
            return allreduce_time(nbytes, ranks, lk)
        if collective in ("all_gather", "reduce_scatter"):
            return allgather_time(nbytes, ranks, lk)
        return p2p_time(nbytes, lk)

    def leave_one_out(self) -> dict[str, dict[str, float]]:
        """Per curve: mean and max leave-one-out relative error and the point count."""
        out: dict[str, dict[str, float]] = {}
        for k, c in sorted(self.curves.items()):
            errs = c.leave_one_out()
            out[k] = {"n": float(len(errs)),
                      "mean_error": sum(errs) / len(errs) if errs else 0.0,
                      "max_error": max(errs) if errs else 0.0}
        return out

    # -- persistence -------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "curves": {k: c.as_dict() for k, c in self.curves.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommTables:
        curves = {k: Curve.from_points(zip(v["x"], v["y"]))
                  for k, v in dict(data.get("curves", {})).items()}
        return cls(curves, dict(data.get("meta", {})))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=1))
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> CommTables:
        return cls.from_dict(json.loads(Path(path).read_text()))


_DEFAULT_GBPS = {"nvlink": 300.0, "pcie": 32.0, "network": 25.0}


def alpha_beta_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = alpha + x / bandwidth``; returns ``(alpha_s, bandwidth_Bps)``.

    Kept to show why the tables are piecewise: on gloo the fitted alpha is
    often negative (the line cannot follow two bandwidth regimes).
    """
    n = len(xs)
    if n < 2:
        raise ValueError("need two points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx > 0 else 0.0
    alpha = my - slope * mx
    return alpha, (1.0 / slope if slope > 0 else math.inf)
