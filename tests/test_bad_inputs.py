"""The bad-input corpus through every command that reads input, plus fuzzing of the loaders.

Every file in ``tests/bad_inputs/`` (and the generated cases: a 100 MB file, a
directory, a missing path, ``/dev/zero``) goes through every command that reads
an input of its kind. Each run must exit with code 2, name the file and the
field (as the index says), and write nothing: the state database keeps its
content, no output file appears, no new store is created. Every corpus entry is
also given as ``--state`` to the commands that read a state database.

The config loaders are fuzzed with hypothesis: whatever data they get, they
return a valid object or raise :class:`InputError`, never anything else.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cli.commands import command_names
from apportion.cluster import Cluster
from apportion.config import MAX_FILE_BYTES, cluster_from_data, jobs_from_data
from apportion.errors import InputError
from apportion.inputs import MAX_YAML_DEPTH, parse_shipped_yaml, parse_yaml_text
from apportion.jobs import JobSpec

BAD = Path(__file__).parent / "bad_inputs"
INDEX: list[dict[str, str]] = yaml.safe_load((BAD / "index.yaml").read_text())
runner = CliRunner()

GOOD_CLUSTER = {"node_groups": [{"prefix": "a40", "count": 2, "gpu_type": "A40",
                                 "gpus_per_node": 4}]}
GOOD_JOBS = {"jobs": [{"id": "ok1", "model": "bert-0.76b", "global_batch_size": 64,
                       "iterations": 100, "requested_gpus": 2}]}
SCONTROL = ("NodeName=gpu17 CPUTot=64 Gres=gpu:a100_80g:8(S:0-1) NodeAddr=10.1.0.17 "
            "RealMemory=1031000 State=IDLE Partitions=gpu\n")

# command -> (the input kind it reads, argv builder). "foreign": a command with its own file
# format (only the corpus entries that fail before any schema apply); "state": a state DB.
COMMANDS: dict[str, tuple[str, Any]] = {
    "solve-round --cluster": ("cluster", lambda f, e: [
        "solve-round", "--cluster", f, "--json", e["out"], "--dump-problem", e["dump"]]),
    "solve-round --jobs": ("jobs", lambda f, e: [
        "solve-round", "--jobs", f, "--json", e["out"], "--dump-problem", e["dump"]]),
    "solve-round --state DB --cluster": ("cluster", lambda f, e: [
        "solve-round", "--state", e["db"], "--cluster", f, "--json", e["out"]]),
    "submit": ("jobs", lambda f, e: ["submit", f, "--state", e["db"]]),
    "submit (new store)": ("jobs", lambda f, e: ["submit", f, "--state", e["newdb"]]),
    "estimate --cluster": ("cluster", lambda f, e: [
        "estimate", "--job", "bert-1.3b:256", "--cell", "A40:8", "--cluster", f,
        "--json", e["out"]]),
    "simulate --cluster": ("cluster", lambda f, e: [
        "simulate", "--trace", "philly", "--cluster", f, "--policy", "fcfs", "--json", e["out"],
        "--jobs-csv", e["csv"]]),
    "compare --cluster": ("cluster", lambda f, e: [
        "compare", "--trace", "philly", "--cluster", f, "--policies", "fcfs", "--out",
        e["results"]]),
    "bench rates --cluster": ("cluster", lambda f, e: [
        "bench", "rates", "--trace", "gavel-max-min-fairness", "--cluster", f, "--json",
        e["out"]]),
    "solve-shards --units": ("units", lambda f, e: [
        "solve-shards", "--units", f, "--json", e["out"]]),
    "solve-finetune --tasks": ("tasks", lambda f, e: [
        "solve-finetune", "--tasks", f, "--capacity", "8", "--json", e["out"]]),
    "status --state": ("state", lambda f, e: ["status", "--state", f, "--json"]),
    "history --state": ("state", lambda f, e: ["history", "--state", f, "--json"]),
    "cancel --state": ("state", lambda f, e: ["cancel", "ok1", "--state", f]),
    "solve-round --state": ("state", lambda f, e: ["solve-round", "--state", f, "--json",
                                                   e["out"]]),
    "run --cluster": ("cluster", lambda f, e: [
        "run", "--executor", "dry-run", "--cluster", f, "--state", e["db"], "--until-idle",
        "--timeout", "5", "--workdir", e["results"]]),
    "run --state": ("state", lambda f, e: [
        "run", "--executor", "dry-run", "--cluster", "crius-testbed", "--state", f,
        "--until-idle", "--timeout", "5", "--workdir", e["results"]]),
    "serve --cluster": ("cluster", lambda f, e: [
        "serve", "--executor", "dry-run", "--cluster", f, "--state", e["db"], "--port", "0",
        "--timeout", "5", "--workdir", e["results"]]),
    # every other flag that reads a file: the same reader, the same refusals
    "solve-round --tenants": ("tenants", lambda f, e: [
        "solve-round", "--formulation", "plans", "--tenants", f, "--json", e["out"]]),
    "solve-round --tables": ("tables", lambda f, e: [
        "solve-round", "--estimator", "tables", "--tables", f, "--backend", "greedy",
        "--json", e["out"]]),
    # the measured times are read while the round lock is held: a FIFO once hung there
    "solve-round --state DB --tables": ("tables", lambda f, e: [
        "solve-round", "--state", e["db"], "--estimator", "tables", "--tables", f,
        "--backend", "greedy", "--json", e["out"]]),
    "simulate --trace": ("trace", lambda f, e: [
        "simulate", "--trace", f, "--cluster", "crius-testbed", "--policy", "fcfs",
        "--json", e["out"], "--jobs-csv", e["csv"]]),
    "cluster import --gpu-map": ("gpumap", lambda f, e: [
        "cluster", "import", "--from", "slurm", e["scontrol"], "--gpu-map", f,
        "--out", e["out"]]),
    "cluster import --from k8s NODES": ("nodes", lambda f, e: [
        "cluster", "import", "--from", "k8s", f, "--out", e["out"]]),
    "export kueue --k8s-config": ("k8sconfig", lambda f, e: [
        "export", "kueue", "--cluster", "crius-testbed", "--tenants", e["tenants"],
        "--k8s-config", f, "--out", e["results"]]),
    "export k8s --decision": ("decision", lambda f, e: [
        "export", "k8s", "--decision", f, "--cluster", "crius-testbed", "--jobs", e["jobs"],
        "--out", e["results"]]),
    "export slurm --decision": ("decision", lambda f, e: [
        "export", "slurm", "--decision", f, "--cluster", "crius-testbed", "--jobs", e["jobs"],
        "--out", e["results"]]),
}
# Commands that read no input file (a model name, an enum, nothing): listed so that a new
# command cannot slip past this test unclassified.
NO_INPUT_FILE = {"models", "gpus", "policies", "profile", "bench sim", "bench estimate", "bench solve",
                 "bench round", "schema", "traces", "executors"}

# Known defects in loaders, reported to the lead: they raise instead of exiting 2.
# strict=True: a marker must go once its defect is fixed. (None open.)
KNOWN: dict[tuple[str, str], str] = {}
# Unsafe to run at all (unbounded reads). (None open: every loader reads through
# apportion.config.read_text, which is bounded.)
UNSAFE: dict[tuple[str, str], str] = {}
STATE_MESSAGES = ("not an apportion state database", "is a directory", "no such state database",
                  "an empty file", "not a regular file", "cannot use")
# formats of their own (JSON, CSV, traces, lenient YAML): an entry of kind "any" must exit 2
# and name the file there too, with whatever field and message that format gives
FOREIGN = ("units", "tasks", "tables", "trace", "gpumap", "nodes", "k8sconfig", "decision")
# YAML readers that take an empty file as "no settings" and word a wrong top level their own
# way: the corpus's "(top level)" entries do not apply to them
LENIENT = ("gpumap", "k8sconfig")


def _name(entry: dict[str, str]) -> str:
    return entry.get("file") or entry["generated"]


def _cases() -> list[Any]:
    out = []
    for entry in INDEX:
        for cmd, (kind, _) in COMMANDS.items():
            applies = (kind == "state" or entry["kind"] == kind
                       or (entry["kind"] == "any"
                           and kind in ("cluster", "jobs", "tenants", *FOREIGN)
                           and not (kind in LENIENT and entry["field"] == "(top level)"))
                       or (entry["kind"] == "round" and cmd == "solve-round --jobs"))
            if not applies:
                continue
            marks = []
            why = KNOWN.get((_name(entry), cmd))
            if (_name(entry), cmd) in UNSAFE:
                marks.append(pytest.mark.skip(reason=UNSAFE[(_name(entry), cmd)]))
            elif why:
                marks.append(pytest.mark.xfail(strict=True, reason=why))
            out.append(pytest.param(entry, cmd, id=f"{_name(entry)}::{cmd}", marks=marks))
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A work dir with a populated state DB (one submit, one round) and the generated inputs."""
    root = tmp_path_factory.mktemp("bad")
    work = root / "work"
    work.mkdir()
    gen = root / "generated"
    gen.mkdir()
    (work / "cluster.yaml").write_text(yaml.safe_dump(GOOD_CLUSTER))
    (work / "jobs.yaml").write_text(yaml.safe_dump(GOOD_JOBS))
    db = work / "state.db"
    assert runner.invoke(app, ["submit", str(work / "jobs.yaml"), "--state", str(db)]).exit_code == 0
    r = runner.invoke(app, ["solve-round", "--state", str(db), "--cluster",
                            str(work / "cluster.yaml"), "--backend", "greedy"])
    assert r.exit_code == 0, r.output
    big = gen / "file_100mb.yaml"
    with big.open("wb") as fh:  # 100 MB, sparse: refused by size before anything reads it
        fh.truncate(100 * 2**20)
    assert big.stat().st_size > MAX_FILE_BYTES
    (gen / "directory").mkdir()
    os.mkfifo(gen / "fifo.yaml")  # nothing ever writes it: a read would block forever
    (gen / "fifo_link.yaml").symlink_to(gen / "fifo.yaml")
    (gen / "loop_a.yaml").symlink_to(gen / "loop_b.yaml")
    (gen / "loop_b.yaml").symlink_to(gen / "loop_a.yaml")
    for kind, head in (("tables", "model,gpu_type,gpus,iter_time_s"),
                       ("trace", "job_id,submit_time_s,num_gpus,duration_s")):
        (gen / f"huge_field_{kind}.csv").write_text(f"{head}\n{'x' * 200_000},0,1,1\n")
    inputs = root / "inputs"  # valid companions of the file under test (never written)
    inputs.mkdir()
    (inputs / "tenants.yaml").write_text(yaml.safe_dump({"tenants": [
        {"name": "default", "quota_gpus": 4}]}))
    (inputs / "nodes.txt").write_text(SCONTROL)
    (inputs / "tables.csv").write_text("model,gpu_type,gpus,iter_time_s\nbert-0.76b,A40,2,0.5\n")
    (inputs / "trace.csv").write_text("job_id,submit_time_s,num_gpus,duration_s\na,0,1,3600\n")
    sock_dir = Path(tempfile.mkdtemp(prefix="apo-bad-"))  # AF_UNIX paths are short
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_dir / "s.yaml"))
    paths = {"file_100mb": big, "directory": gen / "directory", "missing": gen / "missing.yaml",
             "dev_zero": Path("/dev/zero"), "dev_null": Path("/dev/null"),
             "fifo": gen / "fifo.yaml", "fifo_symlink": gen / "fifo_link.yaml",
             "socket": sock_dir / "s.yaml", "symlink_loop": gen / "loop_a.yaml",
             "huge_field_tables": gen / "huge_field_tables.csv",
             "huge_field_trace": gen / "huge_field_trace.csv"}
    yield {"work": work, "db": db, "newdb": work / "new.db", "out": work / "out.json",
           "dump": work / "problem.json", "csv": work / "jobs.csv", "results": work / "results",
           "generated": paths, "tenants": inputs / "tenants.yaml",
           "scontrol": inputs / "nodes.txt", "jobs": work / "jobs.yaml",
           "tables": inputs / "tables.csv", "trace": inputs / "trace.csv"}
    sock.close()
    shutil.rmtree(sock_dir, ignore_errors=True)


