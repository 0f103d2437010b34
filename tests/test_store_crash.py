"""SIGKILL at random instants: the store always holds the old or the new round, never half,
and no job ever vanishes.

A child process (forked, so it starts in milliseconds) runs rounds against one
database for as long as it lives: it submits batches of jobs, solves real
rounds (the greedy backend, to keep the loop fast), commits them, reports
progress and checkpoints, cancels jobs and reports node faults. The parent
kills it with SIGKILL, either after a random delay or while it is inside a
commit (it watches a phase word the child writes to shared memory), then
opens the database as the next invocation would and checks every invariant.
The next child resumes from the last round the previous one acknowledged, so
a round that was committed but not acknowledged is rerun under the same key,
which exercises the idempotent rerun as well.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import random
import signal
import struct
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest

from apportion.config import cluster_from_data
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.lifecycle import JobState
from apportion.policies import RoundConfig, run_round
from apportion.store import open_store
from apportion.store_faults import effective_cluster, node_fault, node_up

RANDOM_KILLS = 90
TARGETED_KILLS = 45  # aimed at the inside of a round commit
BATCH = 3
PHASES = ["idle", "submit", "solve", "commit", "progress", "cancel", "fault"]
CLUSTER = {"name": "crash", "node_groups": [{"prefix": "n", "count": 4, "gpu_type": "A40",
                                             "gpus_per_node": 4}]}
MODELS = ["bert-0.76b", "moe-0.69b", "wresnet-1b", "bert-1.3b"]


class Shared:
    """Three int32 words in anonymous shared memory: phase, acknowledged rounds, ready flag."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, 16)

    def set(self, i: int, v: int) -> None:
        self.mem[4 * i:4 * i + 4] = struct.pack("i", v)

    def get(self, i: int) -> int:
        return struct.unpack("i", self.mem[4 * i:4 * i + 4])[0]


PHASE, ACKED, READY = 0, 1, 2


def child(db: str, shared: Shared) -> None:  # pragma: no cover - runs in the killed child
    try:
        cluster = cluster_from_data(CLUSTER, "crash")
        store = open_store(db)
        i = shared.get(ACKED)
        rng = random.Random(i)
        shared.set(READY, 1)
        while True:
            now = 60.0 * (i + 1)
            if i % 3 == 0:
                shared.set(PHASE, 1)
                ids = [f"b{i}-{k}" for k in range(BATCH)]
                try:
                    store.submit([JobSpec(x, MODELS[(i + k) % 4], 64, 30, 1 + (i + k) % 2,
                                          submit_time_s=now) for k, x in enumerate(ids)], at=now)
                except InputError:  # submitted before the last kill: resubmitting is refused
                    pass
            shared.set(PHASE, 2)
            snap = store.round_input()
            eff = effective_cluster(store, cluster, now)
            res = run_round(eff, snap.jobs, now, RoundConfig(backend="greedy", search_depth=1))
            shared.set(PHASE, 3)
            store.commit_round(res.decision, snap, eff, now, f"r{i}", at=now)
            shared.set(PHASE, 0)
            shared.set(ACKED, i + 1)
            shared.set(PHASE, 4)
            for rec in store.jobs(frozenset({JobState.RUNNING})):
                store.record_progress(rec.id, min(rec.iterations, rec.iterations_done + 15),
                                      now + 1, checkpoint=rng.random() < 0.5)
            if i % 5 == 4:
                shared.set(PHASE, 5)
                active = store.jobs(frozenset({JobState.QUEUED, JobState.RUNNING}))
                if active:
                    store.cancel(rng.choice(active).id, at=now + 2)
            if i % 7 == 6:
                shared.set(PHASE, 6)
                node = f"n-{i % 4}"
                node_fault(store, node, now + 3, detail="injected", window_s=300)
                node_up(store, node, now + 4)
            shared.set(PHASE, 0)
            i += 1
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def verify(db: Path, acked: int, seen: set[str]) -> tuple[int, set[str]]:
    """Every invariant a crash must not break; returns (rounds in the store, job ids)."""
    with open_store(db) as s:
        assert s.check_invariants() == []
        rounds = s.rounds()
        keys = [r["round_key"] for r in rounds]
        assert keys == [f"r{k}" for k in range(len(keys))], keys  # no gap, no duplicate
        assert len(keys) in (acked, acked + 1), (len(keys), acked)
        jobs = s.jobs()
        ids = {j.id for j in jobs}
        assert seen <= ids, f"jobs vanished: {sorted(seen - ids)}"
        batches = Counter(j.split("-")[0] for j in ids)
        assert all(n == BATCH for n in batches.values()), batches  # a submit is all or nothing
        for j in jobs:
            assert (j.running is not None) == (j.state is JobState.RUNNING)
            assert 0 <= j.checkpoint_iterations <= j.iterations_done <= j.iterations
        # never half a round: every applied change of every round has its job event
        events = Counter((e["round_id"], e["job"]) for e in s.events() if e["round_id"])
        for r in rounds:
            acts = s.actions(r["id"])
            assert len(acts) == r["placed"] + r["pending"]
            moved = {a["job"] for a in acts if a["applied"] and a["action"] != "pending"}
            touched = {job for (rid, job) in events if rid == r["id"]}
            assert moved <= touched <= {a["job"] for a in acts}, r["id"]
        return len(keys), ids


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_at_random_instants_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    open_store(db, create=True).close()
    ctx = mp.get_context("fork")
    shared = Shared()
    rng = random.Random(20240601)
    seen: set[str] = set()
    phases: Counter[str] = Counter()
    kills = 0
    reruns = 0
    plan = ["random"] * RANDOM_KILLS + ["commit"] * TARGETED_KILLS
    rng.shuffle(plan)
    for mode in plan:
        shared.set(READY, 0)
        shared.set(PHASE, 0)
        acked = shared.get(ACKED)
        proc = ctx.Process(target=child, args=(str(db), shared), daemon=True)
        proc.start()
        while not shared.get(READY):
            assert proc.is_alive(), "the child died before it was ready"
            time.sleep(0.001)
        if mode == "random":
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            deadline = time.monotonic() + 20
            while shared.get(PHASE) != 3 and time.monotonic() < deadline:
                assert proc.is_alive(), "the child died on its own"
            time.sleep(rng.uniform(0.0, 0.004))
        phase = PHASES[shared.get(PHASE)]
        assert proc.is_alive(), f"the child exited on its own (code {proc.exitcode})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        kills += 1
        phases[phase] += 1
        in_store, seen = verify(db, shared.get(ACKED), seen)
        if in_store > shared.get(ACKED):
            reruns += 1  # committed, not acknowledged: the next child reruns it by key
        del acked
    with open_store(db) as s:
        states = Counter(j.state.value for j in s.jobs())
        n_rounds = len(s.rounds())
    print(f"\ncrash points tried: {kills}, nothing lost; killed in phase: {dict(phases)}; "
          f"rounds committed: {n_rounds}; reruns of a committed round: {reruns}; "
          f"jobs: {dict(states)}")
    assert kills == RANDOM_KILLS + TARGETED_KILLS
    assert phases["commit"] >= TARGETED_KILLS // 2  # the commit itself was hit, many times
    assert n_rounds > 10 and states.get("running", 0) + states.get("finished", 0) > 0
