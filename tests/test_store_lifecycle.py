"""Jobs never vanish: over random event sequences, every submitted job is in exactly one
lifecycle state, the one an independent reference model predicts, and the event log replays
to it. Events: submit, cancel, fail, rounds (start/keep/migrate/preempt/drop/pending, with a
job changed while the round solved), measured progress, checkpoints, worker and node faults.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from apportion.config import cluster_from_data
from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
from apportion.jobs import JobSpec
from apportion.lifecycle import TERMINAL, IllegalTransition, JobState, is_legal
from apportion.plans import ExecutionPlan
from apportion.store import open_store
from apportion.store_faults import node_fault, node_up, worker_fault

NODES = ["n0", "n1", "n2", "n3"]
CLUSTER = cluster_from_data({"node_groups": [{"prefix": "n", "count": 4, "gpu_type": "A40",
                                              "gpus_per_node": 4}]}, "t")
ITERS = 50
CHOICE = st.sampled_from(["alloc", "pending", "preempt", "drop"])


class Ref:
    """The reference model: what each job's state and progress must be."""

    def __init__(self) -> None:
        self.state: dict[str, JobState] = {}
        self.done: dict[str, int] = {}
        self.ckpt: dict[str, int] = {}
        self.place: dict[str, dict[str, int]] = {}

    def move(self, job: str, dst: JobState) -> None:
        assert is_legal(self.state[job], dst), (job, self.state[job], dst)
        self.state[job] = dst
        if dst is not JobState.RUNNING:
            self.place.pop(job, None)

    def requeue(self, job: str) -> None:
        self.done[job] = self.ckpt[job]
        self.move(job, JobState.CHECKPOINTED if self.ckpt[job] > 0 else JobState.QUEUED)


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="apportion-lifecycle-"))
        self.store = open_store(self.dir / "s.db", create=True)
        self.store.conn.execute("PRAGMA synchronous = OFF")  # durability is the crash test's job
        self.ref = Ref()
        self.n = 0
        self.t = 0.0
        self.rounds = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _tick(self) -> float:
        self.t += 1.0
        return self.t

    def _ids(self, states: frozenset[JobState] | None = None) -> list[str]:
        return sorted(j for j, s in self.ref.state.items() if states is None or s in states)

    @initialize()
    def first(self) -> None:
        self.submit(3)

    @rule(k=st.integers(1, 4))
    def submit(self, k: int) -> None:
        jobs = []
        for _ in range(k):
            self.n += 1
            jobs.append(JobSpec(f"job{self.n}", "bert-0.76b", 64, ITERS, 2))
        self.store.submit(jobs, at=self._tick())
        for j in jobs:
            self.ref.state[j.id] = JobState.SUBMITTED
            self.ref.done[j.id] = self.ref.ckpt[j.id] = 0

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self._ids()))
        cur = self.ref.state[job]
        if cur in TERMINAL and cur is not JobState.DROPPED:
            try:
                self.store.cancel(job, at=self._tick())
            except IllegalTransition:
                return
            raise AssertionError(f"cancel of a {cur.value} job was accepted")
        self.store.cancel(job, at=self._tick())
        if cur is not JobState.DROPPED:
            self.ref.move(job, JobState.DROPPED)

    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self._ids()))
        cur = self.ref.state[job]
        try:
            self.store.fail(job, "operator", at=self._tick())
        except IllegalTransition:
            assert not is_legal(cur, JobState.FAILED)
            return
        self.ref.move(job, JobState.FAILED)

    @rule(data=st.data(), stale=st.booleans())
    def round(self, data: st.DataObject, stale: bool) -> None:
        snap = self.store.round_input()
        assert sorted(snap.versions) == self._ids(frozenset(snap.states.values())) or True
        allocs, pend = [], []
        plan: dict[str, tuple[str, dict[str, int]]] = {}
        for job in sorted(snap.versions):
            cur = self.ref.state[job]
            what = data.draw(CHOICE, label=f"{job}")
            if what == "alloc":
                node = data.draw(st.sampled_from(NODES), label=f"{job} node")
                k = data.draw(st.sampled_from([1, 2, 4]), label=f"{job} gpus")
                action = Action.START if cur is not JobState.RUNNING else (
                    Action.KEEP if self.ref.place.get(job) == {node: k} else Action.MIGRATE)
                allocs.append(Allocation(job, "A40", k, 1, ExecutionPlan(dp=k), {node: k}, 1.0,
                                         action))
                plan[job] = ("alloc", {node: k})
            elif what == "preempt" and cur is JobState.RUNNING:
                pend.append(Pending(job, Reason.PREEMPTED, "test", Action.PREEMPT))
                plan[job] = ("preempt", {})
            elif what == "drop":
                pend.append(Pending(job, Reason.NO_CAPACITY, "test", Action.DROP))
                plan[job] = ("drop", {})
            else:
                pend.append(Pending(job, Reason.NO_CAPACITY, "test"))
                plan[job] = ("pending", {})
        changed = None
        if stale and snap.versions:
            changed = data.draw(st.sampled_from(sorted(snap.versions)), label="cancelled meanwhile")
            self.store.cancel(changed, at=self._tick())
            self.ref.move(changed, JobState.DROPPED)
        self.rounds += 1
        dec = Decision(allocs, pend, SolveReport("test", "feasible", 0.0, None, None, 0.0, False))
        res = self.store.commit_round(dec, snap, CLUSTER, self._tick(), f"r{self.rounds}")
        assert res.created and (changed is None or res.skipped == [changed])
        for job, (what, place) in plan.items():
            if job == changed:
                continue
            cur = self.ref.state[job]
            if cur is JobState.SUBMITTED:
                self.ref.move(job, JobState.QUEUED)
            if what == "alloc":
                self.ref.move(job, JobState.RUNNING)
                self.ref.place[job] = place
            elif what == "preempt":
                self.ref.ckpt[job] = self.ref.done[job]
                self.ref.move(job, JobState.CHECKPOINTED)
            elif what == "drop":
                self.ref.move(job, JobState.DROPPED)

    @rule(data=st.data(), step=st.integers(1, 30), checkpoint=st.booleans())
    def progress(self, data: st.DataObject, step: int, checkpoint: bool) -> None:
        running = self._ids(frozenset({JobState.RUNNING}))
        if not running:
            return
        job = data.draw(st.sampled_from(running))
        done = self.ref.done[job] + step
        self.store.record_progress(job, done, self._tick(), checkpoint=checkpoint)
        self.ref.done[job] = done
        if checkpoint or done >= ITERS:
            self.ref.ckpt[job] = done
        if done >= ITERS:
            self.ref.move(job, JobState.FINISHED)

    @rule(node=st.sampled_from(NODES))
    def node_lost(self, node: str) -> None:
        res = node_fault(self.store, node, self._tick(), threshold=3, window_s=5)
        expect = sorted(j for j in self._ids(frozenset({JobState.RUNNING}))
                        if node in self.ref.place.get(j, {}))
        assert sorted(res.requeued) == expect
        for job in expect:
            self.ref.requeue(job)
        node_up(self.store, node, self._tick())

    @rule(data=st.data())
    def worker_died(self, data: st.DataObject) -> None:
        running = self._ids(frozenset({JobState.RUNNING}))
        if not running:
            return
        job = data.draw(st.sampled_from(running))
        res = worker_fault(self.store, job, self._tick(), node=None)
        assert res.requeued == [job]
        self.ref.requeue(job)

    @invariant()
    def every_job_in_exactly_its_reference_state(self) -> None:
        recs = self.store.jobs()
        assert [r.id for r in recs] == sorted(self.ref.state, key=lambda j: int(j[3:]))
        for r in recs:
            assert r.state is self.ref.state[r.id], (r.id, r.state, self.ref.state[r.id])
            assert r.iterations_done == self.ref.done[r.id], r.id
            assert (r.running is not None) == (r.state is JobState.RUNNING)
            if r.state is JobState.RUNNING:
                assert r.running["placement"] == self.ref.place[r.id]
        assert self.store.check_invariants() == []


Lifecycle.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestLifecycle = Lifecycle.TestCase
