"""Task2Vec transferability (YMIR Alg. 1): Fisher embeddings, scores, predicted transfer gain.

VECTORIZATION: a task is embedded as the diagonal of the Fisher information of a
small *probe network* (a fixed feature extractor shared by all tasks of a backbone,
plus a task head fitted briefly on a subset of the task's data). The Fisher is the
true one, ``E_x E_{y~p(y|x)} (d log p(y|x)/d theta)^2``, over the probe's feature
weights, estimated on ``SUBSET`` samples — cheap, and it reflects which features the
task relies on, which is what transfer depends on.

SIMSCORE: Task2Vec's symmetric distance, the cosine distance of the embeddings
normalised by their sum, ``d(Fa, Fb) = cos(Fa/(Fa+Fb), Fb/(Fa+Fb))``.

Scores (lower = more transferable):
* temporal A->B: ``d(A, B) - d(B, B')`` with B' the same task under another seed —
  the part of the distance that is not probe noise;
* spatial A||B: the average of the temporal scores in both directions.

A monotone map turns a score into a predicted transfer gain (fraction of iterations
saved); it can be fitted to measured gains. Pairs predicted non-positive are
filtered out, as YMIR filters negative combinations before scheduling.

torch is imported lazily so ``apportion.estimation`` imports without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    """A task's inputs (n x d float array) and integer labels (n,)."""

    name: str
    x: np.ndarray
    y: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1


def symmetric_distance(fa: np.ndarray, fb: np.ndarray) -> float:
    """Task2Vec's normalised cosine distance between two Fisher embeddings."""
    fa = np.asarray(fa, float)
    fb = np.asarray(fb, float)
    s = fa + fb
    s[s == 0] = 1.0
    a, b = fa / s, fb / s
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    if denom == 0:
        return 1.0
    return float(1.0 - np.dot(a, b) / denom)


class Task2VecProbe:
    """A fixed random feature extractor + per-task head; embeds tasks by diagonal Fisher.

    ``subset`` samples are drawn per task (the paper fixes 500); the head is fitted
    for ``head_steps`` full-batch steps with the user's learning rate.
    """

    def __init__(self, input_dim: int, hidden: int = 32, subset: int = 500,
                 head_steps: int = 100, lr: float = 0.05, seed: int = 0,
                 fisher_samples: int = 4) -> None:
        self.input_dim = input_dim
        self.hidden = hidden
        self.subset = subset
        self.head_steps = head_steps
        self.lr = lr
        self.seed = seed
        self.fisher_samples = fisher_samples
        self._backbone: Any = None

    def _build_backbone(self) -> Any:
        import torch

        if self._backbone is None:
            gen = torch.Generator().manual_seed(self.seed)
            w = torch.randn(self.hidden, self.input_dim, generator=gen) / self.input_dim ** 0.5
            b = torch.zeros(self.hidden)
            self._backbone = (w, b)
        return self._backbone

    def embed(self, task: TaskData, seed: int = 0) -> np.ndarray:
        """Diagonal Fisher of the feature-layer weights for ``task`` (``seed`` picks the subset)."""
        import torch

        w0, b0 = self._build_backbone()
        rng = np.random.default_rng(seed)
        n = min(self.subset, len(task.y))
        idx = rng.choice(len(task.y), size=n, replace=False)
        x = torch.as_tensor(task.x[idx], dtype=torch.float32)
        y = torch.as_tensor(task.y[idx], dtype=torch.long)
        gen = torch.Generator().manual_seed(seed + 1)
        feats = torch.tanh(x @ w0.T + b0)
        head = torch.nn.Linear(self.hidden, task.num_classes)
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.01)
            head.bias.zero_()
        opt = torch.optim.SGD(head.parameters(), lr=self.lr * 10, momentum=0.9)
        for _ in range(self.head_steps):  # fit the head on frozen features
            opt.zero_grad()
            torch.nn.functional.cross_entropy(head(feats), y).backward()
            opt.step()
        from torch.func import grad, vmap

        head_w, head_b = head.weight.detach(), head.bias.detach()

        def log_lik(params: tuple[Any, Any], xi: Any, yi: Any) -> Any:
            h = torch.tanh(xi @ params[0].T + params[1])
            logp = torch.log_softmax(h @ head_w.T + head_b, dim=-1)
            return torch.gather(logp, 0, yi.unsqueeze(0)).squeeze(0)

        per_sample = vmap(grad(log_lik), in_dims=(None, 0, 0))
        with torch.no_grad():
            probs = torch.softmax(head(feats), dim=1)
        fisher_w = torch.zeros_like(w0)
        fisher_b = torch.zeros_like(b0)
        for _ in range(self.fisher_samples):  # y ~ p(y|x): the true Fisher, not the empirical
            ys = torch.multinomial(probs, 1, replacement=True, generator=gen).squeeze(1)
            gw, gb = per_sample((w0, b0), x, ys)
            fisher_w += (gw ** 2).sum(0)
            fisher_b += (gb ** 2).sum(0)
        total = float(n * self.fisher_samples)
        emb = torch.cat([(fisher_w / total).flatten(), (fisher_b / total).flatten()])
        return emb.numpy().astype(float)