def _dump(db: Path) -> list[str]:
    conn = sqlite3.connect(str(db))
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def _files(work: Path) -> set[str]:
    return {p.name for p in work.iterdir() if not p.name.startswith("state.db")}


@pytest.mark.timeout(120)  # a FIFO read would block forever: fail, never hang
@pytest.mark.parametrize("entry,command", _cases())
def test_bad_input_exits_2_names_file_and_field_and_writes_nothing(
        entry: dict[str, str], command: str, env: dict[str, Any]) -> None:
    path = BAD / entry["file"] if "file" in entry else env["generated"][entry["generated"]]
    if not path.exists() and entry.get("generated") in ("dev_zero", "dev_null"):
        pytest.skip(f"no {path} here")
    kind, argv = COMMANDS[command]
    before_db, before_files = _dump(env["db"]), _files(env["work"])
    r = runner.invoke(app, [str(a) for a in argv(str(path), env)])
    msg = " ".join(r.stderr.split())  # undo any wrapping
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert str(path) in msg, msg
    if kind == "state":
        assert "--state" in msg and any(m in msg for m in STATE_MESSAGES), msg
    elif not (kind in FOREIGN and entry["kind"] == "any"):
        assert f": {entry['field']}: " in msg, msg
        assert entry["message"] in msg, msg
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr  # one line: the error
    assert r.stdout.strip() == "", r.stdout  # no --json output on stdout either
    assert _dump(env["db"]) == before_db
    assert _files(env["work"]) == before_files  # no output file, no new store, no results dir


