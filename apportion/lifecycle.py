"""Job lifecycle: the states a submitted job can be in, and the legal moves between them.

Every job the state store has accepted is, at every moment, in exactly one of
these states; nothing ever removes a job. The transition table is written once
here and enforced twice: by :func:`check_transition` before the store writes,
and by a SQLite trigger (see :mod:`apportion.store_schema`) that refuses any
other ``UPDATE`` of a job's state, so even a buggy caller or a hand-written SQL
statement cannot put a job into an impossible state.

``checkpointed`` means "not running, resumes from a checkpoint": a planned
preemption takes a checkpoint at the current iteration; an unplanned fault (a
worker died, a node vanished) loses the work since the last checkpoint and the
job returns to ``checkpointed`` (or ``queued`` when it never checkpointed).
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    SUBMITTED = "submitted"  # accepted by `submit`, not yet seen by a round
    QUEUED = "queued"  # admitted by a round, waiting for GPUs
    RUNNING = "running"  # holds a placement chosen by a committed round
    CHECKPOINTED = "checkpointed"  # stopped with a checkpoint, waiting to resume
    FINISHED = "finished"  # reached its iterations
    FAILED = "failed"  # gave up (a fault the operator declared fatal)
    DROPPED = "dropped"  # cancelled by the operator or dropped by a round


TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.DROPPED})
#: States whose jobs a round considers (the queue plus the running jobs).
ACTIVE = frozenset({JobState.SUBMITTED, JobState.QUEUED, JobState.RUNNING,
                    JobState.CHECKPOINTED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.QUEUED, JobState.DROPPED, JobState.FAILED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.DROPPED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.CHECKPOINTED, JobState.QUEUED, JobState.FINISHED,
                                 JobState.FAILED, JobState.DROPPED}),
    JobState.CHECKPOINTED: frozenset({JobState.RUNNING, JobState.DROPPED, JobState.FAILED,
                                      JobState.FINISHED}),
    JobState.FINISHED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.DROPPED: frozenset(),
}


class IllegalTransition(ValueError):
    """A lifecycle move the table does not allow (the job keeps its state)."""

    def __init__(self, job: str, src: str, dst: str) -> None:
        self.job, self.src, self.dst = job, src, dst
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[JobState(src)])) or "none"
        super().__init__(f"job {job!r}: cannot go from {src} to {dst} (allowed: {allowed})")


def is_legal(src: JobState | str, dst: JobState | str) -> bool:
    """A self-move (running -> running on a resize) is legal, except out of a terminal state."""
    s, d = JobState(src), JobState(dst)
    return (s == d and s not in TERMINAL) or d in TRANSITIONS[s]


def check_transition(job: str, src: JobState | str, dst: JobState | str) -> None:
    if not is_legal(src, dst):
        raise IllegalTransition(job, JobState(src).value, JobState(dst).value)


def transition_pairs() -> list[tuple[str, str]]:
    """Every legal (src, dst) with src != dst: the rows the schema's trigger checks against."""
    return sorted((s.value, d.value) for s, ds in TRANSITIONS.items() for d in ds)
