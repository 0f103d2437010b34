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

:func:`auto_gains` is what ``apportion solve-finetune --gains auto`` runs: it reads
each task's samples (:func:`load_task_data`: ``.npz`` with arrays ``x`` and ``y``, or a
``.csv`` with a ``label`` column and numeric feature columns), embeds every task with
one probe, scores every pair, and maps scores to gains — calibrated on the gains the
task file measured, where it gives two or more, else YMIR's default map, said so.

torch is imported lazily so ``apportion.estimation`` imports without it.
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
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the probe's matrices are tiny: threads only contend
        try:
            for t in tasks:
                self.embeddings_[t.name] = self.probe.embed(t, seed=0)
                self.reseeded_[t.name] = self.probe.embed(t, seed=1)
        finally:
            torch.set_num_threads(threads)
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
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("--gains", "gains", "auto needs torch (pip install 'apportion[torch]')"
                         ) from None
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
    for tid, why in unavailable.items():
        log.info("--gains auto: task %s gets no gains: %s", tid, why)
    return AutoGains(pred["temporal"], pred["spatial"], scores, info, names, unavailable)
