"""The kill test: random SIGKILLs of ``apportion run`` and of its workers, then the audit.

``python -m apportion.runtime.killtest --kills 200 --json out.json`` submits
small built-in jobs (periodic checkpoints every few iterations) to a fresh
store, runs ``apportion run --executor local`` in a child process and, at
random moments, SIGKILLs either the run (its workers live on; the next run
adopts or stops them) or one worker of a running group (the fault policy
relaunches the job from its checkpoint). A killed run is started again; when
every job has finished, a new batch is submitted, until the kills are spent.
Then a last run finishes everything without interference and the audit reads
what the workers wrote:

* **jobs lost**: submitted jobs the store does not show finished with all
  their iterations;
* **steps trained twice**: steps of a job trained by two worker groups at the
  same time (their step intervals overlap), or retrained although a newer
  checkpoint existed when the group started (it resumed from an older one);
* **resume mismatches**: a group that did not start from the newest
  checkpoint on disk (older: trained twice; newer: impossible);
* **progress lost** per group that died: its last trained step minus the
  checkpoint the next group resumed from (must be at most one checkpoint
  interval);
* **loss agreement**: a step trained again after a kill has the same loss as
  the first time (same data, same state: the resumed trajectory is exact).

Each kill is recorded with its target and the phase the store shows at that
instant (no round yet, launching, running, stopping), so the figures say
which code paths were hit. ``tests/test_runtime_kills.py`` runs a short
version; the full soak is for ``make``-less measurement (minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from apportion.runtime.executors.procs import alive, folder_free, lock_holders

from apportion.jobs import job_dirname

CKPT_EVERY = 5
MODELS = ("bert-tiny", "gpt-tiny")


def _cli(*args: str, cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _submit(root: Path, batch: int, jobs: int, iterations: int, rng: random.Random) -> list[str]:
    ids = [f"b{batch}-j{k}" for k in range(jobs)]
    lines = ["jobs:"]
    for k, jid in enumerate(ids):
        lines.append(f"  - {{id: {jid}, model: {MODELS[k % len(MODELS)]}, global_batch_size: 4,"
                     f" iterations: {iterations + rng.randrange(0, 20)}, requested_gpus: "
                     f"{1 + k % 2}}}")
    (root / f"batch{batch}.yaml").write_text("\n".join(lines) + "\n")
    r = _cli("submit", f"batch{batch}.yaml", "--state", "s.db", cwd=root)
    if r.returncode != 0:
        raise RuntimeError(f"submit failed: {r.stderr}")
    return ids


def _start_run(root: Path, n: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    log = open(root / f"run{n:04d}.log", "wb")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        [sys.executable, "-m", "apportion.cli", "run", "--executor", "local", "--cluster",
         "local", "--state", "s.db", "--workdir", "runs", "--interval", "2", "--until-idle",
         "--time-budget", "2", "--checkpoint-every", str(CKPT_EVERY), "--checkpoint-interval",
         "0", "--max-retries", "1000", "--grace-period", "20", *extra],
        cwd=root, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def _ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)


def _rounds_by(db: Path, pid: int) -> int:
    """Rounds committed by the run with this pid (its round keys are run-<start>-<pid>-<i>)."""
    try:
        with _ro(db) as c:
            return int(c.execute("SELECT COUNT(*) FROM rounds WHERE round_key LIKE ?",
                                 (f"run-%-{pid}-%",)).fetchone()[0])
    except sqlite3.Error:
        return 0


def _phase(db: Path, pid: int) -> tuple[str, list[tuple[int, int]]]:
    """What the store shows now, and the live workers (pid, start ticks) of running launches."""
    rounds = _rounds_by(db, pid)
    try:
        with _ro(db) as c:
            rows = c.execute("SELECT state, workers_json FROM launches WHERE state != 'ended'"
                             ).fetchall()
    except sqlite3.Error:
        return "store busy", []
    states = Counter(r[0] for r in rows)
    workers = [(int(w["pid"]), w.get("start_ticks")) for st, wj in rows if st == "running"
               for w in json.loads(wj) if w.get("pid")]
    workers = [(p, t) for p, t in workers if alive(p, t)]
    if states.get("intended"):
        phase = "launching"
    elif states.get("stopping"):
        phase = "stopping"
    elif states.get("running"):
        phase = "running"
    elif rounds == 0:
        phase = "starting (reconcile, first round)"
    else:
        phase = "between launches"
    return phase, workers


def _wait_for(cond: Any, proc: subprocess.Popen, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < deadline and not cond():
        time.sleep(0.2)


def soak(root: Path, kills: int = 200, seed: int = 0, jobs: int = 3, iterations: int = 40,
         worker_share: float = 0.5, gap: tuple[float, float] = (0.2, 8.0),

         final_timeout_s: float = 900.0, log: Any = None) -> dict[str, Any]:
    """Kill, restart, audit; returns the figures (see the module docstring)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    db = root / "s.db"
    t0 = time.monotonic()
    submitted = _submit(root, 0, jobs, iterations, rng)
    batch, runs = 0, 0
    points: list[dict[str, Any]] = []
    proc = None
    while len(points) < kills:
        if proc is None or proc.poll() is not None:
            if proc is not None and proc.returncode == 0 and _all_finished(db, submitted):
                batch += 1
                submitted += _submit(root, batch, jobs, iterations, rng)
            runs += 1
            proc = _start_run(root, runs)
        aim, pid = rng.random(), proc.pid  # which phase this kill aims at
        if aim < 0.15:
            pass  # anywhere, most likely while the run starts
        elif aim < 0.3:
            _wait_for(lambda pid=pid: _phase(db, pid)[0] == "launching", proc, 60.0)
        else:
            _wait_for(lambda pid=pid: bool(_phase(db, pid)[1]), proc, 120.0)
        time.sleep(rng.uniform(0.0, 2.0) if 0.15 <= aim < 0.3 else rng.uniform(*gap))
        if proc.poll() is not None:
            continue  # it finished on its own (or exited); start again
        phase, workers = _phase(db, proc.pid)
        if workers and rng.random() < worker_share:
            victim, _ = rng.choice(workers)
            target = "worker"
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
        else:
            target = "run"
            proc.kill()
            proc.wait()
            proc = None
        points.append({"t": round(time.monotonic() - t0, 2), "target": target, "phase": phase})
        if log is not None:
            log(f"kill {len(points)}/{kills}: {target} while {phase}")
    if proc is not None and proc.poll() is None:
        proc.wait(timeout=final_timeout_s)
    runs += 1
    final = _start_run(root, runs)
    try:
        final.wait(timeout=final_timeout_s)
    except subprocess.TimeoutExpired:
        final.kill()
    audit_res = audit(root, submitted)
    audit_res["kills"] = len(points)
    audit_res["kill_points"] = {
        "by_target": dict(Counter(p["target"] for p in points)),
        "by_phase": dict(Counter(f"{p['target']}: {p['phase']}" for p in points))}
    audit_res["runs_started"] = runs
    audit_res["final_run_exit"] = final.returncode
    audit_res["wall_s"] = round(time.monotonic() - t0, 1)
    audit_res["points"] = points
    return audit_res


