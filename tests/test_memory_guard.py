"""An input the machine cannot hold is refused up front (exit 2, the file, the field, the
memory it needs and what the machine has; nothing written), at every door that loads one:
``solve-round``'s jobs, a trace for ``simulate`` and ``compare``, ``bench round``'s case.
The limit is set with ``APPORTION_MEMORY_LIMIT``, so the refusals do not depend on the
machine's memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli.app import app
from apportion.errors import InputError
from apportion.memory_guard import (
    GIB,
    MEMORY_ENV,
    MIB,
    available_bytes,
    check_fits,
    parse_size,
    round_bytes,
)

runner = CliRunner()


@pytest.mark.parametrize(("text", "size"), [
    ("1024", 1024), ("8GiB", 8 * GIB), ("512 MiB", 512 * MIB), ("2e9", 2_000_000_000),
    ("3G", 3_000_000_000), ("1.5kib", 1536), ("64mb", 64_000_000)])
def test_sizes_read_with_their_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "", "-1GiB", "0", "5 parsecs", "nan", "1e400"])
def test_a_size_that_is_not_one_is_refused_by_name(text: str) -> None:
    with pytest.raises(InputError, match=MEMORY_ENV):
        parse_size(text)


def test_the_limit_is_the_smallest_of_the_machine_and_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "1MiB")
    assert available_bytes() == (MIB, MEMORY_ENV)
    monkeypatch.setenv(MEMORY_ENV, "1000TiB")  # more than any machine here: the OS's figure
    have = available_bytes()
    assert have is not None and have[0] < 1000 * 2**40 and have[1] != MEMORY_ENV


@given(need=st.integers(1, 512 * MIB), limit=st.integers(1, 256 * MIB))  # below any machine's
def test_what_fits_passes_and_what_does_not_is_refused_naming_both(need: int, limit: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MEMORY_ENV, str(limit))
        if need <= limit:
            check_fits(need, "f.yaml", "jobs", "this", "do less")
        else:
            with pytest.raises(InputError) as err:
                check_fits(need, "f.yaml", "jobs", "this", "do less")
            assert err.value.source == "f.yaml" and err.value.field == "jobs"
            assert MEMORY_ENV in str(err.value) and "do less" in str(err.value)


def test_a_round_needs_more_with_more_jobs_and_gpus() -> None:
    assert round_bytes(1000, 1280) < round_bytes(10_000, 1280) < round_bytes(10_000, 20_480)
    assert round_bytes(1_000_000, 20_480) > 24 * GIB  # the 1,000,000-job round: not here


def _trace(tmp_path: Path, jobs: int = 20) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text("job_id,submit_time_s,num_gpus,duration_s,tenant\n"
                 + "".join(f"j{i},{60 * i},1,600,default\n" for i in range(jobs)))
    return p


def _refused(args: list[str], limit: str, *names: str) -> str:
    res = runner.invoke(app, args, env={MEMORY_ENV: limit})
    assert res.exit_code == 2, res.output
    assert "memory" in res.output and MEMORY_ENV in res.output, res.output
    for n in names:
        assert n in res.output, res.output
    return res.output


def test_solve_round_refuses_jobs_it_cannot_hold_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "decision.json"
    jobs = Path(__file__).parent.parent / "examples" / "jobs.yaml"
    args = ["solve-round", "--json", str(out)] + (["--jobs", str(jobs)] if jobs.exists() else [])
    _refused(args, "16MiB", "a round of", "jobs")
    assert not out.exists()


def test_simulate_and_compare_refuse_a_trace_they_cannot_load(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    _refused(["simulate", "--trace", str(trace), "--cluster", "crius-1280", "--policy", "fcfs"],
             "1KiB", str(trace), "--trace", "loading this trace")
    results = tmp_path / "results"
    _refused(["compare", "--trace", str(trace), "--cluster", "crius-1280", "--policies", "fcfs",
              "--out", str(results)], "1KiB", str(trace), "--trace")
    assert not results.exists()


def test_the_same_trace_replays_under_a_limit_it_fits(tmp_path: Path) -> None:
    trace = _trace(tmp_path, jobs=5)
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--cluster", "crius-1280",
                              "--policy", "fcfs"], env={MEMORY_ENV: "64GiB"})
    assert res.exit_code == 0, res.output


def test_bench_round_refuses_a_case_it_cannot_hold() -> None:
    _refused(["bench", "round", "--case", "100000:20480:5"], "1GiB", "--case",
             "100,000 jobs on 20,480 GPUs")


def test_a_bad_limit_is_refused_by_its_name(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", "--trace", str(_trace(tmp_path)), "--cluster",
                              "crius-1280", "--policy", "fcfs"], env={MEMORY_ENV: "lots"})
    assert res.exit_code == 2 and f"{MEMORY_ENV}: 'lots' is not a size" in res.output


def test_solve_round_refuses_a_store_queue_it_cannot_hold_and_commits_nothing(
        tmp_path: Path) -> None:
    import json

    import yaml

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "t", "node_groups": [
        {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4}]}))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [
        {"id": f"j{i}", "model": "bert-0.76b", "global_batch_size": 128, "iterations": 100,
         "requested_gpus": 2} for i in range(3)]}))
    db = tmp_path / "state.db"
    assert runner.invoke(app, ["submit", str(jobs), "--state", str(db)]).exit_code == 0
    out = tmp_path / "d.json"
    _refused(["solve-round", "--state", str(db), "--cluster", str(cluster), "--json", str(out)],
             "16MiB", str(db), "a round of 3 jobs")
    assert not out.exists()
    history = runner.invoke(app, ["history", "--state", str(db), "--json"])
    assert json.loads(history.stdout)["rounds"] == []