def test_every_command_is_classified() -> None:
    """A new command must be added to COMMANDS (it reads input) or NO_INPUT_FILE."""
    names = {n for n in command_names() if " " not in n or n.startswith("bench ")}
    tested = {" ".join(cmd.split()[:2]) if cmd.startswith("bench ") else cmd.split()[0]
              for cmd in COMMANDS}
    unclassified = {n for n in names if n not in tested and n not in NO_INPUT_FILE}
    assert not unclassified, f"classify these commands in tests/test_bad_inputs.py: {unclassified}"


def test_corpus_is_complete_and_indexed() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.name != "index.yaml"}
    indexed = {e["file"] for e in INDEX if "file" in e}
    assert on_disk == indexed
    assert len(INDEX) >= 40
    for e in INDEX:
        assert e["kind"] in ("cluster", "jobs", "any", "round", *FOREIGN)
        assert e["field"] and e["message"]


# -- fuzzing the loaders ------------------------------------------------------------------
SCALARS = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["A40", "A10", "H100", "bert-0.76b", "moe-0.69b", "nvlink", "pcie",
                              "a40-0", "", " ", "x" * 300, "0", "-1", "1e309", "nan"]))
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                   | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4),
                   max_leaves=12)
SMALL_INT = st.integers(-3, 12) | st.sampled_from([0, 10**6, 10**6 + 1, 10**12 + 1, 2**63])


def _maybe(strategy: Any) -> Any:
    """Usually a plausible value, sometimes anything at all."""
    return st.one_of(strategy, strategy, strategy, ANY)


