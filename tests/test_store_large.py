"""Large writes to the store: a submission and a round's commit, each with the store's
lock held only for SQL.

`StateStore.submit` encodes and stages its rows SUBMIT_BATCH at a time in a temporary
table (no lock on the store: another writer commits meanwhile), then moves them into the
store in one transaction: all of a submission or none of it, whatever its size, in the
order given. A round's commit makes its rows before taking the lock and keeps them only
if no transaction changed the store meanwhile; otherwise it makes them again inside, so
a job cancelled in between is left as the cancellation left it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from apportion import store as store_module
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.store import open_store


def _jobs(n: int, first: int = 0) -> list[JobSpec]:
    return [JobSpec(f"j{i}", "bert-1.3b", 256, 1000 + i, 1 + i % 4, submit_time_s=float(i))
            for i in range(first, first + n)]


def _count(db: Path) -> tuple[int, int, str]:
    with sqlite3.connect(db) as c:
        return (c.execute("SELECT COUNT(*) FROM jobs").fetchone()[0],
                c.execute("SELECT COUNT(*) FROM job_events").fetchone()[0],
                c.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])


def test_batches_are_published_whole_in_order(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "SUBMIT_BATCH", 5)
    db = tmp_path / "s.db"
    with open_store(db, create=True) as st:
        assert st.submit(_jobs(23), source="a", at=1.0) == [f"j{i}" for i in range(23)]
        assert st.submit(_jobs(4, 23), source="b", at=2.0) == [f"j{i}" for i in range(23, 27)]
        recs = st.jobs()
        assert [r.id for r in recs] == [f"j{i}" for i in range(27)]
        assert [r.to_jobspec() for r in recs] == _jobs(27)
        seqs = [row[0] for row in st.conn.execute("SELECT seq FROM jobs ORDER BY seq")]
        assert seqs == list(range(1, 28))
        events = st.events()
        assert [e["job"] for e in events] == [f"j{i}" for i in range(27)]
        assert {e["why"] for e in events[:23]} == {"submitted from a"}
    assert _count(db) == (27, 27, "2")  # one transaction a submission


@pytest.mark.parametrize("clash", ["stored", "twice"])
def test_a_clash_in_the_last_batch_writes_nothing(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   clash: str) -> None:
    monkeypatch.setattr(store_module, "SUBMIT_BATCH", 5)
    db = tmp_path / "s.db"
    with open_store(db, create=True) as st:
        st.submit(_jobs(3, 100))
        before = _count(db)
        jobs = _jobs(22)
        jobs[21] = _jobs(1, 101 if clash == "stored" else 3)[0]
        with pytest.raises(InputError) as err:
            st.submit(jobs, source="q.jsonl")
        assert err.value.field == "jobs[21].id"
        assert ("already in the state store" if clash == "stored" else "duplicate job id") \
            in err.value.message
        assert _count(db) == before
        st.submit(_jobs(4))  # the connection is usable, its staging table empty again
        assert [r.id for r in st.jobs()] == ["j100", "j101", "j102", "j0", "j1", "j2", "j3"]


def test_staging_holds_no_lock_on_the_store(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """While a submission stages its second batch, another connection takes the store's
    write lock at once (no busy wait allowed) and commits: the store is locked only for
    the final transaction."""
    monkeypatch.setattr(store_module, "SUBMIT_BATCH", 5)
    db = tmp_path / "s.db"
    open_store(db, create=True).close()
    encode = store_module._spec_json
    calls: list[str] = []

    def spy(job: JobSpec) -> str:
        calls.append(job.id)
        if job.id == "j7":  # in the second batch
            other = sqlite3.connect(db, timeout=0, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE meta SET value = 'x' WHERE key = 'other'")
            other.execute("COMMIT")
            other.close()
        return encode(job)

    monkeypatch.setattr(store_module, "_spec_json", spy)
    with open_store(db) as st:
        st.submit(_jobs(12))
        assert len(st.jobs()) == 12
    assert "j7" in calls


def _round(st, ids: list[str]):  # type: ignore[no-untyped-def]
    from apportion.cluster import Cluster, NodeGroup
    from apportion.decision import Allocation, Decision, Pending, Reason, SolveReport
    from apportion.plans import ExecutionPlan

    cl = Cluster("c", [NodeGroup("a", len(ids), "A100-40GB", 4)])
    snap = st.round_input()
    allocs = [Allocation(j, "A100-40GB", 1, 1, ExecutionPlan(dp=1), {f"a-{i}": 1}, 1.0)
              for i, j in enumerate(ids[::2])]
    pend = [Pending(j, Reason.NO_CAPACITY) for j in ids[1::2]]
    return Decision(allocs, pend, SolveReport("x", "feasible", 1.0, 1.0, 0.0, 1.0, False)), \
        snap, cl


@pytest.mark.parametrize("meanwhile", [False, True])
def test_a_round_commit_made_before_the_lock_is_kept_only_if_nothing_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: bool) -> None:
    db = tmp_path / "s.db"
    with open_store(db, create=True) as st:
        st.submit(_jobs(6))
        decision, snap, cl = _round(st, [f"j{i}" for i in range(6)])
        made = store_module.StateStore._round_writes
        calls: list[int] = []

        def spy(self, *args):  # type: ignore[no-untyped-def]
            calls.append(args[-1])
            if meanwhile and len(calls) == 1:  # another writer, between the read and the lock
                with open_store(db) as other:
                    other.cancel("j0")
            return made(self, *args)

        monkeypatch.setattr(store_module.StateStore, "_round_writes", spy)
        res = st.commit_round(decision, snap, cl, 10.0)
        assert len(calls) == (2 if meanwhile else 1)  # made again inside the lock, or not
        states = {r.id: r.state.value for r in st.jobs()}
        if meanwhile:
            assert states["j0"] == "dropped" and res.skipped == ["j0"]
        else:
            assert states["j0"] == "running" and res.skipped == []
        assert states["j2"] == states["j4"] == "running"
        assert states["j1"] == states["j3"] == states["j5"] == "queued"
        running = {r.id: r.running for r in st.jobs() if r.running}
        assert {r["round"] for r in running.values()} == {res.round_id}
        events = [(e["job"], e["dst"]) for e in st.events("j2")]
        assert events == [("j2", "submitted"), ("j2", "queued"), ("j2", "running")]
        assert not st.check_invariants()
