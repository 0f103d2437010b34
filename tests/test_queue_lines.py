"""Queues past one YAML file: JSON lines streamed through `solve-round --jobs` and `submit`,
the reader's limits following what the queue declares (or `--max-input-bytes`), the
memory guard still in front of both, and the YAML alias budget following the document's
size. Every refusal is exit 2 naming the file, the line and the job's field, with
nothing written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from apportion.experiments.bench.rounds import write_instance
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli.app import app
from apportion.config import (
    JOBS_LINES_BYTES_PER_JOB,
    MAX_JOBS_LINES_BYTES,
    declared_jobs,
    jobs_lines_limit,
    load_queue,
    queue_format,
)
from apportion.inputs import MAX_FILE_BYTES, MAX_LINE_BYTES, iter_lines
from apportion.memory_guard import MEMORY_ENV

runner = CliRunner()

JOB = {"id": "j1", "model": "bert-1.3b", "global_batch_size": 256, "iterations": 20000,
       "requested_gpus": 4}


def _lines(path: Path, *objs: object, header: dict[str, object] | None = None) -> Path:
    rows = ([{"format": "apportion-jobs", **header}] if header is not None else []) + list(objs)
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in rows))
    return path


def _job(i: int, **kw: object) -> dict[str, object]:
    return {**JOB, "id": f"j{i}", **kw}


def test_a_json_lines_queue_is_the_yaml_queue(tmp_path: Path) -> None:
    """The same queue written both ways loads as the same jobs and clock; the format is told
    by the name or by the header, never by guessing."""
    (tmp_path / "y").mkdir()
    (tmp_path / "l").mkdir()
    _, y = write_instance(60, 128, 3, 2, tmp_path / "y", "yaml")
    _, j = write_instance(60, 128, 3, 2, tmp_path / "l", "jsonl")
    assert (queue_format(y), queue_format(j)) == ("yaml", "jsonl")
    qy, qj = load_queue(y), load_queue(j)
    assert qy.jobs == qj.jobs and qy.now_s == qj.now_s == 36000.0
    assert qy.timed == qj.timed == [True] * 60
    assert declared_jobs(j) == 60 and declared_jobs(y) is None
    # each line is what `apportion schema jobs-lines-header` / `jobs-line` describe
    from tests.test_schema_cmd import check

    first, *rest = j.read_text().splitlines()
    assert check("jobs-lines-header", json.loads(first)) == []
    assert all(check("jobs-line", json.loads(line)) == [] for line in rest)
    # a header alone tells the format, whatever the file is called
    renamed = tmp_path / "queue.txt"
    renamed.write_bytes(j.read_bytes())
    assert queue_format(renamed) == "jsonl" and load_queue(renamed).jobs == qj.jobs


def test_solve_round_decides_a_json_lines_queue_as_its_yaml(tmp_path: Path) -> None:
    jobs = [_job(i, requested_gpus=[1, 2, 4][i % 3], submit_time_s=float(i)) for i in range(8)]
    lines = _lines(tmp_path / "q.jsonl", *jobs, header={"jobs": 8, "now_s": 100})
    ydoc = tmp_path / "q.yaml"
    ydoc.write_text(yaml.safe_dump({"now_s": 100, "jobs": jobs}))
    out = []
    for q in (lines, ydoc):
        res = tmp_path / f"{q.suffix[1:]}.json"
        r = runner.invoke(app, ["solve-round", "--jobs", str(q), "--deterministic",
                                "--time-budget", "5", "--json", str(res)])
        assert r.exit_code == 0, r.output
        d = json.loads(res.read_text())
        out.append((d["allocations"], d["pending"], d["solver"]["objective"]))
    assert out[0] == out[1]


BAD = [
    # (lines after an optional header, header, field named, message)
    ([_job(0), _job(1)], {"jobs": 3}, "(file)", "declares 3 jobs but the file holds 2"),
    ([_job(0), _job(1)], {"jobs": 1}, "line 3", "more jobs than the 1 the header declares"),
    ([_job(0), _job(1, requested_gpus=0)], None, "line 2, jobs[1].requested_gpus",
     "greater than 0"),
    ([_job(0), _job(1, colour="red")], None, "line 2, jobs[1].colour", "unknown field"),
    ([_job(0), _job(0)], None, "line 2, jobs[1].id", "duplicate job id 'j0'"),
    ([_job(0), '{"id": "j1", "iterations": NaN}'], None, "line 2", "NaN is not a number"),
    ([_job(0), '{"id": "j1",'], None, "line 2, column", "malformed JSON"),
    (['[1, 2]'], None, "line 1, jobs[0]", "expected a mapping"),
    ([_job(0), {"format": "apportion-jobs"}], None, "line 2", "only read as the file's first"),
    ([_job(0)], {"jobs": -1}, "line 1 (header).jobs", "greater than or equal to 0"),
    ([_job(0)], {"jobs": 1, "version": 2}, "line 1 (header).version", "1"),
    ([_job(0)], {"jobs": 1, "now_s": 1e999}, "line 1", "Infinity"),
]


@pytest.mark.parametrize(("rows", "header", "field", "message"), BAD)
def test_a_bad_line_is_refused_naming_its_line_and_field_and_nothing_is_written(
        tmp_path: Path, rows: list[object], header: dict[str, object] | None, field: str,
        message: str) -> None:
    q = _lines(tmp_path / "bad.jsonl", *rows, header=header)
    out, db = tmp_path / "d.json", tmp_path / "s.db"
    r = runner.invoke(app, ["solve-round", "--jobs", str(q), "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert f"bad.jsonl: {field}" in r.output and message in r.output, r.output
    assert not out.exists()
    r = runner.invoke(app, ["submit", str(q), "--state", str(db)])
    assert r.exit_code == 2 and field in r.output and message in r.output, r.output
    assert not db.exists()


def test_files_a_line_reader_refuses(tmp_path: Path) -> None:
    long_line = tmp_path / "long.jsonl"
    long_line.write_text(json.dumps(_job(0)) + "\n" + json.dumps(
        _job(1, tenant="x" * MAX_LINE_BYTES)) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(_job(0)).encode() + b"\n" + b'{"id": "caf\xe9"}\n')
    for f, field, message in ((long_line, "line 2", f"at most {MAX_LINE_BYTES}"),
                              (empty, "(file)", "an empty file"),
                              (latin, "line 2", "not UTF-8")):
        r = runner.invoke(app, ["solve-round", "--jobs", str(f)])
        assert r.exit_code == 2 and f"{f.name}: {field}: " in r.output, r.output
        assert message in r.output, r.output


@settings(max_examples=40, deadline=None)
@given(text=st.binary(max_size=300), limit=st.integers(8, 64))
def test_the_line_reader_gives_every_line_or_refuses_by_name(text: bytes, limit: int) -> None:
    """Whatever the bytes: the lines back as written (a last line without its newline too),
    or an InputError naming the line that is too long or not UTF-8; never anything else."""
    import tempfile

    from apportion.errors import InputError

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "x.jsonl"
        f.write_bytes(text)
        try:
            got = list(iter_lines(f, max_bytes=1000, max_line_bytes=limit))
        except InputError as exc:
            assert exc.field.startswith("line ")
            return
        want = text.split(b"\n")
        if want and want[-1] == b"":
            want.pop()
        assert [t for _, t in got] == [w.removesuffix(b"\r").decode() for w in want]
        assert [n for n, _ in got] == list(range(1, len(want) + 1))


def test_the_limits_follow_the_declared_count(tmp_path: Path) -> None:
    assert jobs_lines_limit(None) == MAX_JOBS_LINES_BYTES
    assert jobs_lines_limit(100_000) == 100_000 * JOBS_LINES_BYTES_PER_JOB
    # a file over its limit is refused before it is read: here a tiny limit by the option
    q = _lines(tmp_path / "q.jsonl", _job(0), _job(1), header={"jobs": 2})
    r = runner.invoke(app, ["solve-round", "--jobs", str(q), "--max-input-bytes", "100"])
    assert r.exit_code == 2 and "limited to 100 bytes" in r.output, r.output


def test_a_declared_queue_too_large_for_the_machine_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header's count is all the memory guard needs: ten million declared jobs are
    refused from the first line (the rest of the file is never read)."""
    monkeypatch.setenv(MEMORY_ENV, "2GiB")
    q = _lines(tmp_path / "huge.jsonl", _job(0), header={"jobs": 10_000_000})
    r = runner.invoke(app, ["solve-round", "--jobs", str(q)])
    assert r.exit_code == 2, r.output
    assert "a round of 10,000,000 jobs" in r.output and MEMORY_ENV in r.output


