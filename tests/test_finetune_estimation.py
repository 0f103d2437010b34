"""YMIR estimators: Task2Vec transferability (real torch on CPU), loss-curve fit, time tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from apportion.estimation.finetune.convergence import (
    LossCurveFit,
    ThroughputTable,
    epochs_to_target,
    iterations_for_mode,
    measured_gain,
)
from apportion.estimation.finetune.transferability import (
    GainMap,
    symmetric_distance,
    synthetic_task,
)

DATA = Path("/work/shared/data/titan-finetune")


def test_symmetric_distance_properties():
    rng = np.random.default_rng(0)
    a, b = rng.random(20), rng.random(20)
    assert symmetric_distance(a, a) == pytest.approx(0.0, abs=1e-12)
    assert symmetric_distance(a, b) == pytest.approx(symmetric_distance(b, a))
    assert 0.0 <= symmetric_distance(a, b) <= 1.0


@pytest.fixture(scope="module")
def estimator():
    pytest.importorskip("torch")
    from apportion.estimation.finetune.transferability import Task2VecProbe, TransferabilityEstimator

    rng = np.random.default_rng(0)
    dim = 8
    base_a, base_c = rng.normal(size=(4, dim)) * 2, rng.normal(size=(4, dim)) * 2
    tasks = [
        synthetic_task("A", dim, 4, 600, 1, base=base_a),
        synthetic_task("A2", dim, 4, 600, 2, base=base_a, shift=0.3),  # related to A
        synthetic_task("C", dim, 4, 600, 3, base=base_c),  # unrelated
    ]
    probe = Task2VecProbe(dim, hidden=16, subset=500, head_steps=100, fisher_samples=8)
    return TransferabilityEstimator(probe).fit(tasks)


def test_related_tasks_score_closer(estimator):
    assert estimator.distance("A", "A2") < estimator.distance("A", "C")
    assert estimator.distance("A", "A2") < estimator.distance("A2", "C")
    assert estimator.temporal_score("A", "A2") < estimator.temporal_score("C", "A2")
    assert estimator.spatial_score("A", "A2") < estimator.spatial_score("A", "C")


def test_gain_mapping_filters_unrelated(estimator):
    from apportion.estimation.finetune.transferability import predicted_gains

    gains = predicted_gains(estimator, GainMap(), ["A", "A2", "C"])
    assert "A||A2" in gains["spatial"] and gains["spatial"]["A||A2"] > 0
    assert "A||C" not in gains["spatial"] and "A2||C" not in gains["spatial"]
    assert all(g > 0 for kind in gains.values() for g in kind.values())


def test_embedding_is_deterministic(estimator):
    t = synthetic_task("A", 8, 4, 600, 1, base=np.ones((4, 8)))
    e1, e2 = estimator.probe.embed(t, seed=0), estimator.probe.embed(t, seed=0)
    assert np.allclose(e1, e2)
    assert e1.shape == (16 * 8 + 16,) and np.all(e1 >= 0)


def test_gain_map_fit_is_monotone():
    gm = GainMap().fit([0.0, 0.1, 0.2, 0.4], [0.5, 0.4, 0.3, 0.1])
    assert gm.predict(0.0) > gm.predict(0.3)
    assert gm.predict(0.1) == pytest.approx(0.4, abs=1e-6)


def _curve(k):
    return 1.0 / (0.02 * k + 2.0) + 0.1 + 0.8 * np.exp(-0.05 * k)


def test_loss_curve_fit_predicts_iterations():
    k = np.arange(0, 200, 4, dtype=float)
    y = _curve(k) + np.random.default_rng(1).normal(0, 0.002, k.size)
    fit = LossCurveFit().fit(k, y)
    target = float(_curve(np.array([600.0]))[0])
    pred = fit.iterations_to(target)
    assert pred == pytest.approx(600, rel=0.15)
    plain = LossCurveFit(extra_term=False).fit(k, y)
    assert fit.rmse_ < plain.rmse_  # the extra term fits the fast early drop


def test_iterations_for_mode_table9():
    assert iterations_for_mode("temporal", 10, 0.3) == pytest.approx(7)
    assert iterations_for_mode("spatial", 10, 0.6, partner_iters=10) == pytest.approx(4)
    assert iterations_for_mode("normal", 10) == 10
    with pytest.raises(ValueError):
        iterations_for_mode("spatial", 10, 0.5)


def test_measured_gain_and_epochs():
    assert epochs_to_target([0.5, 0.7, 0.9], 0.7) == 2
    assert epochs_to_target([0.5, 0.6], 0.7) is None
    assert measured_gain(10, 7) == pytest.approx(0.3)
    assert measured_gain(10, None) < 0


@pytest.mark.skipif(not DATA.is_dir(), reason="titan-finetune data not present")
def test_throughput_table_from_profiles():
    tab = ThroughputTable.from_fminfo(DATA / "fminfo/V100", "roberta-base")
    t1 = tab.iteration_time(1, 128)
    t4 = tab.iteration_time(4, 128)
    assert 0 < t4 < t1  # data parallelism helps a 128-sample batch
    assert tab.duration(100, 4, 128) == pytest.approx(100 * t4)
    assert tab.step_time(3, 16) > 0  # interpolated GPU count