def _all_finished(db: Path, ids: list[str]) -> bool:
    with _ro(db) as c:
        states = dict(c.execute("SELECT id, state FROM jobs").fetchall())
    return all(states.get(j) == "finished" for j in ids)


def audit(root: Path, ids: list[str]) -> dict[str, Any]:
    """Read the store and every job's step log; count what was lost or trained twice."""
    db = root / "s.db"
    with _ro(db) as c:
        rows = {r[0]: r[1:] for r in c.execute(
            "SELECT id, state, iterations, iterations_done FROM jobs").fetchall()}
        launches = c.execute("SELECT job, outcome, state FROM launches").fetchall()
        adopted = c.execute("SELECT COUNT(*) FROM launch_events WHERE why LIKE 'adopted%'"
                            ).fetchone()[0]
        lids = [r[0] for r in c.execute("SELECT id FROM launches ORDER BY id").fetchall()]
    lost = [j for j in ids if rows.get(j, ("?", 0, -1))[0] != "finished"
            or rows[j][2] != rows[j][1]]
    twice_concurrent = twice_stale = 0
    resume_older = resume_newer = 0
    lost_steps: list[int] = []
    loss_diff = 0.0
    groups_total = 0
    leftovers = []
    for j in ids:
        jobdir = root / "runs" / job_dirname(j)
        if not folder_free(jobdir):
            leftovers.extend(lock_holders(jobdir))
        losses_path = jobdir / "losses.jsonl"
        if not losses_path.exists():
            continue
        steps = _steps_by_launch(losses_path)
        ckpts = _checkpoints(jobdir / "progress.jsonl")
        order = sorted(steps.items(), key=lambda kv: kv[1][0]["wall"])
        groups_total += len(order)
        first_loss: dict[int, float] = {}
        prev_last = 0
        for k, (_lid, recs) in enumerate(order):
            start_wall = recs[0]["wall"] - recs[0]["time_s"]
            resumed = recs[0]["iteration"] - 1
            newest = max([it for w, it in ckpts if w <= start_wall], default=0)
            if resumed < newest:
                resume_older += 1
                twice_stale += newest - resumed
            elif resumed > newest:
                resume_newer += 1
            if k > 0:
                lost_steps.append(max(0, prev_last - resumed))
            prev_last = recs[-1]["iteration"]
            for other_lid, other in order[:k]:
                o_start, o_end = other[0]["wall"] - other[0]["time_s"], other[-1]["wall"]
                twice_concurrent += sum(1 for r in recs if o_start < r["wall"] - r["time_s"]
                                        < o_end)
            for r in recs:
                it = int(r["iteration"])
                if it in first_loss:
                    loss_diff = max(loss_diff, abs(first_loss[it] - float(r["loss"])))
                else:
                    first_loss[it] = float(r["loss"])
    outcomes = Counter(o for _, o, _ in launches)
    return {
        "jobs_submitted": len(ids), "jobs_finished": len(ids) - len(lost), "jobs_lost": len(lost),
        "lost_ids": lost,
        "steps_trained_twice": twice_concurrent + twice_stale,
        "steps_trained_by_two_groups_at_once": twice_concurrent,
        "steps_retrained_from_a_stale_checkpoint": twice_stale,
        "resumed_from_older_checkpoint": resume_older,
        "resumed_from_newer_checkpoint": resume_newer,
        "checkpoint_every": CKPT_EVERY,
        "progress_lost_steps": {"max": max(lost_steps, default=0),
                                "total": sum(lost_steps),
                                "relaunches": len(lost_steps),
                                "over_one_interval": sum(1 for x in lost_steps
                                                         if x > CKPT_EVERY)},
        "max_loss_difference_on_retrained_steps": loss_diff,
        "worker_groups": groups_total,
        "launch_outcomes": dict(outcomes),
        "launches_adopted": adopted,
        "launch_ids_monotonic": lids == sorted(set(lids)),
        "processes_left_holding_job_folders": leftovers,
    }


