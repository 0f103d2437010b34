"""Trace formats through the doors a user reaches: every registered format passes
``apportion.testing.check_trace_format``; a user's own workload (their models, their
measured rates) replays as written through ``simulate``/``compare --tables``; a CSV no
format reads is refused by name; what a loader substitutes is printed and kept in the
summary; ``--truth`` refusals say why; ``apportion traces`` lists the formats.

Before (issue 61 item 5): a peer's workload in apportion's own normalised columns, with
models the catalog lacks, was read as a raw cluster trace: ``cifar10`` on 6 GPUs for
3,343 iterations became ``wresnet-0.5b`` on 16 GPUs for 17, and ``simulate`` exited 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.traces import registry
from typer.testing import CliRunner

from apportion.cli import app
from apportion.errors import InputError
from apportion.testing import check_trace_format

runner = CliRunner()

PEER = ("job_id,submit_time_s,num_gpus,duration_s,model,batch_size,iterations\n"
        "j1,0,6,3600,cifar10,128,3343\n"
        "j2,60,4,1800,resnet50,256,2000\n"
        "j3,120,2,900,cifar10,128,800\n")
PEER_TABLES = ("model,gpu_type,gpus,iter_time_s,global_batch_size\n"
               "cifar10,A40,1,0.60,128\n"
               "cifar10,A40,2,0.33,128\n"
               "cifar10,A10,1,0.90,128\n"
               "resnet50,A40,1,0.90,256\n"
               "resnet50,A40,4,0.25,256\n")


def _files(tmp_path: Path, trace: str = PEER, tables: str = PEER_TABLES) -> tuple[str, str]:
    (tmp_path / "peer.csv").write_text(trace)
    (tmp_path / "tables.csv").write_text(tables)
    return str(tmp_path / "peer.csv"), str(tmp_path / "tables.csv")


def _simulate(*args: str) -> object:
    return runner.invoke(app, ["simulate", "--cluster", "crius-testbed", "--policy", "fcfs",
                               *args])


@pytest.mark.parametrize("name", sorted(tr.formats()))
def test_every_registered_format_passes_its_check(name: str, request: pytest.FixtureRequest,
                                                  tmp_path: Path) -> None:
    """Discovered, not listed: a format added later is checked here too."""
    if tr.trace_format(name).truth != "analytic":  # its truth reads the measured tables
        request.getfixturevalue("shared_data")
    trace = check_trace_format(name, folder=str(tmp_path))
    assert trace.format == name and trace.jobs


def test_a_users_workload_replays_as_written_on_their_rates(tmp_path: Path) -> None:
    trace, tables = _files(tmp_path)
    out, jobs = tmp_path / "s.json", tmp_path / "jobs.csv"
    r = _simulate("--trace", trace, "--tables", tables, "--json", str(out),
                  "--jobs-csv", str(jobs))
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["trace_format"] == "workload" and s["truth"].startswith("tables:")
    assert s["finished"] == s["jobs"] == 3 and s["substitutions"] == []
    rows = {ln.split(",")[0]: ln for ln in jobs.read_text().splitlines()[1:]}
    assert ",6,,cifar10,cifar10," in rows["j1"] and ",3343.0," in rows["j1"]  # as written
    assert "note:" not in r.stderr  # nothing was read into the file


def test_without_its_rates_a_users_workload_is_refused_naming_the_models(
        tmp_path: Path) -> None:
    trace, _ = _files(tmp_path)
    out = tmp_path / "s.json"
    r = _simulate("--trace", trace, "--json", str(out))
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2, r.output
    assert trace in msg and "column model" in msg and "cifar10" in msg and "resnet50" in msg
    assert "--tables" in msg and not out.exists()


def test_the_tables_are_the_truth(tmp_path: Path) -> None:
    """One job of 1,000 iterations on 4 A40s measured at 0.5 s each: 500 s, exactly."""
    trace, tables = _files(tmp_path, "job_id,submit_time_s,num_gpus,model,batch_size,"
                           "iterations\nsolo,0,4,my-net,128,1000\n",
                           "model,gpu_type,gpus,iter_time_s,global_batch_size\n"
                           "my-net,A40,4,0.5,128\nmy-net,A40,1,1.6,128\n")
    out = tmp_path / "s.json"
    r = _simulate("--trace", trace, "--tables", tables, "--information", "oracle",
                  "--restart-cost", "0", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["avg_jct_s"] == pytest.approx(500.0)


def test_compare_takes_the_tables_too(tmp_path: Path) -> None:
    trace, tables = _files(tmp_path)
    r = runner.invoke(app, ["compare", "--trace", trace, "--cluster", "crius-testbed",
                            "--policies", "fcfs,apportion", "--tables", tables, "--out",
                            str(tmp_path / "res"), "--run", "r", "--workers", "1",
                            "--deterministic"])
    assert r.exit_code == 0, r.output
    for p in ("fcfs", "apportion"):
        s = json.loads((tmp_path / "res" / "r" / f"{p}-s0" / "summary.json").read_text())
        assert s["finished"] == 3 and s["trace_format"] == "workload", p
    r = runner.invoke(app, ["compare", "--trace", trace, "--cluster", "crius-testbed",
                            "--policies", "fcfs", "--out", str(tmp_path / "res2")])
    assert r.exit_code == 2 and "cifar10" in r.stderr
    assert not (tmp_path / "res2").exists()


def test_durations_become_work_at_the_truths_rate_and_say_so(tmp_path: Path) -> None:
    trace, tables = _files(tmp_path, "job_id,submit_time_s,num_gpus,model,batch_size,"
                           "duration_s,gpu_type\nd,0,2,cifar10,128,660,a40\n")
    out, jobs = tmp_path / "s.json", tmp_path / "jobs.csv"
    r = _simulate("--trace", trace, "--tables", tables, "--json", str(out), "--jobs-csv",
                  str(jobs))
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    fields = {(x["field"], x["from"], x["to"]) for x in s["substitutions"]}
    assert ("gpu_type", "a40", "A40") in fields  # an alias renamed: recorded
    assert any(f == "iterations" for f, _, _ in fields)
    assert ",2000.0," in jobs.read_text()  # 660 s at 0.33 s an iteration
    assert "note:" in r.stderr and "gpu_type a40 -> A40" in " ".join(r.stderr.split())


@pytest.mark.parametrize("text,field,message", [
    ("job_id,submit_time_s,num_gpus,model,batch_size,iterations\na,0,1,,8,10\n",
     "line 2, column model", "is empty"),
    ("job_id,submit_time_s,num_gpus,model,batch_size,iterations,duration_s\na,0,1,m,8,,60\n",
     "line 2, column iterations", "the job's work is unknown"),
    ("job_id,submit_time_s,num_gpus,model,batch_size,iterations,gpu_type\na,0,1,m,8,5,Z9\n",
     "line 2, column gpu_type", "unknown GPU type 'Z9'"),
    ("job_id,arrival,gpus,model\na,0,1,m\n", "(columns)", "match no registered trace format"),
])
def test_what_a_user_file_cannot_mean_is_refused(tmp_path: Path, text: str, field: str,
                                                 message: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text(text)
    out = tmp_path / "s.json"
    r = _simulate("--trace", str(f), "--json", str(out))
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2, r.output
    assert f"{f}: {field}: " in msg and message in msg, msg
    assert not out.exists()


def test_a_refused_csv_names_its_columns_and_the_formats_it_could_be(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("job_id,submit_time_s,num_gpus,model,iterations\na,0,6,cifar10,3343\n")
    with pytest.raises(InputError) as e:
        tr.load_any(f)
    msg = str(e.value)
    assert "job_id, model, num_gpus, submit_time_s, iterations" not in msg  # sorted, named
    assert "its columns (iterations, job_id, model, num_gpus, submit_time_s)" in msg
    assert "closest: " in msg and "workload (needs batch_size)" in msg
    assert "apportion traces" in msg


def test_two_formats_that_detect_a_file_alike_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    crius = tr.trace_format("crius")
    twin = tr.TraceFormat(name="crius-twin", doc="the same columns", load=crius.load,
                          columns=crius.columns)
    monkeypatch.setitem(registry._FORMATS, twin.name, twin)
    f = Path(crius.example(tmp_path))  # type: ignore[misc]
    with pytest.raises(InputError, match="matches the trace formats crius and crius-twin"):
        tr.detect(f)


def test_substitutions_are_printed_and_kept(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "crius-philly", "--cluster", "crius-1280",
                            "--policy", "fcfs", "--max-jobs", "3", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["trace_format"] == "crius"
    models = [x for x in s["substitutions"] if x["field"] == "model"]
    assert models and sum(x["jobs"] for x in models) == 3  # counted over the jobs replayed
    err = " ".join(r.stderr.split())
    assert "note: trace" in err and "(crius format): model" in err and "-> A40" in err


def test_a_raw_cluster_trace_says_it_was_adapted(shared_data: Path, tmp_path: Path) -> None:
    f = tmp_path / "cluster.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s\na,0,8,7200\nb,100,1,3600\n")
    out = tmp_path / "s.json"
    r = _simulate("--trace", str(f), "--json", str(out))
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["trace_format"] == "raw"
    assert [x["jobs"] for x in s["substitutions"]] == [2]
    assert "drawn by Crius's adaptation" in " ".join(r.stderr.split())


@pytest.mark.parametrize("args,why", [
    (["--truth", "analytic"], "a raw cluster trace carries no models"),
    (["--truth", "tables"], "give them with --tables FILE"),
    (["--truth", "finetune"], "only Crius's truth rates what it draws"),
])
def test_truth_refusals_say_why(tmp_path: Path, args: list[str], why: str) -> None:
    f = tmp_path / "cluster.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s\na,0,8,7200\n")
    r = _simulate("--trace", str(f), *args)
    assert r.exit_code == 2, r.output
    assert why in " ".join(r.stderr.split())


def test_a_truth_beside_tables_and_a_tables_truth_a_format_cannot_take_are_refused(
        tmp_path: Path) -> None:
    trace, tables = _files(tmp_path)
    r = _simulate("--trace", trace, "--tables", tables, "--truth", "gavel")
    assert r.exit_code == 2 and "leave --truth out" in " ".join(r.stderr.split())
    r = _simulate("--trace", trace, "--truth", "finetune")
    assert r.exit_code == 2 and "fine-tuning" in " ".join(r.stderr.split())
    raw = tmp_path / "cluster.csv"
    raw.write_text("job_id,submit_time_s,num_gpus,duration_s\na,0,8,7200\n")
    r = _simulate("--trace", str(raw), "--tables", tables)
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2 and f"{tables}: --tables: " in msg and "no models" in msg


def test_traces_lists_every_format_and_the_bundled_traces() -> None:
    r = runner.invoke(app, ["traces", "--json"])
    assert r.exit_code == 0, r.output
    listed = json.loads(r.stdout)
    assert set(tr.FORMATS) <= set(listed["formats"])
    assert listed["formats"]["workload"]["truth"] == "analytic"
    assert "crius-philly" in listed["bundled"] and "synthetic[:N]" in listed["generated"]
    r = runner.invoke(app, ["traces"])
    assert r.exit_code == 0 and "workload" in r.stdout


class _PerGpu:
    """A ground truth of its own: one iteration a second per GPU, on any type."""

    name = "per-gpu"
    interpolated: set = set()

    def rate(self, job: object, gpu_type: str, gpus: int, placement: object = None,
             plan: object = None) -> float:
        return float(gpus)


def test_a_format_is_its_columns_and_its_rates(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """What a later format needs (one like Pollux's, ``job,time,application,replicas,
    batch_size``): detected by its columns, loaded by its loader, replayed on the rates of
    a truth registered beside it — no harness change."""
    from apportion.experiments import truths
    from apportion.experiments.harness import prepare_one

    def load(path: Path) -> tr.Trace:
        _, rows = tr.read_trace_csv(path, ("job", "time", "application", "replicas",
                                           "batch_size"), "job",
                                    {"time": tr.SECONDS, "replicas": tr.POSITIVE_COUNT})
        return tr.Trace(path.stem, tr.sorted_jobs([
            tr.SimJob(r["job"], float(rows.number(i, "time")),
                      int(rows.number(i, "replicas")), 600.0, r["application"],
                      batch=int(r["batch_size"])) for i, r in rows.iter()]), str(path))

    monkeypatch.setitem(truths.TRUTHS, "per-gpu",
                        truths.TruthKind("per-gpu", "one iteration/s per GPU",
                                         lambda inputs: _PerGpu()))
    fmt = tr.TraceFormat(name="replicas", doc="job,time,application,replicas,batch_size",
                         load=load, columns=("job", "time", "application", "replicas",
                                             "batch_size"), truth="per-gpu")
    monkeypatch.setitem(registry._FORMATS, fmt.name, fmt)
    f = tmp_path / "workload-1.csv"
    f.write_text("job,time,application,replicas,batch_size\n"
                 "cifar10-0,0,cifar10,2,2048\ndeepspeech2-1,10,deepspeech2,4,320\n")
    replay = prepare_one(str(f), "crius-testbed", "fcfs", ground_truth="per-gpu",
                         sim_options={"restart_cost_s": 0.0})
    res = replay()
    assert res.summary["trace_format"] == "replicas" and res.summary["truth"] == "per-gpu"
    assert res.summary["finished"] == 2
    assert res.jobs.set_index("job_id")["jct_s"]["cifar10-0"] == pytest.approx(300.0)


def test_the_check_names_what_a_format_gets_wrong(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    shadowed = tr.TraceFormat(name="shadowed", doc="any CSV with a job_id",
                              load=tr.trace_format("workload").load, columns=("job_id",),
                              priority=0)
    monkeypatch.setitem(registry._FORMATS, shadowed.name, shadowed)
    sample = tr.trace_format("workload").example(tmp_path)  # type: ignore[misc]
    with pytest.raises(AssertionError, match="shadowed: .* is detected as 'workload'"):
        check_trace_format("shadowed", sample=sample, replay=False, folder=str(tmp_path))
    with pytest.raises(AssertionError, match="not a registered trace format"):
        check_trace_format("no-such-format")
    with pytest.raises(AssertionError, match="no example to check"):
        check_trace_format("shadowed", folder=str(tmp_path))