def test_a_queue_file_the_machine_cannot_hold_once_read_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "1MiB")
    q = _lines(tmp_path / "q.jsonl", *[_job(i) for i in range(300)])  # 36 KB: 1.4 MB read
    r = runner.invoke(app, ["submit", str(q), "--state", str(tmp_path / "s.db")])
    assert r.exit_code == 2 and "reading this queue" in r.output, r.output
    assert not (tmp_path / "s.db").exists()


def test_max_input_bytes_lifts_the_yaml_limit_and_nothing_else(tmp_path: Path) -> None:
    """A YAML queue over 4 MiB (here a long comment: cheap to parse) is refused naming the
    limit, and read with --max-input-bytes; a bad size, or the option where no file is
    read, is refused naming it."""
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (MAX_FILE_BYTES + 10) + "\n" + yaml.safe_dump(
        {"now_s": 10, "jobs": [_job(0), _job(1)]}))
    r = runner.invoke(app, ["solve-round", "--jobs", str(big), "--time-budget", "3"])
    assert r.exit_code == 2 and f"limited to {MAX_FILE_BYTES} bytes" in r.output, r.output
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--jobs", str(big), "--time-budget", "3",
                            "--max-input-bytes", "8MiB", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert len(json.loads(out.read_text())["allocations"]) == 2
    db = tmp_path / "s.db"
    r = runner.invoke(app, ["submit", str(big), "--state", str(db), "--max-input-bytes", "8MiB"])
    assert r.exit_code == 0 and "submitted 2 jobs" in r.output, r.output
    for extra in (["--jobs", str(big), "--max-input-bytes", "8 parsecs"],
                  ["--state", str(db), "--max-input-bytes", "8MiB"]):
        r = runner.invoke(app, ["solve-round", *extra])
        assert r.exit_code == 2 and "--max-input-bytes" in r.output, r.output