@dataclass
class TransferabilityEstimator:
    """Alg. 1: embeddings per task (two seeds), temporal and spatial scores, gains."""

    probe: Task2VecProbe
    embeddings_: dict[str, np.ndarray] = field(default_factory=dict)
    reseeded_: dict[str, np.ndarray] = field(default_factory=dict)

    def fit(self, tasks: list[TaskData]) -> TransferabilityEstimator:
        for t in tasks:
            self.embeddings_[t.name] = self.probe.embed(t, seed=0)
            self.reseeded_[t.name] = self.probe.embed(t, seed=1)
        return self

    def distance(self, a: str, b: str) -> float:
        return symmetric_distance(self.embeddings_[a], self.embeddings_[b])

    def seed_distance(self, a: str) -> float:
        return symmetric_distance(self.embeddings_[a], self.reseeded_[a])

    def temporal_score(self, a: str, b: str) -> float:
        """A->B: distance(A, B) minus B's same-task different-seed distance."""
        return self.distance(a, b) - self.seed_distance(b)

    def spatial_score(self, a: str, b: str) -> float:
        """A||B: the average of both directions' scores."""
        return 0.5 * (self.temporal_score(a, b) + self.temporal_score(b, a))


@dataclass
class GainMap:
    """Predicted gain = ``intercept - slope x score``, clipped below ``max_gain``.

    Defaults (a placeholder until fitted) make a zero score — as close as the
    seed noise — a 30 % saving and a score of 0.3 break even; :meth:`fit` refits both on measured
    (score, gain) pairs by least squares.
    """

    intercept: float = 0.3
    slope: float = 1.0
    max_gain: float = 0.9

    def predict(self, score: float) -> float:
        return float(min(self.max_gain, self.intercept - self.slope * score))

    def fit(self, scores: list[float], gains: list[float]) -> GainMap:
        s = np.asarray(scores, float)
        g = np.asarray(gains, float)
        if s.size < 2 or np.ptp(s) == 0:
            raise ValueError("need at least two distinct scores")
        a = np.vstack([np.ones_like(s), -s]).T
        (self.intercept, self.slope), *_ = np.linalg.lstsq(a, g, rcond=None)
        self.slope = max(float(self.slope), 0.0)  # closer must never predict less gain
        return self


def predicted_gains(est: TransferabilityEstimator, gain_map: GainMap,
                    names: list[str]) -> dict[str, dict[str, float]]:
    """Gains for every ordered / unordered pair, negatives filtered (task-file ``gains``)."""
    temporal: dict[str, float] = {}
    spatial: dict[str, float] = {}
    for i, a in enumerate(names):
        for b in names:
            if a != b:
                g = gain_map.predict(est.temporal_score(a, b))
                if g > 0:
                    temporal[f"{a}->{b}"] = round(g, 6)
        for b in names[i + 1:]:
            g = gain_map.predict(est.spatial_score(a, b))
            if g > 0:
                spatial[f"{a}||{b}"] = round(g, 6)
    return {"temporal": temporal, "spatial": spatial}


def synthetic_task(name: str, dim: int, classes: int, n: int, seed: int,
                   base: np.ndarray | None = None, shift: float = 0.0) -> TaskData:
    """A Gaussian-class task; related tasks share ``base`` class means up to ``shift``.

    Tests build their own small tasks with this (no dataset downloads): tasks derived
    from the same base are related, tasks from different bases are not.
    """
    rng = np.random.default_rng(seed)
    means = base if base is not None else rng.normal(size=(classes, dim)) * 2.0
    means = means + shift * rng.normal(size=means.shape)
    y = rng.integers(0, classes, size=n)
    x = means[y] + rng.normal(size=(n, dim))
    return TaskData(name, x.astype(np.float32), y)
