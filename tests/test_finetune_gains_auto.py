"""`solve-finetune --gains auto`: Task2Vec gains from each task's samples (real torch on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from apportion.estimation.transferability import synthetic_task
from apportion.solvers.finetune_validator import validate_finetune_answer
from typer.testing import CliRunner

from apportion.cli import app
from apportion.finetune_spec import load_finetune_problem, parse_finetune_problem

pytest.importorskip("torch")
runner = CliRunner()
DIM = 8


def _write(folder: Path, name: str, fmt: str, base: np.ndarray, seed: int,
           shift: float = 0.0) -> str:
    t = synthetic_task(name, DIM, 4, 600, seed, base=base, shift=shift)
    if fmt == "npz":
        np.savez(folder / f"{name}.npz", x=t.x, y=t.y)
        return f"{name}.npz"
    lines = ["label," + ",".join(f"f{k}" for k in range(DIM))]
    lines += [f"c{y}," + ",".join(f"{v:.5f}" for v in row) for row, y in zip(t.x, t.y)]
    (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return f"{name}.csv"


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    base_a, base_c = rng.normal(size=(4, DIM)) * 2, rng.normal(size=(4, DIM)) * 2
    data = tmp_path / "data"
    data.mkdir()
    files = {"A": _write(data, "A", "npz", base_a, 1),
             "A2": _write(data, "A2", "npz", base_a, 2, shift=0.3),  # related to A
             "C": _write(data, "C", "csv", base_c, 3)}  # unrelated
    tasks = [{"id": "A", "epochs": 10, "epoch_time_1gpu": 1, "max_gpus": 2,
              "data": f"data/{files['A']}"},
             {"id": "A2", "epochs": 10, "epoch_time_1gpu": 2, "max_gpus": 2,
              "data": f"data/{files['A2']}"},
             {"id": "C", "epochs": 10, "epoch_time_1gpu": 1.5, "max_gpus": 2,
              "data": f"data/{files['C']}"},
             {"id": "D", "epochs": 4, "epoch_time_1gpu": 1, "max_gpus": 1}]
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump({"tasks": tasks}))
    return tmp_path


def _solve(path: Path, *extra: str) -> tuple[int, dict, str]:
    out = path.parent / "out.json"
    res = runner.invoke(app, ["solve-finetune", "--tasks", str(path), "--capacity", "3",
                              "--time-budget", "2", "--json", str(out), *extra])
    data = json.loads(out.read_text()) if out.exists() else {}
    return res.exit_code, data, res.output


def test_auto_gains_rank_related_tasks_and_the_answer_validates(task_dir):
    code, out, text = _solve(task_dir / "tasks.yaml", "--gains", "auto")
    assert code == 0, text
    auto = out["gains_auto"]
    assert auto["embedded"] == ["A", "A2", "C"]
    assert "D" in auto["unavailable"] and "data" in auto["unavailable"]["D"]
    assert "no gains for task D" in text and "not calibrated" in text
    sc = auto["scores"]
    assert sc["spatial"]["A||A2"] < sc["spatial"]["A||C"]
    assert sc["temporal"]["A->A2"] < sc["temporal"]["C->A2"]
    gains = out["gains"]
    assert gains["spatial"]["A||A2"] > gains["spatial"].get("A||C", 0.0)
    assert not any("D" in k for kind in gains.values() for k in kind)  # D: no guess
    assert auto["gain_map"]["fitted"] is False
    # every gain the solver used is in the problem it solved: re-validate the answer
    problem = load_finetune_problem(task_dir / "tasks.yaml")
    raw = {"tasks": [{"id": t.id, "epochs": float(t.epochs),
                      "epoch_time_1gpu": float(t.epoch_time_1gpu), "max_gpus": t.max_gpus}
                     for t in problem.tasks], "gains": gains}
    check = validate_finetune_answer(parse_finetune_problem(raw), 3, out)
    assert check.ok, check.errors
    # without --gains auto the file's (empty) gains are all there is
    code, plain, _ = _solve(task_dir / "tasks.yaml")
    assert code == 0 and "gains_auto" not in plain
    assert all(t["mode"] == "normal" for t in plain["tasks"].values())


def test_measured_gains_calibrate_the_map_and_are_kept(task_dir):
    path = task_dir / "tasks.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["gains"] = {"temporal": {"A->A2": 0.5, "C->A2": 0.05}}
    path.write_text(yaml.safe_dump(spec))
    code, out, text = _solve(path, "--gains", "auto")
    assert code == 0, text
    gm = out["gains_auto"]["gain_map"]
    assert gm["fitted"] is True and gm["fitted_on"] == 2
    assert out["gains"]["temporal"]["A->A2"] == 0.5  # the file's measurement wins
    assert "A->A2" not in out["gains_auto"]["added"]["temporal"]


@pytest.mark.parametrize("case", ["no-data", "one-task", "missing-file", "no-y", "dims",
                                  "one-label", "bad-flag"])
def test_auto_gains_refuses_what_it_cannot_compute(task_dir, case):
    path = task_dir / "tasks.yaml"
    spec = yaml.safe_load(path.read_text())
    flag = ["--gains", "auto"]
    want = "tasks[0].data"
    if case == "no-data":
        for t in spec["tasks"]:
            t.pop("data", None)
        want = "--gains"
    elif case == "one-task":
        for t in spec["tasks"][1:]:
            t.pop("data", None)
        want = "--gains"
    elif case == "missing-file":
        spec["tasks"][0]["data"] = "data/nope.npz"
    elif case == "no-y":
        np.savez(task_dir / "data" / "A.npz", x=np.zeros((50, DIM)))
    elif case == "dims":
        np.savez(task_dir / "data" / "A.npz", x=np.zeros((50, DIM + 1)), y=np.arange(50) % 2)
        want = "data"
    elif case == "one-label":
        np.savez(task_dir / "data" / "A.npz", x=np.zeros((50, DIM)), y=np.zeros(50))
    else:
        flag = ["--gains", "guess"]
        want = "--gains"
    path.write_text(yaml.safe_dump(spec))
    code, out, text = _solve(path, *flag)
    assert code == 2, text
    assert want in text and out == {}