NODE_GROUP = st.fixed_dictionaries(
    {"prefix": _maybe(st.sampled_from(["a", "b-1", "g.x", "节点", "bad name"])),
     "count": _maybe(SMALL_INT), "gpu_type": _maybe(st.sampled_from(["A40", "A10", "V100", "X"])),
     "gpus_per_node": _maybe(SMALL_INT)},
    optional={"cpus_per_node": _maybe(SMALL_INT),
              "host_memory_gib": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
              "intra_node_link": _maybe(st.sampled_from(["nvlink", "pcie", "ib"])),
              "intra_node_bandwidth_GBps": _maybe(st.floats(-1, 1e6) | st.just(math.nan)),
              "inter_node_bandwidth_GBps": _maybe(st.floats(-1, 1e6)), "extra": ANY})
CLUSTER = st.fixed_dictionaries({"node_groups": _maybe(st.lists(NODE_GROUP, max_size=3))},
                                optional={"name": _maybe(st.text(max_size=5))})
RUNNING = st.fixed_dictionaries(
    {"gpu_type": _maybe(st.sampled_from(["A40", "A10", "X"])), "gpus": _maybe(SMALL_INT)},
    optional={"stages": _maybe(SMALL_INT), "tp": _maybe(SMALL_INT),
              "placement": _maybe(st.dictionaries(st.text(max_size=5), SMALL_INT, max_size=3))})
JOB = st.fixed_dictionaries(
    {"id": _maybe(st.sampled_from(["a", "b", "训练", "[/x]"])),
     "model": _maybe(st.sampled_from(["bert-0.76b", "moe-0.69b", "gpt-9000"])),
     "global_batch_size": _maybe(SMALL_INT), "iterations": _maybe(SMALL_INT),
     "requested_gpus": _maybe(SMALL_INT)},
    optional={"requested_gpu_type": _maybe(st.sampled_from(["A40", "A10", "X", None])),
              "submit_time_s": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
              "deadline_s": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
              "guaranteed": _maybe(st.booleans()), "iterations_done": _maybe(SMALL_INT),
              "tenant": _maybe(st.text(max_size=4)), "running": _maybe(RUNNING)})
JOBS = st.fixed_dictionaries({"jobs": _maybe(st.lists(JOB, max_size=3))},
                             optional={"now_s": _maybe(st.floats(allow_nan=True,
                                                                 allow_infinity=True))})


def _check_cluster(c: Cluster) -> None:
    assert isinstance(c, Cluster) and c.nodes
    for n in c.nodes.values():
        assert n.gpus > 0 and n.cpus > 0 and math.isfinite(n.host_memory_gib)
        assert math.isfinite(n.intra_bandwidth_GBps) and n.intra_bandwidth_GBps > 0


def _check_jobs(jobs: list[JobSpec], now: float) -> None:
    assert math.isfinite(now) and now >= 0
    assert len({j.id for j in jobs}) == len(jobs)
    for j in jobs:
        assert j.global_batch_size > 0 and j.iterations > 0 and j.requested_gpus > 0
        assert math.isfinite(j.submit_time_s) and j.iterations_done < 2**63
        if j.running is not None:
            assert all(k > 0 for k in j.running.placement.values())


@settings(max_examples=200, deadline=None)
@given(data=CLUSTER | ANY)
def test_fuzz_cluster_loader(data: Any) -> None:
    try:
        c = cluster_from_data(data, "fuzz.yaml")
    except InputError as exc:
        assert exc.source == "fuzz.yaml" and exc.field and exc.message
        return
    _check_cluster(c)


@settings(max_examples=200, deadline=None)
@given(data=JOBS | ANY)
def test_fuzz_jobs_loader(data: Any) -> None:
    try:
        jobs, now = jobs_from_data(data, "fuzz.yaml")
    except InputError as exc:
        assert exc.source == "fuzz.yaml" and exc.field and exc.message
        return
    _check_jobs(jobs, now)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")) | st.sampled_from(["[" * 3000, "{a: " * 2000, "&a [*a]",
                                                      "a: *b", "? [a]\n: 1", "a: !!binary x"]))
