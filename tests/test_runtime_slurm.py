"""A real Slurm cluster on this machine (two slurmd nodes, A40 and A10 GRES): import it, train
user jobs through `apportion run --executor slurm` with a resize and a killed scheduler, and
check failures, adoption and the grace period through the executor itself.

The cluster is private (its own slurm.conf via SLURM_CONF, munged socket, free ports; see
runtime.executors.slurm.local_cluster). Without Slurm's binaries the tests skip, unless APPORTION_REQUIRE_SLURM=1
(CI sets it), where they fail: CI never skips them silently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apportion.runtime.executors.executor import Health, Progress
from apportion.runtime.executors.slurm.executor import SlurmExecutor
from apportion.runtime.executors.slurm.local_cluster import LocalSlurm, missing_binaries

from apportion.config import load_cluster
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.jobs import JobSpec, Workload, job_dirname
from apportion.plans import ExecutionPlan

# A user's training script that honours only the workload contract (environment variables):
# DP over gloo, resume from APPORTION_CHECKPOINT_DIR, checkpoint and exit 0 on SIGTERM, one
# progress line per step. Every rank records the contract variables it was given.
TRAIN = textwrap.dedent('''
    import json, os, signal, sys, time

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    plan = json.loads(os.environ["APPORTION_PLAN"])
    target = int(os.environ["APPORTION_ITERATIONS"])
    ckdir, progress = os.environ["APPORTION_CHECKPOINT_DIR"], os.environ["APPORTION_PROGRESS_FILE"]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    os.makedirs(ckdir, exist_ok=True)
    with open(os.path.join(ckdir, "ranks.jsonl"), "a") as fh:
        fh.write(json.dumps({k: os.environ.get(k) for k in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "APPORTION_JOB_ID", "APPORTION_ITERATIONS", "APPORTION_LAUNCH_ID", "SLURMD_NODENAME",
            "SLURM_PROCID")}) + "\\n")
    import torch  # after the record: a rank stopped during torch's slow import has written it
    import torch.distributed as dist
    assert plan["dp"] * plan["tp"] * plan["pp"] == world, (plan, world)
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path, start = os.path.join(ckdir, "state.pt"), 0
    if os.path.exists(path):
        st = torch.load(path)
        model.load_state_dict(st["model"]); opt.load_state_dict(st["opt"]); start = st["iteration"]
    w_true, B, it = torch.tensor([[1.0], [-2.0], [0.5], [3.0]]), 8, start
    while it < target:
        flag = torch.tensor([1.0 if stop else 0.0])
        if world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            break
        x = torch.randn(B, 4, generator=torch.Generator().manual_seed(it))
        lo, hi = rank * B // world, (rank + 1) * B // world
        loss = ((model(x[lo:hi]) - x[lo:hi] @ w_true) ** 2).mean()
        opt.zero_grad(); loss.backward()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad); p.grad /= world
        opt.step()
        it += 1
        try:  # the test sets the pace (seconds a step) in a file
            time.sleep(float(open(os.environ["PACE_FILE"]).read()))
        except (KeyError, OSError, ValueError):
            time.sleep(0.1)
        if rank == 0:
            with open(progress, "a") as fh:
                fh.write(json.dumps({"iteration": it, "loss": float(loss), "world": world,
                                     "plan": [plan["dp"], plan["tp"], plan["pp"]],
                                     "resumed_from": start,
                                     "launch": os.environ["APPORTION_LAUNCH_ID"]}) + "\\n")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iteration": it},
                   path + ".tmp")
        os.replace(path + ".tmp", path)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
''')

# Contract-only scripts without torch (start in milliseconds) for the executor's own paths.
SLEEPER = textwrap.dedent('''
    import json, os, signal, sys, time
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    if not os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ck = os.path.join(os.environ["APPORTION_CHECKPOINT_DIR"], "it")
    os.makedirs(os.path.dirname(ck), exist_ok=True)
    it = int(open(ck).read()) if os.path.exists(ck) else 0
    while it < int(os.environ["APPORTION_ITERATIONS"]) and not stop:
        time.sleep(0.1)
        it += 1
        if os.environ["RANK"] == "0":
            with open(os.environ["APPORTION_PROGRESS_FILE"], "a") as fh:
                fh.write(json.dumps({"iteration": it}) + "\\n")
    if os.environ["RANK"] == "0":
        open(ck, "w").write(str(it))
''')
CRASHER = textwrap.dedent('''
    import os, sys, time
    if os.environ["RANK"] == "1":
        time.sleep(0.3)
        print("loading shard 7", file=sys.stderr)
        print("ValueError: boom: the data file is corrupt", file=sys.stderr)
        sys.exit(3)
    time.sleep(60)
''')


def _require_slurm() -> None:
    missing = missing_binaries()
    why = (f"Slurm is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm "
           "munge)" if missing else "a private Slurm cluster needs root" if os.geteuid() else "")
    if why:
        if os.environ.get("APPORTION_REQUIRE_SLURM") == "1":
            pytest.fail(f"APPORTION_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    _require_slurm()
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    old = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ.update(cluster.env())
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _cli(*args: str, cwd: Path, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=120, **kw)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    except FileNotFoundError:
        return []


def _until(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:g}s: {what}")


def test_cluster_import_from_live_slurm(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _cli("cluster", "import", "--from", "slurm", "--out", "c.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cl = load_cluster(tmp_path / "c.yaml")
    assert {n: (x.gpu_type, x.gpus, x.cpus) for n, x in cl.nodes.items()} == {
        "a40-0": ("A40", 2, 4), "a10-0": ("A10", 2, 4)}
    groups = {g.prefix: g for g in cl.groups}
    assert groups["a40"].label("gpu_type_raw") == "a40"
    assert groups["a10"].label("slurm_partitions") == "main"
    assert abs(cl.nodes["a40-0"].host_memory_gib - 8000 / 1024) < 0.01


def test_cluster_import_sees_drained_and_busy_nodes(slurm: LocalSlurm, tmp_path: Path) -> None:
    """A drained node is left out and a node a job holds one GPU of offers the other, each
    said with why; --include-unavailable keeps both whole. (22.05's scontrol has no --json:
    the import reads `scontrol -d show node -o`, whose GresUsed says what jobs hold.)"""
    env = {**os.environ, **slurm.env()}

    def sh(*args: str) -> str:
        r = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    sh("scontrol", "update", "nodename=a40-0", "state=drain", "reason=fan failure")
    job = sh("sbatch", "--parsable", "-w", "a10-0", "--gres=gpu:a10:1", "-c", "1", "--wrap",
             "sleep 600").strip().split(";")[0]
    try:
        _until(lambda: "RUNNING" in sh("squeue", "-h", "-j", job, "-o", "%T"), 60,
               "the job holding one A10 runs")
        r = _cli("cluster", "import", "--from", "slurm", "--out", "c.yaml", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "a40-0" in r.stderr and "drained" in r.stderr and "fan failure" in r.stderr
        assert "1 of 2 GPUs in use by running jobs" in r.stderr
        cl = load_cluster(tmp_path / "c.yaml")
        assert {n: (x.gpus, x.cpus) for n, x in cl.nodes.items()} == {"a10-0": (1, 3)}
        r = _cli("cluster", "import", "--from", "slurm", "--include-unavailable", "--out",
                 "all.yaml", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        cl = load_cluster(tmp_path / "all.yaml")
        assert {n: x.gpus for n, x in cl.nodes.items()} == {"a40-0": 2, "a10-0": 2}
    finally:
        sh("scancel", job)
        sh("scontrol", "update", "nodename=a40-0", "state=resume")
        slurm.wait_idle(60)


def test_run_trains_user_jobs_through_a_killed_scheduler_and_a_resize(slurm: LocalSlurm,
                                                                      tmp_path: Path) -> None:
    """a and x take both GPU types, two GPUs each (every GPU); `apportion run` is killed
    (SIGKILL) while they train; b is submitted; the restarted run adopts a and x from Slurm
    (no second launch), and one of them is shrunk to make room for b: TERM, checkpoint,
    resubmit, resume on one GPU. (With 1-GPU requests a and x left two GPUs idle, b took
    them, and whether a job moved at all was the objective's close call: its keep bonus.)"""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TRAIN)
    assert _cli("cluster", "import", "--from", "slurm", "--out", "c.yaml",
                cwd=tmp_path).returncode == 0
    iters = {"a": 80, "x": 80, "b": 15}
    gpus = {"a": 2, "x": 2, "b": 1}
    # a model whose estimate gains from a second GPU (gpt-tiny's does not: two GPUs only add
    # its all-reduce), so a and x are placed on both GPU types and b needs one of theirs
    spec = {"a": ("bert-336m", 64), "x": ("bert-336m", 64), "b": ("gpt-tiny", 8)}
    pace = tmp_path / "pace"
    pace.write_text("0.3")  # slow until the resize is seen: a and x are still running then

    def job(jid: str) -> dict[str, Any]:
        return {"id": jid, "model": spec[jid][0], "global_batch_size": spec[jid][1],
                "iterations": iters[jid], "requested_gpus": gpus[jid],
                "workload": {"kind": "torchrun", "command": [sys.executable,
                                                             str(tmp_path / "train.py")],
                             "env": {"PACE_FILE": str(pace)}}}

    (tmp_path / "first.yaml").write_text(yaml.safe_dump({"jobs": [job("a"), job("x")]}))
    (tmp_path / "later.yaml").write_text(yaml.safe_dump({"jobs": [job("b")]}))
    assert _cli("submit", "first.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    runs = tmp_path / "runs"
    progress = {j: runs / job_dirname(j) / "progress.jsonl" for j in iters}
    argv = [sys.executable, "-m", "apportion.cli", "run", "--executor", "slurm", "--cluster",
            "c.yaml", "--state", "s.db", "--workdir", "runs", "--interval", "2", "--until-idle",
            "--timeout", "150", "--time-budget", "2"]
    env = {**os.environ, "APPORTION_SLURM_GRACE_S": "30"}
    # the first run makes one round only: its later rounds, refitted on the paced (slow)
    # iterations, may grow a and x onto idle GPUs, and a kill in the middle of that resize
    # leaves nothing to adopt (the run then requeues them, rightly, but not what this tests)
    first_argv = [*argv[:argv.index("--interval")], "--interval", "60",
                  *argv[argv.index("--interval") + 2:]]
    with open(tmp_path / "run1.log", "w") as log1:
        first = subprocess.Popen(first_argv, cwd=tmp_path, stdout=log1, stderr=log1, env=env)
        try:
            _until(lambda: all(len(_lines(progress[j])) >= 3 for j in "ax"), 90,
                   "a and x train 3 iterations")
            first.send_signal(signal.SIGKILL)  # the scheduler dies; Slurm keeps the jobs running
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
    assert _cli("submit", "later.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    with open(tmp_path / "run2.log", "w") as log2:
        second = subprocess.Popen(argv, cwd=tmp_path, stdout=log2, stderr=log2, env=env)
        try:
            _until(lambda: any(ln["resumed_from"] > 0 for j in "ax" for ln in _lines(progress[j])),
                   120, "a or x resumes after a resize")
            pace.write_text("0.02")
            second.wait(150)
        finally:
            if second.poll() is None:
                second.kill()
    log = (tmp_path / "run1.log").read_text() + (tmp_path / "run2.log").read_text()
    assert second.returncode == 0, log[-4000:]
    for jid in "ax":  # taken over from Slurm, not launched a second time
        assert f"adopted {jid}: slurm job" in log, log[-3000:]
        assert f"job {jid}: no worker runs it" not in log, log[-3000:]  # kept, not requeued
    status = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    by_id = {j["id"]: j for j in status["jobs"]}
    for jid, n in iters.items():
        assert (by_id[jid]["state"], by_id[jid]["iterations_done"]) == ("finished", n), \
            (by_id[jid], log[-3000:])
    hist = json.loads(_cli("history", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    rounds = hist["rounds"] if isinstance(hist, dict) else hist
    acts = [(a["job"], a["action"]) for r in rounds for a in r.get("actions", [])]
    moved = {j for j, act in acts if act in ("resize", "migrate") and j in "ax"}
    assert moved, acts
    relaunched = set()
    for jid in moved:  # resumed from its checkpoint on a new world size, no step lost or repeated
        lines = _lines(progress[jid])
        assert [ln["iteration"] for ln in lines] == list(range(1, iters[jid] + 1)), lines
        if len({ln["launch"] for ln in lines}) == 1:
            continue  # it took its last step before the move reached it: nothing to resume
        relaunched.add(jid)
        resumed = [ln for ln in lines if ln["resumed_from"] > 0]
        assert resumed and resumed[0]["iteration"] == resumed[0]["resumed_from"] + 1
        # a resize relaunches on another world size or plan (a new TP degree is a resize too)
        changed = (resumed[0]["world"], resumed[0]["plan"]) != (lines[0]["world"], lines[0]["plan"])
        assert changed or (jid, "migrate") in acts, (resumed[0], lines[0], acts)
    assert relaunched, acts  # the shrink that made room for b at least
    # every rank of every launch got the contract's variables, MASTER_ADDR the first node's
    for jid in "abx":
        ranks = _lines(runs / job_dirname(jid) / "checkpoint" / "ranks.jsonl")
        assert ranks
        by_launch: dict[str, list[dict[str, Any]]] = {}
        for rk in ranks:
            by_launch.setdefault(rk["APPORTION_LAUNCH_ID"], []).append(rk)
            assert rk["MASTER_ADDR"] == "127.0.0.1" and int(rk["MASTER_PORT"]) > 0
            assert rk["APPORTION_JOB_ID"] == jid and rk["SLURMD_NODENAME"] in ("a40-0", "a10-0")
            assert rk["SLURM_PROCID"] is None  # the agents' Slurm task variables are not the ranks'
        trained = {ln["launch"] for ln in _lines(progress[jid])}
        assert trained and trained <= set(by_launch), (trained, set(by_launch))
        for launch, group in by_launch.items():
            world = int(group[0]["WORLD_SIZE"])
            ranks = sorted(int(g["RANK"]) for g in group)
            assert len(set(ranks)) == len(ranks) and set(ranks) <= set(range(world)), group
            if launch in trained:  # a group stopped before all its ranks ran records fewer
                assert ranks == list(range(world)), group
            assert len({g["MASTER_PORT"] for g in group}) == 1


# -- the executor's own paths, with torch-free contract scripts ------------------------------
REPORT = SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False)


def _decision(*allocs: Allocation) -> Decision:
    return Decision(list(allocs), [], REPORT)


def _alloc(job: str, placement: dict[str, int], gpu_type: str = "A40",
           action: Action = Action.START) -> Allocation:
    n = sum(placement.values())
    return Allocation(job, gpu_type, n, 1, ExecutionPlan(dp=n), placement, 1.0, action,
                      cpus=n, host_memory_gib=float(n))


def _wait(ex: SlurmExecutor, job: str, cond: Callable[[Progress], bool],
          timeout_s: float = 60) -> Progress:
    def check() -> Progress | None:
        return next((p for p in ex.poll() if p.job == job and cond(p)), None)
    return _until(check, timeout_s, f"{job}: {ex.poll()}")


def test_a_crashing_rank_fails_the_job_with_its_stderr(slurm: LocalSlurm, tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(CRASHER)
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=10)
    job = JobSpec("c", "gpt-tiny", 8, 10, 2,
                  workload=Workload("torchrun", (sys.executable, str(tmp_path / "crash.py"))))
    ex.apply(_decision(_alloc("c", {"a10-0": 2}, "A10")), [job])
    p = _wait(ex, "c", lambda p: p.done, 60)
    assert p.health == Health.FAILED
    assert "rank 1 on a10-0 exited with 3" in (p.error or ""), p.error
    assert "boom: the data file is corrupt" in (p.error or "")
    assert "loading shard 7" in (p.error or "")
    # the sibling rank was stopped instead of waiting forever for its peer
    exits = json.loads(next((tmp_path / "runs" / job_dirname("c")).glob("slurm-exit-*")).read_text())
    assert exits["codes"]["1"] == 3 and exits["codes"]["0"] in (-15, 0)


def test_heterogeneous_counts_adoption_and_checkpoint_on_shutdown(slurm: LocalSlurm,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    wl = Workload("torchrun", (sys.executable, str(tmp_path / "sleeper.py")))
    job = JobSpec("h", "gpt-tiny", 8, 100000, 3, workload=wl)
    # 2 GPUs on one node, 1 on the other: a heterogeneous job (one component per count)
    alloc = _alloc("h", {"a40-0": 2, "a10-0": 1})
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    (ev,) = ex.apply(_decision(alloc), [job])
    script = Path(ev.spec["script"]).read_text()
    assert ev.action == "start" and ev.spec["sbatch"] == ["sbatch", "--parsable",
                                                          ev.spec["script"]]
    assert "#SBATCH hetjob" in script  # what was submitted is the script's own lines
    assert "#SBATCH --gres=gpu:a40:2" in script and "#SBATCH --gres=gpu:a10:1" in script
    _wait(ex, "h", lambda p: p.health == Health.RUNNING and p.iterations_done >= 3)
    sid = ex.slurm_job("h")
    out = subprocess.run(["squeue", "-h", "-o", "%i %N", "-j", sid], capture_output=True,
                         text=True, check=True).stdout.split()
    assert sorted(out) == sorted([f"{sid}+0", "a10-0", f"{sid}+1", "a40-0"]), out

    # a new executor on the same folder (apportion restarted) adopts the running job, even if
    # the old one was killed before it recorded the job id (found by the job's comment)
    record = tmp_path / "runs" / job_dirname("h") / "slurm-job.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "slurm_job_id": ""}))
    ex2 = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    assert ex2.slurm_job("h") == sid and ex2.adopted_jobs() == {"h"}
    (keep,) = ex2.apply(_decision(replace_action(alloc, Action.KEEP)), [job])
    assert keep.action == "keep" and ex2.slurm_job("h") == sid
    before = _wait(ex2, "h", lambda p: p.iterations_done >= 5).iterations_done
    (stop,) = ex2.shutdown(checkpoint=True)
    assert stop.detail == "checkpointed on shutdown"
    (p,) = ex2.poll()
    assert p.health == Health.CHECKPOINTED and p.iterations_done >= before
    saved = int((tmp_path / "runs" / job_dirname("h") / "checkpoint" / "it").read_text())
    assert saved == p.iterations_done  # the SIGTERM checkpoint is where progress stopped


def test_orphans_stop_checkpoints_and_stops_what_an_earlier_run_left(slurm: LocalSlurm,
                                                                     tmp_path: Path) -> None:
    """`run --orphans stop` after a restart: the Slurm job a killed run left is stopped with
    a checkpoint (not left running unmanaged, not adopted)."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    wl = Workload("torchrun", (sys.executable, str(tmp_path / "sleeper.py")))
    job = JobSpec("o", "gpt-tiny", 8, 100000, 1, workload=wl)
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    ex.apply(_decision(_alloc("o", {"a40-0": 1})), [job])
    _wait(ex, "o", lambda p: p.health == Health.RUNNING and p.iterations_done >= 3)
    sid = ex.slurm_job("o")
    ex2 = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    assert ex2.adopted_jobs() == {"o"}
    ex2.stop_adopted()
    assert ex2.adopted_jobs() == set()
    (p,) = ex2.poll()
    assert p.health == Health.CHECKPOINTED and p.iterations_done >= 3
    live = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", sid], capture_output=True,
                          text=True, check=False).stdout.split()
    assert not any(s in ("RUNNING", "PENDING", "COMPLETING") for s in live), live
    saved = int((tmp_path / "runs" / job_dirname("o") / "checkpoint" / "it").read_text())
    assert saved == p.iterations_done


def test_a_job_ignoring_sigterm_is_cancelled_after_the_grace_period(slurm: LocalSlurm,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    wl = Workload("torchrun", (sys.executable, str(tmp_path / "sleeper.py")),
                  env={"IGNORE_TERM": "1"})
    job = JobSpec("g", "gpt-tiny", 8, 100000, 1, workload=wl)
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=2)
    ex.apply(_decision(_alloc("g", {"a40-0": 1})), [job])
    _wait(ex, "g", lambda p: p.health == Health.RUNNING)
    t0 = time.monotonic()
    (ev,) = ex.apply(_decision(), [job])  # no allocation any more: preempt
    assert ev.action == "preempt" and "killed after the 2s grace" in ev.detail
    assert time.monotonic() - t0 < 30
    (p,) = ex.poll()
    assert p.health == Health.CHECKPOINTED  # resumable from its last checkpoint


def replace_action(a: Allocation, action: Action) -> Allocation:
    from dataclasses import replace

    return replace(a, action=action)


def test_builtin_trainer_across_two_nodes(slurm: LocalSlurm, tmp_path: Path) -> None:
    """No workload: apportion's own trainer, DDP over gloo between the two slurmd nodes."""
    pytest.importorskip("torch")
    job = JobSpec("t", "gpt-tiny", 8, 4, 2)
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    (ev,) = ex.apply(_decision(_alloc("t", {"a40-0": 1, "a10-0": 1})), [job])
    assert ev.spec["command"][-3:-1] == ["-m", "apportion.runtime.workers.trainer"]
    p = _wait(ex, "t", lambda p: p.done, 120)
    assert (p.health, p.iterations_done, p.error) == (Health.FINISHED, 4, None)
    worlds = [json.loads(s)["world"] for s in (tmp_path / "runs" / job_dirname("t") /
                                               "losses.jsonl").read_text().splitlines()]
    assert worlds == [2, 2, 2, 2]


def test_the_slurm_executor_behaves_as_every_executor(slurm: LocalSlurm, tmp_path: Path) -> None:
    """The executors' behaviour suite (:func:`apportion.testing.check_executor_behaviour`,
    run on local and Ray in tests/test_conformance.py) on Slurm: start, progress, a resize
    resumed on two workers, a neighbour whose command cannot start failing alone,
    preemption to a checkpoint, shutdown. The nodes have two GPUs each, so the failing job
    goes to the other node."""
    pytest.importorskip("torch")
    from apportion.config import cluster_from_data
    from apportion.testing import check_executor_behaviour

    cluster = cluster_from_data({"name": "slurm", "node_groups": [
        _node_group("a40-0", "A40", 2, 4, 7), _node_group("a10-0", "A10", 2, 4, 7)]}, "slurm")
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=20)
    check_executor_behaviour(ex, cluster, node="a40-0", other_node="a10-0", timeout_s=300)


# -- a launch Slurm refuses is the job's failure; requests fit what the nodes have -------------
def _node_group(name: str, gpu_type: str, gpus: int, cpus: int, mem_gib: float) -> dict[str, Any]:
    return {"prefix": name.split("-")[0], "nodes": [name], "gpu_type": gpu_type,
            "gpus_per_node": gpus, "cpus_per_node": cpus, "host_memory_gib": mem_gib,
            "intra_node_link": "pcie"}


def _sleeper_job(tmp: Path, jid: str, gpus: int, iterations: int, batch: int = 64
                 ) -> dict[str, Any]:
    return {"id": jid, "model": "gpt-tiny", "global_batch_size": batch, "iterations": iterations,
            "requested_gpus": gpus, "workload": {"kind": "torchrun", "command": [
                sys.executable, str(tmp / "sleeper.py")]}}


def _slurm_run(tmp: Path, timeout_s: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apportion.cli", "run", "--executor", "slurm", "--cluster",
         "c.yaml", "--state", "s.db", "--workdir", "runs", "--interval", "2", "--until-idle",
         "--timeout", str(timeout_s), "--time-budget", "2", *extra],
        cwd=tmp, capture_output=True, text=True, timeout=timeout_s + 200, check=False,
        env={**os.environ, "APPORTION_SLURM_GRACE_S": "10"})


def _status(tmp: Path) -> dict[str, dict[str, Any]]:
    out = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp).stdout)
    return {j["id"]: j for j in out["jobs"]}


def test_run_asks_slurm_for_what_its_nodes_have(slurm: LocalSlurm, tmp_path: Path) -> None:
    """The reported case: the cluster file says ``host_memory_gib: 8`` (8192 MiB) and 8 CPUs
    per node, Slurm's nodes have RealMemory=8000 and 4 CPUs. Each job can only take a whole
    node (two GPUs: it asks for 4, half of that is the only count a node holds), so every
    sbatch asked for 8192 MiB and 8 CPUs, was refused every round, and status said running
    until the run timed out. Requests are now capped at what Slurm says each node has, the
    disagreement is a warning without -v, and both jobs train to the end."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "c", "node_groups": [
        _node_group("a40-0", "A40", 2, 8, 8), _node_group("a10-0", "A10", 2, 8, 8)]}))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        _sleeper_job(tmp_path, "p", 4, 20), _sleeper_job(tmp_path, "q", 4, 20)]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _slurm_run(tmp_path, 150, "--max-retries", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    st = _status(tmp_path)
    for jid in "pq":
        assert (st[jid]["state"], st[jid]["iterations_done"]) == ("finished", 20), \
            (st[jid], r.stderr[-3000:])
    warned = [ln for ln in r.stderr.splitlines() if "WARNING" in ln and "a40-0" in ln]
    assert any("host_memory_gib" in ln and "RealMemory" in ln for ln in warned), r.stderr[-3000:]
    assert any("cpus_per_node" in ln for ln in warned), r.stderr[-3000:]


def test_a_refused_job_fails_after_max_retries_while_its_neighbour_finishes(
        slurm: LocalSlurm, tmp_path: Path) -> None:
    """A genuinely impossible request: the cluster file says a40-0 has 4 GPUs (Slurm's Gres
    has 2), and ``big`` fits only there (3 A40s: half its 6, more than a10-0 has). sbatch
    refuses it every time; each refusal is a failed launch in the store with Slurm's own
    message, counted towards --max-retries, and the job ends failed with that reason, while
    ``small`` (one or two GPUs, which Slurm grants) trains to the end. Before, the refusal was
    never counted: big stayed `running` until the run's timeout."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "c", "node_groups": [
        _node_group("a40-0", "A40", 4, 4, 8000 / 1024),
        _node_group("a10-0", "A10", 2, 4, 8000 / 1024)]}))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        _sleeper_job(tmp_path, "big", 6, 20, batch=96),
        # at most the two GPUs Slurm has on a node: grown into a40-0's claimed four, it
        # would be refused like big
        {**_sleeper_job(tmp_path, "small", 1, 30), "max_gpus": 2}]}))
    assert _cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _slurm_run(tmp_path, 120, "--max-retries", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    st = _status(tmp_path)
    assert (st["small"]["state"], st["small"]["iterations_done"]) == ("finished", 30), \
        (st["small"], r.stderr[-3000:])
    big = st["big"]
    assert big["state"] == "failed", (big, r.stderr[-3000:])
    assert "2 times in a row" in big["reason"] and "sbatch" in big["reason"], big
    assert "Requested node configuration is not available" in big["reason"], big
    assert any("WARNING" in ln and "a40-0" in ln and "GPUs" in ln
               for ln in r.stderr.splitlines()), r.stderr[-3000:]
    from apportion import store_launches as sl
    from apportion.store import open_store

    store = open_store(tmp_path / "s.db", create=False)
    try:
        recs = sl.launches(store, "big")
    finally:
        store.close()
    assert [(x.executor, x.outcome) for x in recs] == [("slurm", "failed")] * 2, recs
    assert all("Requested node configuration" in x.detail for x in recs), recs


def test_a_missing_command_and_an_early_exit_fail_their_launches(slurm: LocalSlurm,
                                                                 tmp_path: Path) -> None:
    """Through the executor, with the launch log the run gives it: a command that does not
    exist fails its launch with the reason (the agent reports a rank that cannot start, and
    stops nothing else), a workload that exits 0 short of its target without being asked to
    stop is a failure (it was `checkpointed`, so relaunched for ever), and both launch
    records say failed with those reasons."""
    from apportion.runtime.executors.executor import MemoryLaunchLog

    logbook = MemoryLaunchLog()
    ex = SlurmExecutor(tmp_path / "runs", query_interval_s=0.2, grace_s=10, launch_log=logbook)
    missing = JobSpec("m", "gpt-tiny", 8, 10, 1,
                      workload=Workload("torchrun", ("/nonexistent/binary",)))
    short = JobSpec("s", "gpt-tiny", 8, 10, 1,
                    workload=Workload("torchrun", (sys.executable, "-c", "pass")))
    ex.apply(_decision(_alloc("m", {"a40-0": 1}), _alloc("s", {"a10-0": 1}, "A10")),
             [missing, short])
    m = _wait(ex, "m", lambda p: p.done, 90)
    s = _wait(ex, "s", lambda p: p.done, 90)
    assert m.health == Health.FAILED and "rank 0 on a40-0 exited with 127" in (m.error or "")
    assert "cannot start ['/nonexistent/binary']: FileNotFoundError" in (m.error or ""), m.error
    assert s.health == Health.FAILED, s
    assert "exited 0 at iteration 0 of 10 without being asked to stop" in (s.error or ""), s
    ended = {r["job"]: r for r in logbook.records.values()}
    assert {j: (r["state"], r["outcome"]) for j, r in ended.items()} == {
        "m": ("ended", "failed"), "s": ("ended", "failed")}
    assert "cannot start" in ended["m"]["detail"] and "exited 0" in ended["s"]["detail"]
