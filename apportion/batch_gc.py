"""The cyclic garbage collector's settings for a process that does batch work.

A round builds a graph of a hundred thousand vertices (and a replay thousands of such
graphs, one per round) out of objects that live until the round ends and hold no cycles.
Python's default thresholds (700, 10, 10) scan them again and again as they grow: 2.4 s
of a 10,000-job round's 13 s (reading its jobs file included) and 20 s of 270 CPU-s of a
150-round replay, against 0.5 s and 3.9 s with :data:`GC_THRESHOLDS`, the same answers.
Garbage without cycles is freed at once either way; cycles are collected, less often.
The command line sets it for every command, and ``compare`` for its worker processes; a
library user's process keeps its own settings.

The command line's imports (its front door, then the running command's module: about 800
modules for ``solve-round``, the libraries' included) run with the collector off, and what
they made is then frozen out of its reach (:func:`collector_paused`): it lives as long as
the process, and a collection in the middle of them, or the first after them, scans it all
(20-40 ms of a 1,000-job ``solve-round``, against 52 ms in 129 collections under the
default thresholds). The round's collections
then scan the round's objects only.

When a command ends, what is still alive is frozen (:func:`before_exit`): the
interpreter's shutdown would otherwise collect the whole heap (the modules' objects and
the round's) while tearing the modules down, a tenth of a second after a 1,000-job
``solve-round`` (0.12 of its 1.0 s) for memory the process's exit returns anyway.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLDS = (100_000, 50, 100)


def for_batch_work() -> None:
    """Collect cycles every 100,000 allocations net (not 700), and the older generations
    50 and 100 times less often than that."""
    gc.set_threshold(*GC_THRESHOLDS)


@contextmanager
def collector_paused(*, freeze_after: bool = False) -> Iterator[None]:
    """The block runs with the cyclic collector off (reference counting still frees what
    has no cycle); then, with ``freeze_after``, every object alive is moved out of the
    collector's reach for good (a process's modules, once imported), and the collector's
    state before the block is restored."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze_after:
            gc.freeze()
        if was:
            gc.enable()


def before_exit() -> None:
    """Move every object alive now out of the collector's reach, for a process about to
    exit. Objects are still freed by their reference counts at shutdown (their finalizers
    run, and ``atexit`` handlers run as ever); only the cycles among them are left to
    the exit, as Python already leaves whatever outlives the interpreter's own last
    collection."""
    gc.freeze()


__all__ = ["GC_THRESHOLDS", "before_exit", "collector_paused", "for_batch_work"]
