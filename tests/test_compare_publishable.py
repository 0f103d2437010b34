"""`compare`'s plots and tables need no editing: titles (trace, cluster, seeds, information
mode), hours, bootstrap bands that stay physical, a band on the JCT CDF, `n/a` where one seed
gives no interval, the best value of each column marked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from apportion.experiments.plots import bootstrap_band, figures, fmt
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()


def compare(tmp: Path, seeds: int, policies: str = "fcfs,sia") -> Path:
    r = runner.invoke(app, ["compare", "--trace", "synthetic:10", "--cluster", "crius-testbed",
                            "--policies", policies, "--seeds", str(seeds), "--out", str(tmp),
                            "--information", "oracle", "--workers", "1"])
    assert r.exit_code == 0, r.output
    return next(p for p in tmp.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compare(tmp_path_factory.mktemp("cmp2"), 2)


def test_bootstrap_bands_stay_physical_where_students_t_did_not() -> None:
    # a queue that is empty in two seeds and 6 deep in the third: Student's t with 3 seeds
    # gives a band below zero; the bootstrap band of the mean stays within [0, 6]
    from scipy import stats

    ys = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [6.0, 6.0, 0.0]])
    t_half = stats.t.ppf(0.975, 2) * ys.std(axis=0, ddof=1) / np.sqrt(3)
    assert (ys.mean(axis=0) - t_half)[0] < -6  # the old band: -6.6 queued jobs
    mean, lo, hi = bootstrap_band(ys, 0.0, None)
    assert lo is not None and hi is not None
    assert (lo >= 0).all() and (lo <= mean).all() and (mean <= hi).all() and (hi <= 6).all()
    util = np.array([[1.0, 0.9], [1.0, 0.2]])
    _, lo, hi = bootstrap_band(util, 0.0, 1.0)
    assert (hi <= 1.0).all() and (lo >= 0.0).all()
    one = bootstrap_band(np.array([[1.0, 2.0]]))
    assert one[1] is None and one[2] is None  # one seed: no interval, and none drawn
    again = bootstrap_band(ys, 0.0, None)
    assert all((a == b).all() for a, b in zip(again[1:], bootstrap_band(ys, 0.0, None)[1:]))


def test_numbers_are_plain_never_scientific() -> None:
    assert [fmt(x) for x in (0.000556, 12.345, 4567.8, 0.0, 1e-7)] == [
        "0.000556", "12.3", "4568", "0", "0.0000001"]


def test_two_seed_table_in_hours_with_the_best_in_bold(two_seeds: Path) -> None:
    md = (two_seeds / "summary.md").read_text()
    head = md.split("\n\n")[0]
    assert head.startswith("information: oracle")
    assert "trace: synthetic-n10;" in head and "cluster: crius-testbed" in head
    assert "seeds: 2" in head
    csv = pd.read_csv(two_seeds / "summary.csv")
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in table[2:]}
    col = header.index("avg JCT (h)")
    for _, r in csv.iterrows():
        cell = rows[r["policy"]][col].strip("*")
        mean, ci = cell.split(" ± ")
        assert float(mean) == pytest.approx(r["avg_jct_s"] / 3600, rel=5e-3)
        assert float(ci) == pytest.approx(r["avg_jct_s_ci95"] / 3600, rel=5e-3)
        assert "e-" not in cell and "e+" not in cell
    best = csv.loc[csv["avg_jct_s"].idxmin(), "policy"]
    assert rows[best][col].startswith("**") and rows[best][col].endswith("**")
    other = next(p for p in rows if p != best)
    assert not rows[other][col].startswith("**")
    assert "makespan (h)" in header and "utilisation (%)" in header
    assert {"avg_jct_s", "avg_jct_s_ci95", "seeds"} <= set(csv.columns)  # the CSV keeps seconds


def test_two_seed_plots_have_titles_and_physical_bands(two_seeds: Path) -> None:
    data = json.loads((two_seeds / "plots.json").read_text())
    assert data["title"] == "synthetic-n10 on crius-testbed — oracle information, 2 seeds"
    for name in ("jct_cdf", "throughput", "queue", "utilization"):
        assert set(data[name]) == {"fcfs", "sia"}, name
        for s in data[name].values():
            mean, lo, hi = (np.array(s[k]) for k in ("mean", "lo", "hi"))
            assert s["seeds"] == 2
            assert (lo >= 0).all() and (lo <= mean + 1e-9).all() and (mean <= hi + 1e-9).all()
            if name == "utilization":
                assert (hi <= 1.0).all()
    figs = figures(two_seeds, ["fcfs", "sia"], 2)
    for name in ("jct_cdf", "throughput", "queue", "utilization", "utilization_by_type"):
        ax = figs[name].axes[0]
        assert ax.get_title() == data["title"], name
        if name != "utilization_by_type":
            assert ax.collections, name  # the bands, JCT CDF's included
            for poly in ax.collections:
                verts = np.concatenate([p.vertices for p in poly.get_paths()])
                axis = 0 if name == "jct_cdf" else 1  # the CDF's band is along JCT
                assert (verts[:, axis] >= -1e-9).all(), name
            assert "h)" in ax.get_xlabel()
    assert "JCT (h)" == figs["jct_cdf"].axes[0].get_xlabel()
    for png in ("jct_cdf", "throughput", "queue", "utilization"):
        assert (two_seeds / f"{png}.png").stat().st_size > 0


def test_one_seed_says_n_a_and_draws_no_band(tmp_path: Path) -> None:
    root = compare(tmp_path, 1, "fcfs")
    md = (root / "summary.md").read_text()
    assert "± n/a" in md and "± 0" not in md
    assert "seeds: 1" in md
    data = json.loads((root / "plots.json").read_text())
    assert data["title"].endswith("oracle information, 1 seed")
    assert all(s["lo"] is None and s["hi"] is None
               for name in ("jct_cdf", "queue", "utilization") for s in data[name].values())
    figs = figures(root, ["fcfs"], 1)
    ax = figs["queue"].axes[0]
    assert not ax.collections
    assert re.search(r"1 seed, no band", ax.get_legend().get_texts()[0].get_text())


def test_every_figure_is_a_vector_too_and_lines_differ_beyond_colour(two_seeds: Path) -> None:
    """PNG, PDF and SVG of each figure; each policy's line its own style and marker, so two
    curves that coincide stay apart (and the figure reads in grey)."""
    import xml.etree.ElementTree as ET

    for name in ("jct_cdf", "throughput", "queue", "utilization", "utilization_by_type"):
        assert (two_seeds / f"{name}.pdf").read_bytes().startswith(b"%PDF"), name
        assert ET.parse(two_seeds / f"{name}.svg").getroot().tag.endswith("svg"), name
        assert (two_seeds / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
    figs = figures(two_seeds, ["fcfs", "sia"], 2)
    for name in ("jct_cdf", "throughput", "queue", "utilization"):
        lines = figs[name].axes[0].get_lines()
        looks = {(ln.get_linestyle(), ln.get_marker()) for ln in lines}
        assert len(lines) == 2 and len(looks) == 2, name


def test_titles_name_the_public_data_set() -> None:
    from apportion.experiments.plots import title
    from apportion.experiments.trace_names import public_name

    assert public_name("simulate_trace_venus[:100]") == \
        "Crius's Venus trace (SenseTime Helios), first 100 jobs"
    assert public_name("philly[0:86400]") == \
        "Microsoft Philly (Jeon et al., ATC'19), window 0:86400 s"
    assert public_name("synthetic-n10") == "synthetic-n10"  # a generated family: as it is
    info = {"trace": "FM-1-roberta-base", "cluster": "titan-4x8", "information": "oracle",
            "seeds": 3}
    assert title(info) == "YMIR's FM-1 (RoBERTa-base) on titan-4x8 — oracle information, 3 seeds"


def test_a_load_sweep_through_compare(tmp_path: Path) -> None:
    """``compare --load``: a comparison per load on the same jobs arriving that many times as
    fast, the sweep's table and its JCT-against-load figure in three formats."""
    r = runner.invoke(app, ["compare", "--trace", "synthetic:8", "--cluster", "crius-testbed",
                            "--policies", "fcfs,sia", "--seeds", "1", "--out", str(tmp_path),
                            "--information", "oracle", "--workers", "1", "--load", "2,1",
                            "--run", "sweep"])
    assert r.exit_code == 0, r.output
    root = tmp_path / "sweep"
    table = pd.read_csv(root / "load_sweep.csv")
    assert sorted(zip(table["load"], table["policy"])) == [
        (1.0, "fcfs"), (1.0, "sia"), (2.0, "fcfs"), (2.0, "sia")]
    once, twice = (pd.read_csv(root / f"load-{x}" / "fcfs-s0" / "jobs.csv")
                   .sort_values("job_id") for x in (1, 2))
    assert np.allclose(twice["submit_s"].to_numpy(), once["submit_s"].to_numpy() / 2)
    for x in (1, 2):
        summ = json.loads((root / f"load-{x}" / "sia-s0" / "summary.json").read_text())
        assert table.loc[(table["load"] == x) & (table["policy"] == "sia"),
                         "avg_jct_s"].iloc[0] == pytest.approx(summ["avg_jct_s"])
    md = (root / "load_sweep.md").read_text()
    assert "| policy | 1x | 2x |" in md and md.count("**") >= 4
    assert md in r.output.replace("\r", "") or "Average JCT (h) against load" in r.output
    for ext in ("png", "pdf", "svg"):
        assert (root / f"jct_vs_load.{ext}").stat().st_size > 0
    for bad in ("0", "1,1", "x", ",", "1e9"):
        r = runner.invoke(app, ["compare", "--trace", "synthetic:8", "--cluster",
                                "crius-testbed", "--policies", "fcfs", "--out",
                                str(tmp_path / "bad"), "--load", bad])
        assert r.exit_code == 2 and "--load" in r.output, (bad, r.output)
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
