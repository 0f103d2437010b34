"""Submission YAML (figure 14) and solve-finetune task-file validation: errors name the field."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from apportion.errors import InputError
from apportion.finetune_spec import load_finetune_problem, load_submissions

GOOD_TASKS = {
    "tasks": [
        {"id": "A", "epochs": 10, "epoch_time_1gpu": 1, "max_gpus": 2},
        {"id": "B", "epochs": 10, "epoch_time_1gpu": 2, "max_gpus": 2},
    ],
    "gains": {"temporal": {"A->B": 0.3}, "spatial": {"A||B": 0.6}},
}

SUBMISSION = {
    "name": "rte-ft",
    "model": "roberta-base",
    "dataset": "/data/glue/rte",
    "batch_size": 16,
    "learning_rate": 1e-4,
    "accept_sharing": True,
    "target": {"metric": "accuracy", "value": 0.71},
    "gpus": 1,
}


def _write(tmp_path, data, name="f.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_task_file_parses_exact(tmp_path):
    prob = load_finetune_problem(_write(tmp_path, GOOD_TASKS))
    assert prob.ids == ["A", "B"]
    assert prob.temporal[("A", "B")] == Fraction(3, 10)
    assert prob.spatial[frozenset("AB")] == Fraction(3, 5)
    assert prob.task("B").work == 20


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d["tasks"][1].update(max_gpus=0), "tasks[1].max_gpus"),
        (lambda d: d["tasks"][1].update(max_gpus=1.5), "tasks[1].max_gpus"),
        (lambda d: d["tasks"][0].update(epochs=-1), "tasks[0].epochs"),
        (lambda d: d["tasks"][0].update(epoch_time_1gpu="fast"), "tasks[0].epoch_time_1gpu"),
        (lambda d: d["tasks"][0].pop("id"), "tasks[0].id"),
        (lambda d: d["tasks"][1].update(id="A"), "tasks[1].id"),
        (lambda d: d["tasks"][0].update(colour="red"), "tasks[0].colour"),
        (lambda d: d.update(tasks=[]), "tasks"),
        (lambda d: d["gains"]["temporal"].update({"A->Z": 0.1}), "gains.temporal.A->Z"),
        (lambda d: d["gains"]["temporal"].update({"A->A": 0.1}), "gains.temporal.A->A"),
        (lambda d: d["gains"]["spatial"].update({"A||B": 1.5}), "gains.spatial.A||B"),
        (lambda d: d["gains"]["spatial"].update({"B||A": 0.2}), "gains.spatial.B||A"),
        (lambda d: d["gains"].update(diagonal={}), "gains.diagonal"),
        (lambda d: d["gains"]["temporal"].update({"AB": 0.1}), "gains.temporal.AB"),
    ],
)
def test_task_file_errors_name_the_field(tmp_path, mutate, field):
    import copy

    data = copy.deepcopy(GOOD_TASKS)
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as exc:
        load_finetune_problem(path)
    assert exc.value.field == field
    assert exc.value.source == path


def test_task_file_missing_and_garbage(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_finetune_problem(str(tmp_path / "none.yaml"))
    p = tmp_path / "bad.yaml"
    p.write_text("tasks: [unclosed")
    with pytest.raises(InputError, match="YAML"):
        load_finetune_problem(str(p))
    p.write_text("- 1\n- 2\n")
    with pytest.raises(InputError):
        load_finetune_problem(str(p))


def test_submission_single_and_list(tmp_path):
    subs = load_submissions(_write(tmp_path, SUBMISSION))
    assert subs[0].backbone == "roberta-base" and subs[0].task == "rte"
    assert subs[0].accept_sharing and subs[0].target.value == 0.71
    two = {"workloads": [SUBMISSION, dict(SUBMISSION, name="rte-2", gpus=4)]}
    assert [s.gpus for s in load_submissions(_write(tmp_path, two))] == [1, 4]


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.update(batch_size=0), "batch_size"),
        (lambda d: d.update(learning_rate=2.0), "learning_rate"),
        (lambda d: d.pop("dataset"), "dataset"),
        (lambda d: d["target"].pop("metric"), "target.metric"),
        (lambda d: d.update(gpus=0), "gpus"),
        (lambda d: d.update(unknown=1), "unknown"),
    ],
)
def test_submission_errors_name_the_field(tmp_path, mutate, field):
    import copy

    data = copy.deepcopy(SUBMISSION)
    mutate(data)
    with pytest.raises(InputError) as exc:
        load_submissions(_write(tmp_path, data))
    assert exc.value.field == field
    data = {"workloads": [SUBMISSION, data]}
    with pytest.raises(InputError) as exc:
        load_submissions(_write(tmp_path, data, "w.yaml"))
    assert exc.value.field == f"workloads[1].{field}"


def test_submission_duplicate_names(tmp_path):
    with pytest.raises(InputError) as exc:
        load_submissions(_write(tmp_path, {"workloads": [SUBMISSION, SUBMISSION]}))
    assert exc.value.field == "workloads[1].name"