def test_fuzz_yaml_text(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Arbitrary text through the file readers: InputError or a value, nothing else."""
    from apportion.config import load_cluster, load_jobs

    path = tmp_path_factory.getbasetemp() / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    for load in (load_cluster, load_jobs):
        try:
            load(path)
        except InputError as exc:
            assert exc.source == str(path)
    os.unlink(path)


# -- bad option values: refused with the option named, before anything runs or is written -----
BAD_OPTIONS = [
    (["run", "--timeout", "nan"], "--timeout"),
    (["run", "--timeout", "inf"], "--timeout"),
    (["run", "--timeout", "-1"], "--timeout"),
    (["run", "--time-budget", "-5"], "--time-budget"),
    (["run", "--time-budget", "nan"], "--time-budget"),
    (["run", "--interval", "0"], "--interval"),
    (["run", "--interval", "nan"], "--interval"),
    (["solve-round", "--time-budget", "nan"], "--time-budget"),
    (["simulate", "--trace", "synthetic:3", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--interval", "nan"], "--interval"),
    (["simulate", "--trace", "synthetic:3", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--noise", "nan"], "--noise"),
    (["simulate", "--trace", "synthetic:3", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--truth", "oracle"], "--truth"),
    (["solve-finetune", "--tasks", str(BAD / "tasks_huge_work.yaml"), "--capacity", "2",
      "--time-budget", "-5"], "--time-budget"),
    (["bench", "solve", "--time-budget", "nan"], "--time-budget"),
    # a budget past a week once overflowed the clock's arithmetic in the solver chain
    (["solve-round", "--time-budget", "1e308"], "--time-budget"),
    (["run", "--time-budget", "1e308"], "--time-budget"),
    (["bench", "solve", "--time-budget", "1e308"], "--time-budget"),
    (["solve-finetune", "--tasks", str(BAD / "tasks_huge_work.yaml"), "--capacity", "2",
      "--time-budget", "1e308"], "--time-budget"),
]
SYN = ["--trace", "synthetic:3", "--cluster", "crius-testbed"]
# count arguments: bounded where they are parsed, before anything is allocated for them; the
# message names the limit. Each once ran until memory was gone, or ended in a traceback.
BAD_COUNTS = [
    (["simulate", "--trace", "synthetic:3", "--cluster", "99999999:0:0", "--policy", "fcfs"],
     ("--cluster", "100,000")),
    (["simulate", "--trace", "synthetic:3", "--cluster", "9" * 5000 + ":0:0", "--policy",
      "fcfs"], ("--cluster", "characters")),
    (["compare", *SYN, "--policies", "fcfs", "--seeds", "100000000"], ("--seeds", "1,000")),
    (["simulate", "--trace", "{trace}", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--seed", "-1"], ("--seed", "at least 0")),
    (["bench", "solve", "--peers", "--sizes", "100000000"], ("--sizes", "100,000")),
    (["bench", "solve", "--peers", "--sizes", "1000,abc"], ("--sizes", "not a number")),
    (["bench", "round", "--case", "10:100000000:1"], ("--case", "GPUS", "2,000,000")),
    (["bench", "round", "--case", "-5:8:1"], ("--case", "JOBS", "at least 1")),
    (["bench", "round", "--case", "10:8:nan"], ("--case", "BUDGET", "finite")),
    (["bench", "round", "--case", "10:8:inf"], ("--case", "BUDGET", "finite")),
    (["bench", "round", "--case", "10:8:0"], ("--case", "BUDGET", "greater than 0")),
    (["bench", "round", "--case", "10:8:1:100000"], ("--case", "PARTS", "64")),
    (["profile", "gpt-tiny", "--batch", "100000000"], ("--batch", "4,096")),
    (["profile", "gpt-tiny", "--devices", "1000000"], ("--devices", "64")),
    (["profile", "gpt-tiny", "--devices", "3"], ("--devices", "divisor of 4")),
    (["profile", "custom:x"], ("custom:x", "not a custom model name")),
    (["bench", "sim", "--policy", "bogus"], ("--policy", "'bogus' is not a policy")),
    # rich once turned ":abc:" in this message into an emoji
    (["simulate", "--trace", "synthetic:abc", "--cluster", "crius-testbed", "--policy",
      "fcfs"], ("--trace", "synthetic:abc", "'abc' is not a whole number")),
]
# flags a command would silently ignore, or nonsense it would count: refused, naming both flags
BAD_COMBINATIONS = [
    (["solve-round", "--tables", "{tables}"], ("--tables", "--estimator")),
    (["solve-round", "--formulation", "gavel", "--tenants", "{tenants}"],
     ("--tenants", "--formulation")),
    (["solve-round", "--policy", "sia", "--dump-problem", "p.json"],
     ("--dump-problem", "--policy sia")),
    (["solve-round", "--round-key", "k1"], ("--round-key", "--state")),
    (["solve-round", "--ray-address", "10.0.0.1:6379"], ("--ray-address", "--engine")),
    (["solve-round", "--policy", "fcfs", "--formulation", "plans"], ("--policy", "--formulation")),
    (["compare", *SYN, "--policies", "fcfs,fcfs"], ("--policies", "fcfs given twice")),
    (["compare", *SYN, "--policies", "fcfs", "--ray-address", "10.0.0.1:6379"],
     ("--ray-address", "--engine")),
    (["compare", *SYN, "--policies", "fcfs", "--run", "../escaped"], ("--run", "one folder")),
    (["compare", *SYN, "--policies", "fcfs", "--run", "/tmp/escaped"], ("--run", "one folder")),
]


def _argv(argv: list[str], env: dict[str, Any]) -> list[str]:
    """Fill in the fixture's files; give run and compare their folders inside the work dir."""
    argv = [a.format(tables=env["tables"], tenants=env["tenants"], trace=env["trace"])
            for a in argv]
    if argv[0] == "run":
        argv = [*argv, "--executor", "dry-run", "--cluster", "crius-testbed", "--state",
                str(env["db"]), "--until-idle", "--workdir", str(env["results"])]
    if argv[0] == "compare":
        argv = [*argv, "--out", str(env["results"])]
    return argv


@pytest.mark.parametrize("argv, names", [(a, (o,)) for a, o in BAD_OPTIONS] + BAD_COUNTS
                         + BAD_COMBINATIONS,
                         ids=[" ".join(a[:1] + a[-2:])[:60]
                              for a, _ in BAD_OPTIONS + BAD_COUNTS + BAD_COMBINATIONS])
def test_bad_option_values_are_refused(argv: list[str], names: tuple[str, ...],
                                       env: dict[str, Any]) -> None:
    """Exit 2 with one line naming the option (and the limit, or the other flag), nothing
    written, the store untouched, no results folder created."""
    before_db, before_files = _dump(env["db"]), _files(env["work"])
    r = runner.invoke(app, _argv(argv, env))
    assert r.exit_code == 2, (r.exit_code, r.output)
    msg = " ".join(r.stderr.split())
    assert all(n in msg for n in names) and "Traceback" not in r.output, r.stderr
    if (argv, names) in BAD_COUNTS + BAD_COMBINATIONS:  # typer's own usage errors are a box
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    for n in names:  # the option once, never doubled as "--seeds: seeds: ..."
        assert f"{n}: {n.lstrip('-').replace('-', '_')}: " not in msg, msg
    assert _dump(env["db"]) == before_db and _files(env["work"]) == before_files


# -- outputs aimed at the command's own inputs or store, and stores that are not files -----------
# Each once replaced what it named: the store by the decision (every job and round gone), the
# jobs or cluster file by the answer to it; a URI store split the store from its lock.
BAD_TARGETS = [
    (["solve-round", "--state", "{db}", "--json", "{db}"], ("--json", "--state store")),
    (["solve-round", "--state", "{db}", "--dump-problem", "{db}"],
     ("--dump-problem", "--state store")),
    (["solve-round", "--state", "{db}", "--json", "{db}-wal"], ("--json", "--state store")),
    (["solve-round", "--state", "{db}", "--json", "{db}.lock"], ("--json", "--state store")),
    (["solve-round", "--state", "{db}", "--json", "{dblink}"], ("--json", "--state store")),
    (["solve-round", "--state", "{db}", "--cluster", "{cluster}", "--json", "{cluster}"],
     ("--json", "--cluster input")),
    (["solve-round", "--jobs", "{jobs}", "--json", "{jobs}"], ("--json", "--jobs input")),
    (["solve-round", "--jobs", "{jobs}", "--dump-problem", "{jobshard}"],
     ("--dump-problem", "--jobs input")),
    (["solve-round", "--cluster", "{cluster}", "--json", "{cluster}"],
     ("--json", "--cluster input")),
    (["solve-round", "--estimator", "tables", "--tables", "{tables}", "--json", "{tables}"],
     ("--json", "tables.csv", "input of this command")),
    (["simulate", "--trace", "{trace}", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--jobs-csv", "{trace}"], ("--jobs-csv", "--trace input")),
    (["estimate", "--job", "bert-1.3b:256", "--cell", "A40:8", "--cluster", "{cluster}",
      "--json", "{cluster}"], ("--json", "--cluster input")),
    (["solve-round", "--state", "file:{db}"], ("--state", "SQLite URI")),
    (["solve-round", "--state", "file:{db}?mode=rw"], ("--state", "SQLite URI")),
    (["submit", "{jobs}", "--state", "file:{newdb}"], ("--state", "SQLite URI")),
    (["submit", "{jobs}", "--state", "file:m.db?mode=memory"], ("--state", "SQLite URI")),
    (["submit", "{jobs}", "--state", ":memory:"], ("--state", "in-memory")),
    (["status", "--state", "FILE:{db}"], ("--state", "SQLite URI")),
    (["history", "--state", "file:{db}"], ("--state", "SQLite URI")),
    (["run", "--executor", "dry-run", "--cluster", "crius-testbed", "--state", "file:{db}",
      "--until-idle", "--timeout", "5"], ("--state", "SQLite URI")),
]


def _digest(paths: list[Path]) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in paths if p.exists()}


@pytest.mark.parametrize("argv, names", BAD_TARGETS,
                         ids=[" ".join(a)[:70] for a, _ in BAD_TARGETS])
def test_outputs_never_replace_inputs_and_stores_are_files(
        argv: list[str], names: tuple[str, ...], env: dict[str, Any]) -> None:
    """Exit 2 naming the option and what the path is to the command; the store, the inputs
    and the work folder exactly as they were; no round committed, no store created."""
    work = env["work"]
    link, hard = work / "store_link.db", work / "jobs_hard.yaml"
    if not link.is_symlink():
        link.symlink_to(env["db"])
    if not hard.exists():
        os.link(env["jobs"], hard)
    fill = {"db": env["db"], "newdb": env["newdb"], "dblink": link, "jobs": env["jobs"],
            "jobshard": hard, "cluster": work / "cluster.yaml", "tables": env["tables"],
            "trace": env["trace"]}
    argv = [a.format(**fill) for a in argv]
    watched = [env["jobs"], work / "cluster.yaml", env["tables"], env["trace"]]
    before = (_dump(env["db"]), _files(work), _digest(watched),
              {p.name for p in work.iterdir()})
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, (r.exit_code, r.output)
    msg = " ".join(r.stderr.split())
    assert all(n in msg for n in names) and "Traceback" not in r.output, r.stderr
    assert (_dump(env["db"]), _files(work), _digest(watched),
            {p.name for p in work.iterdir()}) == before
    assert not env["newdb"].exists() and not Path("m.db").exists()


def test_an_input_of_one_command_is_an_output_of_the_next(env: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """The refusal is per command: a test runner (or `serve`) that runs many commands in one
    process does not carry one command's inputs into the next."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_bytes(env["jobs"].read_bytes())
    out = tmp_path / "out.json"
    assert runner.invoke(app, ["solve-round", "--jobs", str(jobs), "--json", str(out),
                               "--backend", "greedy"]).exit_code == 0
    r = runner.invoke(app, ["solve-round", "--json", str(jobs), "--backend", "greedy"])
    assert r.exit_code == 0, r.output
    assert json.loads(jobs.read_text())["allocations"] is not None


# -- the top-level handler: one line, the traceback only with -v --------------------------------
def test_unexpected_errors_are_one_line_and_tracebacks_need_v(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import apportion.policies

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("a bug\x1b[2J in the round")

    monkeypatch.setattr(apportion.policies, "run_round", boom)
    argv = ["solve-round", "--backend", "greedy", "--no-isolate"]
    r = runner.invoke(app, argv)
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "internal error" in lines[0] and "-v" in lines[0], r.stderr
    assert "\x1b" not in r.stderr and "\\x1b" in r.stderr  # escaped, never raw
    for verbose in (["-v", *argv], [*argv, "-v"]):
        r = runner.invoke(app, verbose)
        assert r.exit_code == 1 and "Traceback" in r.stderr, r.stderr

    def denied(*a: Any, **k: Any) -> Any:
        raise PermissionError(13, "Permission denied", "/srv/x")

    monkeypatch.setattr(apportion.policies, "run_round", denied)
    r = runner.invoke(app, argv)
    assert r.exit_code == 2 and "/srv/x" in r.stderr and "Traceback" not in r.stderr, r.stderr

    def full(*a: Any, **k: Any) -> Any:
        raise OSError(28, "No space left on device", "/srv/x")

    monkeypatch.setattr(apportion.policies, "run_round", full)
    r = runner.invoke(app, argv)
    assert r.exit_code == 75 and "free space" in r.stderr, r.stderr


# -- every reader, random bytes and random YAML: an answer or InputError, within a work limit ---
class WorkLimitExceeded(BaseException):
    """A reader did more work than any input of its size needs (a BaseException, so no
    reader's ``except Exception`` can turn it into an answer)."""


@contextlib.contextmanager
def work_limit(calls: int) -> Iterator[None]:
    """Bound the Python calls made in the block: a reader that walks an alias bomb as a tree
    or loops on a malformed file exceeds it, whatever the machine's speed or load (a work
    limit, not a wall clock, so the test is the same everywhere)."""
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += 1
        if count > calls:
            raise WorkLimitExceeded(f"more than {calls} Python calls")

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


def _readers() -> dict[str, tuple[str, Any]]:
    """Every function that reads an input file for a flag: name -> (file suffix, reader)."""
    from apportion.config import load_cluster, load_jobs, load_tenants
    from apportion.estimation.finetune.transferability import load_task_data
    from apportion.estimation.models.measured import TableEstimator
    from apportion.experiments.traces import load_any
    from apportion.finetune_spec import load_finetune_problem, load_submissions
    from apportion.runtime.cluster_import import load_gpu_map, read_nodes
    from apportion.runtime.executors.kubernetes.config import load_k8s_config
    from apportion.runtime.executors.kubernetes.export import load_decision
    from apportion.runtime.executors.kubernetes.importer import import_k8s
    from apportion.shards_spec import load_problem

    return {
        "--cluster": (".yaml", load_cluster), "--jobs / submit": (".yaml", load_jobs),
        "--tenants": (".yaml", load_tenants), "--tasks": (".yaml", load_finetune_problem),
        "finetune submissions": (".yaml", load_submissions),
        "--gpu-map": (".yaml", load_gpu_map), "--k8s-config": (".yaml", load_k8s_config),
        "--units": (".json", load_problem), "--decision": (".json", load_decision),
        "cluster import --from k8s": (".json", import_k8s),
        "cluster import --from slurm": (".txt", lambda p: read_nodes("slurm", p)),
        "--tables": (".csv", TableEstimator.from_csv), "--trace (CSV)": (".csv", load_any),
        "--trace (Gavel)": (".trace", load_any),
        "--gains auto data (.npz)": (".npz", lambda p: load_task_data(p, "t", "tasks[0].data")),
        "--gains auto data (.csv)": (".csv", lambda p: load_task_data(p, "t", "tasks[0].data")),
    }


READERS = _readers()


def _bomb(width: int, depth: int, top: str) -> str:
    """Billion laughs: ``depth`` levels of ``width`` aliases each, under ``top``."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
    return "\n".join(lines) + f"\n{top}: *a{depth - 1}\n"


def _splice(text: str, junk: bytes, at: int) -> bytes:
    raw = text.encode()
    at %= len(raw) + 1
    return raw[:at] + junk + raw[at:]


def _npz(shape: tuple[int, ...], descr: str, payload: bytes, name: str) -> bytes:
    """A zip holding one .npy member whose header claims ``shape`` (its data may lie)."""
    import io
    import zipfile

    from numpy.lib import format as npformat

    head = io.BytesIO()
    npformat.write_array_header_1_0(head, {"descr": descr, "fortran_order": False,
                                           "shape": shape})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{name}.npy", head.getvalue() + payload)
    return buf.getvalue()


YAML_DOCS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                         max_leaves=20).map(lambda d: yaml.safe_dump(d, allow_unicode=True))
PLAUSIBLE = (CLUSTER | JOBS | st.fixed_dictionaries({"tenants": ANY})).map(
    lambda d: yaml.safe_dump(d, allow_unicode=True))
BOMBS = st.builds(_bomb, st.integers(1, 12), st.integers(1, 12),
                  st.sampled_from(["jobs", "node_groups", "tenants", "tasks", "items", "x"]))
RANDOM_YAML = st.one_of(
    YAML_DOCS, PLAUSIBLE, BOMBS,
    st.sampled_from(["&a [*a]", "a: &a {b: *a}", "<<: *u", "a: !!python/object:os.system x",
                     "[" * 5000, "- " * 3000, "a: 1\na: 2", "%YAML 9.9\n---\na"]),
).map(str.encode) | st.builds(_splice, YAML_DOCS | PLAUSIBLE | BOMBS,
                              st.binary(min_size=1, max_size=8), st.integers(0, 10**6))
RANDOM_BYTES = st.binary(max_size=3000) | st.builds(
    _npz, st.lists(st.integers(0, 10**6), max_size=3).map(tuple),
    st.sampled_from(["<f8", "<i8", "|u1", "<U4", "|O"]), st.binary(max_size=64),
    st.sampled_from(["x", "y"])) | st.builds(
    lambda rows: ("model,gpu_type,gpus,iter_time_s\n" + "\n".join(rows)).encode(),
    st.lists(st.text(max_size=40), max_size=5)) | st.builds(
    lambda rows: ("job_id,submit_time_s,num_gpus,duration_s\n" + "\n".join(rows)).encode(),
    st.lists(st.text(max_size=40), max_size=5))

#: far more Python calls than any reader spends on a 3 KB input (a few thousand), far fewer
#: than walking any of these bombs as a tree (12^12 nodes)
READER_CALLS = 3_000_000


def _read_once(name: str, content: bytes, folder: Path) -> None:
    suffix, reader = READERS[name]
    path = folder / f"fuzz{suffix}"
    path.write_bytes(content)
    try:
        with work_limit(READER_CALLS):
            reader(path)
    except InputError as exc:
        assert exc.source and exc.field and exc.message
        assert "\n" not in str(exc), str(exc)  # one line
    finally:
        path.unlink()


FUZZ = settings(max_examples=25, deadline=None,
                phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))


@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(content=RANDOM_BYTES)
# found by this test: a row holding only U+0085 (whitespace to str.strip, a row to pandas)
@example(content="job_id,submit_time_s,num_gpus,duration_s\n\x85".encode())
def test_every_reader_takes_random_bytes(name: str, content: bytes,
                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random bytes (and forged archives, ragged CSV) through every reader: a value or an
    InputError of one line, within the work limit; never another exception, never a hang."""
    _read_once(name, content, tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(content=RANDOM_YAML)
def test_every_reader_takes_random_yaml(name: str, content: bytes,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random YAML (documents, plausible inputs, alias bombs up to 12^12 nodes, recursive
    aliases, spliced bytes) through every reader, YAML or not: the same guarantees."""
    _read_once(name, content, tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("pad", [0, 20000])  # the pure-Python loader and libyaml's
@pytest.mark.parametrize("alias", [False, True])  # a text with no "*" is measured as a tree
def test_the_depth_limit_is_the_same_with_and_without_an_alias_in_the_text(pad: int,
                                                                            alias: bool) -> None:
    """A text without ``*`` can hold no alias, so only its depth is measured: the limit is
    the same one, at the same level, as the full measure's (a text with an alias)."""
    def text(levels: int) -> str:  # ``levels`` nodes deep: the root mapping, lists, a scalar
        head = "a: &x 1\nb: *x\n" if alias else "a: 1\nb: 1\n"
        return head + "c: " + "[" * (levels - 2) + "0" + "]" * (levels - 2) + "\n" + \
            "#" + "-" * pad + "\n"

    assert parse_yaml_text(text(MAX_YAML_DEPTH), "t.yaml")["a"] == 1
    with pytest.raises(InputError, match="nesting too deep"):
        parse_yaml_text(text(MAX_YAML_DEPTH + 1), "t.yaml")


def test_every_shipped_yaml_reads_the_same_on_the_shipped_loader() -> None:
    """The package's own data files are read on libyaml's parser where there is one
    (``inputs.parse_shipped_yaml``): each gives what PyYAML's pure-Python safe loader gives."""
    files = [f for f in resources.files("apportion").joinpath("data").rglob("*.yaml")]
    assert len(files) >= 4
    for f in files:
        text = f.read_text()
        assert parse_shipped_yaml(text) == yaml.safe_load(text), f.name