def test_submit_stamps_the_jobs_that_give_no_submit_time(tmp_path: Path) -> None:
    q = _lines(tmp_path / "q.jsonl", _job(0, submit_time_s=5.0), _job(1))
    db = tmp_path / "s.db"
    r = runner.invoke(app, ["submit", str(q), "--state", str(db)])
    assert r.exit_code == 0, r.output
    specs = {row[0]: json.loads(row[1]) for row in sqlite3.connect(db).execute(
        "SELECT id, spec_json FROM jobs")}
    assert specs["j0"]["submit_time_s"] == 5.0
    assert specs["j1"]["submit_time_s"] > 1e9  # the store's wall clock


def test_the_yaml_alias_budget_follows_the_documents_own_size() -> None:
    """A merge key per job adds about twice the job's own nodes: past the fixed budget
    (here shrunk to 50 to keep the test small) it is kept, up to 4 nodes per own node,
    while a bomb (exponential in its size) is refused however the budget scales."""
    from apportion.inputs import _measure, _Refused

    def root(text: str) -> yaml.Node:
        return yaml.compose(text, Loader=yaml.SafeLoader)

    jobs = "d: &d {model: bert-1.3b, global_batch_size: 256, iterations: 9, requested_gpus: 1}\n" \
        "jobs:\n" + "".join(f"  - {{<<: *d, id: j{i}}}\n" for i in range(40))
    _measure(root(jobs), alias_budget=50)
    with pytest.raises(_Refused):
        _measure(root(jobs), alias_budget=50, per_node=1)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdef", "bcdefg"))
    with pytest.raises(_Refused, match="alias bomb"):
        _measure(root(bomb), alias_budget=50)
