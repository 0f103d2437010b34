"""Task2Vec transferability (YMIR Alg. 1): Fisher embeddings, scores, predicted transfer gain.

VECTORIZATION: a task is embedded as the diagonal of the Fisher information of a
small *probe network* (a fixed feature extractor shared by all tasks of a backbone, on
inputs standardised over the tasks compared, plus a task head fitted to convergence on a
subset of the task's data). The Fisher is the true one, ``E_x sum_y p(y|x) (d log
p(y|x)/d theta)^2`` (the expectation over labels exact), over the probe's feature
weights, on ``SUBSET`` samples — cheap, and it reflects which features the task relies
on, which is what transfer depends on (:class:`Task2VecProbe` says why each part).

SIMSCORE: Task2Vec's symmetric distance, the cosine distance of the embeddings
normalised by their sum, ``d(Fa, Fb) = cos(Fa/(Fa+Fb), Fb/(Fa+Fb))``.

Scores (lower = more transferable):
* temporal A->B: ``d(A, B) - d(B, B')`` with B' the same task under another seed —
  the part of the distance that is not probe noise;
* spatial A||B: the average of the temporal scores in both directions.

A monotone map turns a score into a predicted transfer gain (fraction of iterations
saved); it can be fitted to measured gains. Pairs predicted non-positive are
filtered out, as YMIR filters negative combinations before scheduling.

:func:`auto_gains` is what ``apportion solve-finetune --gains auto`` runs: it reads
each task's samples (:func:`load_task_data`: ``.npz`` with arrays ``x`` and ``y``, or a
``.csv`` with a ``label`` column and numeric feature columns), embeds every task with
one probe, scores every pair, and maps scores to gains — calibrated on the gains the
task file measured, where it gives two or more, else YMIR's default map, said so; a
measured pair keeps its measurement (:func:`override_measured`). How well the map
predicts Titan's measured gains: ``experiments/finetune_task2vec.py``.

The probe is numpy and scipy only (its head fitted by L-BFGS, its Fisher in closed form):
``--gains auto`` needs no torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from apportion.errors import InputError
from apportion.inputs import MAX_NPZ_ELEMENTS, read_csv, read_npz

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

    The probe is ``h = tanh(W0 x + b0)`` with ``W0`` drawn once (``seed``) and shared by
    every task of a backbone, on inputs standardised by statistics pooled over the tasks
    compared (:meth:`standardize`: a per-task standardisation would erase the very input
    differences that tell tasks apart). Per task, ``subset`` samples are drawn (the paper
    fixes 500) and a softmax head is fitted to convergence (L-BFGS, L2 ``l2``: a convex
    problem, so the head and the embedding do not depend on an initialisation) on the
    frozen features. The embedding is the diagonal of the true Fisher of the feature
    weights, ``E_x sum_y p(y|x) (d log p(y|x) / d theta)^2``, computed in closed form (the
    expectation over ``y`` exact: no label sampling).

    Why (the scores of every pair were 0.52-0.59 before): the head was fitted by 100 SGD
    steps from a seeded random start and the Fisher was a Monte-Carlo estimate over 4 label
    draws per sample. On separable tasks the head grows confident, ``p(y|x)`` is nearly
    one-hot, and the Fisher is carried by the few uncertain samples: the same task
    embedded on another subset and seed lay 0.2-0.46 away, as far as unrelated tasks, so
    no distance separated related tasks from unrelated ones. The head's L2 keeps
    ``p(y|x)`` calibrated, the exact expectation removes the label noise, and the pooled
    standardisation keeps ``tanh`` out of saturation: the same task on two subsets now
    lies ~0.001 apart, tasks drawn from one distribution ~0.01, unrelated ones 0.1-0.5
    (``tests/test_finetune_estimation.py``). ``fisher_samples`` and ``head_steps`` are kept
    for compatibility (the iteration cap of the head's fit)."""

    def __init__(self, input_dim: int, hidden: int = 32, subset: int = 500,
                 head_steps: int = 100, lr: float = 0.05, seed: int = 0,
                 fisher_samples: int = 4, l2: float = 1e-2) -> None:
        self.input_dim = input_dim
        self.hidden = hidden
        self.subset = subset
        self.head_steps = head_steps
        self.lr = lr
        self.seed = seed
        self.fisher_samples = fisher_samples
        self.l2 = l2
        rng = np.random.default_rng(seed)
        self.w0 = rng.normal(size=(hidden, input_dim)) / np.sqrt(input_dim)
        self.b0 = rng.normal(size=hidden) * 0.1
        self.center_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None

    def standardize(self, tasks: list[TaskData]) -> Task2VecProbe:
        """Input statistics pooled over ``tasks`` (every task compared is embedded in them)."""
        x = np.concatenate([np.asarray(t.x, float) for t in tasks])
        self.center_ = x.mean(axis=0)
        sd = x.std(axis=0)
        self.scale_ = np.where(sd > 0, sd, 1.0)
        return self

    def _features(self, x: np.ndarray) -> np.ndarray:
        center = self.center_ if self.center_ is not None else x.mean(axis=0)
        scale = self.scale_ if self.scale_ is not None else np.where(x.std(axis=0) > 0,
                                                                     x.std(axis=0), 1.0)
        return (x - center) / scale

    def _head(self, h: np.ndarray, y: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
        """The softmax head on frozen features: L2-regularised cross entropy, minimised."""
        from scipy.optimize import minimize

        n, k = h.shape
        onehot = np.eye(classes)[y]

        def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
            v, c = theta[: classes * k].reshape(classes, k), theta[classes * k:]
            z = h @ v.T + c
            z -= z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            p = np.exp(logp)
            f = -float((onehot * logp).sum()) / n + 0.5 * self.l2 * float((v * v).sum())
            d = (p - onehot) / n
            gv = d.T @ h + self.l2 * v
            return f, np.concatenate([gv.ravel(), d.sum(axis=0)])

        res = minimize(loss, np.zeros(classes * (k + 1)), jac=True, method="L-BFGS-B",
                       options={"maxiter": max(50, 4 * self.head_steps)})
        return res.x[: classes * k].reshape(classes, k), res.x[classes * k:]

    def embed(self, task: TaskData, seed: int = 0) -> np.ndarray:
        """Diagonal Fisher of the feature-layer weights for ``task`` (``seed`` picks the subset)."""
        rng = np.random.default_rng(seed)
        n = min(self.subset, len(task.y))
        idx = np.sort(rng.choice(len(task.y), size=n, replace=False))
        x = self._features(np.asarray(task.x, float)[idx])
        y = np.asarray(task.y)[idx]
        h = np.tanh(x @ self.w0.T + self.b0)
        v, c = self._head(h, y, task.num_classes)
        z = h @ v.T + c
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        # d log p(y|x) / d h = v[y] - p @ v; through tanh: times (1 - h^2); the Fisher of
        # W0[i, j] is E_x sum_y p_y (delta_y,i)^2 x_j^2, of b0[i] the same without x_j^2
        mean_v = p @ v  # n x k
        d2 = np.zeros_like(h)
        for yc in range(v.shape[0]):
            delta = (v[yc] - mean_v) * (1.0 - h * h)
            d2 += p[:, yc:yc + 1] * delta * delta
        fisher_w = d2.T @ (x * x) / n
        fisher_b = d2.mean(axis=0)
        return np.concatenate([fisher_w.ravel(), fisher_b]).astype(float)


@dataclass
class TransferabilityEstimator:
    """Alg. 1: embeddings per task (two seeds), temporal and spatial scores, gains."""

    probe: Task2VecProbe
    embeddings_: dict[str, np.ndarray] = field(default_factory=dict)
    reseeded_: dict[str, np.ndarray] = field(default_factory=dict)

    def fit(self, tasks: list[TaskData]) -> TransferabilityEstimator:
        self.probe.standardize(tasks)
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


def override_measured(pred: dict[str, dict[str, float]],
                      measured: dict[str, dict[str, float]] | None) -> None:
    """A pair whose gain was measured keeps the measurement, not the map's guess: kept
    where it paid, filtered where it did not (in place; a spatial pair in either order).
    Without it a pair measured to hurt (Titan's ``* -> sst2``: the target never reached)
    would be tried again on the map's word every time it recurs."""
    for kind, table in (measured or {}).items():
        if kind not in pred:
            continue
        for key, g in table.items():
            keys = [key]
            if kind == "spatial":
                a, _, b = key.partition("||")
                keys.append(f"{b}||{a}")
            for k in keys:
                pred[kind].pop(k, None)
            if float(g) > 0:
                pred[kind][key] = round(float(g), 6)


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


# ---------------------------------------------------------------------------------------
# --gains auto: the task file's samples -> gains
# ---------------------------------------------------------------------------------------
#: fewest samples per task the probe is given (its head and Fisher need a few per class)
MIN_SAMPLES = 20


def _read_samples(p: Path, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` of a task's data file, through the one input reader
    (:mod:`apportion.inputs`: a regular file of at most 4 MB, arrays bounded before they
    are decompressed, no pickles, CSV numbers finite)."""
    src = str(p)
    if p.suffix == ".npz":
        arrays = read_npz(p, ("x", "y"), "Task2Vec data (.npz)")
        return arrays["x"], arrays["y"]
    if p.suffix == ".csv":
        table = read_csv(p, "Task2Vec data (.csv)", required=("label",))
        if not table.rows:
            raise InputError(src, where, "a .csv needs rows of samples under its header")
        if len(table.rows) * len(table.header) > MAX_NPZ_ELEMENTS:
            raise InputError(src, where, f"{len(table.rows)} x {len(table.header)} values; "
                             f"the data may hold {MAX_NPZ_ELEMENTS} together")
        cols = [c for c in table.header if c != "label"]
        y = np.array([r.get("label", "") for r in table.rows])
        x = np.array([[float(table.number(i, c)) for c in cols] for i in range(len(table))],
                     dtype=float).reshape(len(table), len(cols))
        return x, y
    raise InputError(src, where, "data must be a .npz (x, y) or .csv (label, features)")


def load_task_data(path: str | Path, name: str, where: str) -> TaskData:
    """A task's samples: ``.npz`` (arrays ``x``: n x d numbers, ``y``: n labels) or ``.csv``
    (a ``label`` column, every other column a numeric feature). Labels may be any values;
    they are numbered. Problems raise :class:`InputError` naming the file and ``where``."""
    p = Path(path)
    src = str(p)
    if not p.exists():
        raise InputError(src, where, "no such data file (needed by --gains auto)")
    try:
        x, y = _read_samples(p, where)
    except InputError as exc:  # the reader names the data file's place; add the task's field
        if exc.field == where:
            raise
        place = "" if exc.field == "(file)" else f" ({exc.field})"
        raise InputError(exc.source, where, exc.message + place) from None
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y) or x.shape[1] < 1:
        raise InputError(src, where, f"x must be n x d and y n long (got {x.shape}, {y.shape})")
    if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x.astype(float))):
        raise InputError(src, where, "x must hold finite numbers")
    if len(y) < MIN_SAMPLES:
        raise InputError(src, where, f"{len(y)} samples; the probe needs at least {MIN_SAMPLES}")
    classes, labels = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise InputError(src, where, "needs at least two labels (the probe fits a classifier)")
    return TaskData(name, x.astype(np.float32), labels.astype(np.int64))


@dataclass
class AutoGains:
    """Gains predicted by the Task2Vec probe for a task file, and how they were obtained."""

    temporal: dict[str, float]
    spatial: dict[str, float]
    scores: dict[str, dict[str, float]]
    gain_map: dict[str, Any]
    embedded: list[str]
    unavailable: dict[str, str]

    def report(self) -> dict[str, Any]:
        return {"method": "task2vec", "embedded": self.embedded, "unavailable": self.unavailable,
                "scores": self.scores, "gain_map": self.gain_map,
                "predicted": {"temporal": self.temporal, "spatial": self.spatial}}


def auto_gains(tasks: list[tuple[str, Path | None, str]],
               measured: dict[str, dict[str, float]] | None = None,
               probe_kw: dict[str, Any] | None = None) -> AutoGains:
    """Task2Vec gains among ``tasks`` (``(id, data path or None, field name)``).

    Tasks without data are listed in ``unavailable`` (with why) and get no gains;
    fewer than two tasks with data is an :class:`InputError` (nothing to compare).
    ``measured`` (the file's own ``gains``, keys ``A->B`` / ``A||B``) calibrates the
    score-to-gain map when two or more of its pairs have data and distinct scores."""
    unavailable = {tid: "no 'data' field: the Task2Vec probe needs the task's samples "
                        "(x, y) to embed it" for tid, path, _ in tasks if path is None}
    data = [load_task_data(path, tid, where) for tid, path, where in tasks if path is not None]
    if len(data) < 2:
        raise InputError("--gains", "gains", "auto needs 'data' for at least two tasks; "
                         f"missing for: {', '.join(sorted(unavailable)) or '-'}")
    dims = {t.x.shape[1] for t in data}
    if len(dims) > 1:
        where = next(w for tid, p, w in tasks if p is not None and
                     next(d for d in data if d.name == tid).x.shape[1] != data[0].x.shape[1])
        raise InputError(where, "data", f"every task's samples must have the same number of "
                         f"features for one probe; found {sorted(dims)}")
    probe = Task2VecProbe(data[0].x.shape[1], **(probe_kw or {}))
    est = TransferabilityEstimator(probe).fit(data)
    names = [t.name for t in data]
    scores: dict[str, dict[str, float]] = {"temporal": {}, "spatial": {}}
    for i, a in enumerate(names):
        for b in names:
            if a != b:
                scores["temporal"][f"{a}->{b}"] = round(est.temporal_score(a, b), 6)
        for b in names[i + 1:]:
            scores["spatial"][f"{a}||{b}"] = round(est.spatial_score(a, b), 6)
    gmap, info = GainMap(), {"fitted": False}
    pts = [(scores[k][key], float(g)) for k, table in (measured or {}).items()
           if k in scores for key, g in table.items() if key in scores[k]]
    if len({s for s, _ in pts}) >= 2:
        gmap.fit([s for s, _ in pts], [g for _, g in pts])
        info = {"fitted": True, "fitted_on": len(pts)}
    else:
        info["note"] = ("not calibrated: YMIR's default map (a score of 0 saves 30 %, 0.3 breaks "
                        "even); give measured gains for two or more pairs with data to fit it")
        log.info("--gains auto: %s", info["note"])
    info.update(intercept=round(float(gmap.intercept), 6), slope=round(float(gmap.slope), 6),
                max_gain=gmap.max_gain)
    pred = predicted_gains(est, gmap, names)
    override_measured(pred, measured)
    for tid, why in unavailable.items():
        log.info("--gains auto: task %s gets no gains: %s", tid, why)
    return AutoGains(pred["temporal"], pred["spatial"], scores, info, names, unavailable)
