"""The objective's ablation (experiments/objective_ablation.py): every variant is a real
objective that differs from its base in the knobs it names, and the table pairs seeds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from apportion.experiments import objective_ablation as ab
from apportion.formulations.objectives import ObjectiveOptions


def test_every_variant_changes_only_the_knobs_it_names() -> None:
    table = ab.variants()
    fields = {f.name for f in dataclasses.fields(ObjectiveOptions)}
    for terms, base in ((ab.LEAVE_OUT, "apportion"), (ab.ADD_ONE, "seconds"),
                        (ab.CANDIDATE_OUT, "candidate")):
        for name, (_, knobs) in terms.items():
            assert set(knobs) <= fields, name
            changed = {f for f in fields
                       if getattr(table[name], f) != getattr(table[base], f)}
            assert changed and changed <= set(knobs), name
    # the tables' ``apportion`` is the tuned objective they ablate; their ``candidate`` is
    # apportion's default now
    assert table["apportion"] == ObjectiveOptions.preset("jct-aware")
    assert table["candidate"] == ObjectiveOptions.preset("apportion")
    assert table["seconds"].kind == "seconds"


def _seed(root: Path, seed: int, avg: float, p99: float) -> None:
    d = root / f"apportion-s{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"avg_jct_s": avg, "p99_jct_s": p99}))
    (root / "summary.csv").write_text("policy\n")


def test_the_table_pairs_each_variant_with_its_base_seed_by_seed(tmp_path: Path) -> None:
    row = "gavel-mmf-estimated"
    for s, (a, b) in enumerate([(100.0, 110.0), (200.0, 220.0), (300.0, 330.0)]):
        _seed(tmp_path / row / "apportion", s, a, 2 * a)
        _seed(tmp_path / row / "no-keep-bonus", s, b, 2 * a)
        _seed(tmp_path / row / "seconds", s, a, 2 * a)
    text = ab.table(tmp_path)
    # +10 % on every seed: a zero-width interval, in bold; the p99 unchanged
    assert "| no-keep-bonus | the keep bonus 0.2 | **+10.0 ± 0.0 %** (p99 +0.0 %) |" in text
    assert "| seconds | every further term (the one quantity alone) | +0.0 ± 0.0 %" in text
    assert "| plus-pin | the pinned band (1.5 %-0.75 % quantiles) | - |" in text
    assert ab._paired({0: {"x": 1.0}}, {0: {"x": 1.5}}, "x") == pytest.approx((0.5, 0.0))


def test_the_default_check_pairs_each_policy_of_a_row_seed_by_seed(tmp_path: Path) -> None:
    """experiments/objective_default.py: every quality row's policies of apportion's, the
    default against a candidate, per seed; each variant is a real objective."""
    from apportion.experiments import objective_default as od

    row = "gavel-mmf-oracle"  # apportion, apportion-plans and apportion-na; one seed
    for variant, scale in (("apportion", 1.0), ("seconds-amortized", 0.9)):
        for pol in od.ROWS[row].policies:
            d = tmp_path / row / variant / f"{pol}-s0"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(
                {"avg_jct_s": 3600.0 * scale, "p99_jct_s": 7200.0, "avg_restarts": 1.0}))
        (tmp_path / row / variant / "summary.csv").write_text("policy\n")
    text = od.table(tmp_path, other="seconds-amortized")
    for pol in od.ROWS[row].policies:
        assert f"| {row} | {pol} | 1 | 1.000 | 2.00 | -10.00 % | +0.00 % | 1.00 / 1.00 |" in text
    assert set(od.VARIANTS) >= {"apportion", "seconds"}
    assert all(isinstance(v, ObjectiveOptions) for v in od.VARIANTS.values())
    assert od.VARIANTS["seconds-amortized"].amortize_s == 1800.0