def _steps_by_launch(losses_path: Path) -> dict[str, list[dict[str, Any]]]:
    """A job's step log (``losses.jsonl``) per launch, a line cut by a kill skipped."""
    steps: dict[str, list[dict[str, Any]]] = {}
    for line in losses_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        steps.setdefault(str(rec.get("launch_id")), []).append(rec)
    return steps


def _checkpoints(progress_path: Path) -> list[tuple[float, int]]:
    """(wall, iteration) of every checkpoint a job's progress log records (a resume's
    line is not a new checkpoint)."""
    ckpts = []  # (wall, iteration) of every checkpoint line
    for line in progress_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("checkpoint") is True and not rec.get("resumed"):
            ckpts.append((float(rec["wall"]), int(rec["iteration"])))
    return ckpts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SIGKILL apportion run and its workers at random")
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import tempfile
    root = args.dir or Path(tempfile.mkdtemp(prefix="apportion-kills-"))
    res = soak(root, args.kills, args.seed, args.jobs, args.iterations,
               log=lambda m: print(m, file=sys.stderr, flush=True))
    text = json.dumps({k: v for k, v in res.items() if k != "points"}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    ok = (res["jobs_lost"] == 0 and res["steps_trained_twice"] == 0
          and res["resumed_from_older_checkpoint"] == 0
          and res["progress_lost_steps"]["over_one_interval"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
