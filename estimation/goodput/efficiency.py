"""Statistical efficiency: how much of a larger batch's work still counts as progress.

Pollux (OSDI'21, section 3.1) measures training progress in samples of the initial batch
``M0``: a step at batch ``M`` makes as much progress as ``M * E(M)`` samples at ``M0``, where

    E(M) = (phi + M0) / (phi + M),      phi = M0 * grad_var / grad_sqr

and ``phi`` is the gradient noise scale (McCandlish et al., "An empirical model of
large-batch training"), ``grad_var`` the variance of one ``M0``-sample gradient and
``grad_sqr`` the squared norm of the true gradient. ``E`` is 1 at ``M0`` and falls toward 0
as ``M`` grows past the noise scale: a large noise scale (noisy gradients, late in training)
lets the batch grow at little loss, a small one does not. Written in the two statistics,

    E(M) = (grad_var + grad_sqr) / (grad_var + grad_sqr * M / M0),

which stays finite when ``grad_sqr`` is 0 (pure noise: every sample counts, E = 1).

:class:`GradientNoise` holds the statistics Pollux recorded per epoch of training at each
validated batch and answers them at any progress and batch (linearly between the recorded
batches, as the data's batches are the only ones measured).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from apportion.estimation.goodput.measurements import GradientLog


def statistical_efficiency(batch: float | np.ndarray, init_batch: float,
                           grad_sqr: float | np.ndarray,
                           grad_var: float | np.ndarray) -> np.ndarray:
    """``E(M)`` for batch ``M`` >= ``M0`` (vectorised over ``batch`` and the statistics)."""
    m = np.asarray(batch, dtype=float) / float(init_batch)
    sqr = np.asarray(grad_sqr, dtype=float)
    var = np.asarray(grad_var, dtype=float)
    den = var + sqr * m
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, (var + sqr) / np.where(den > 0, den, 1.0), 1.0)
    return out


def noise_scale(init_batch: float, grad_sqr: float, grad_var: float) -> float:
    """``phi``, in samples: the batch at which efficiency has fallen to about half."""
    return float(init_batch) * float(grad_var) / float(grad_sqr) if grad_sqr > 0 else np.inf


class GradientNoise:
    """Gradient statistics by progress and batch, from Pollux's per-epoch logs.

    Progress is counted in samples of ``M0`` (the smallest logged batch): the logs' own
    progress column (steps of ``M0``) times ``M0``. Epoch ``e`` ends where the slowest log
    reaches it (the smallest progress any batch records for it), so an epoch boundary is the
    same for every batch. Statistics between logged batches are interpolated linearly, and
    clamped at the ends."""

    def __init__(self, logs: Sequence[GradientLog]) -> None:
        self.logs = tuple(sorted(logs, key=lambda g: g.batch))

    @property
    def init_batch(self) -> int:
        return self.logs[0].batch

    @property
    def batches(self) -> np.ndarray:
        return np.array([g.batch for g in self.logs], dtype=float)

    @property
    def epoch_ends(self) -> np.ndarray:
        """Progress (samples of ``M0``) at the end of each epoch all logs recorded."""
        n = min(g.progress.size for g in self.logs)
        steps = np.min(np.stack([g.progress[:n] for g in self.logs]), axis=0)
        return steps * self.init_batch

    def epoch(self, progress: float) -> int:
        """The epoch a job is in after ``progress`` samples (0-based; the last once past it)."""
        ends = self.epoch_ends
        # an epoch's end is its next one's start: a job exactly there (up to rounding in
        # the samples-of-M0 conversion) is in the next epoch
        at = progress + 1e-9 * max(1.0, abs(progress))
        return min(int(np.searchsorted(ends, at, side="right")), int(ends.size) - 1)

    def stats(self, progress: float, batch: float | np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """``(grad_sqr, grad_var)`` during the epoch at ``progress``, at ``batch`` (``M0`` when
        omitted; vectorised over batch)."""
        e = self.epoch(progress)
        b = np.asarray(self.init_batch if batch is None else batch, dtype=float)
        sqr = np.array([g.grad_sqr[e] for g in self.logs])
        var = np.array([g.grad_var[e] for g in self.logs])
        return np.interp(b, self.batches, sqr), np.interp(b, self.batches, var)

    def efficiency(self, progress: float, batch: float | np.ndarray,
                   at: float | None = None) -> np.ndarray:
        """``E(batch)`` during the epoch at ``progress``: with the statistics measured at each
        ``batch`` itself (``at`` None: what training at that batch would really see), or with
        one noise scale measured at batch ``at`` (what a job running at ``at`` reports)."""
        sqr, var = self.stats(progress, batch if at is None else at)
        return statistical_efficiency(batch, self.init_batch, sqr, var)
