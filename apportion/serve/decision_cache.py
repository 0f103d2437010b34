"""The last rounds' decisions, parsed once per server.

A waiting job's reason detail and a running job's estimate source are in the decision
of its last round: one JSON document per round, 5 MB at 20,000 jobs, 0.1 s to parse. The
dashboard reads a page of jobs and the longest waits every few seconds, and all of them
name the same one or two rounds. A committed decision never changes (the store writes it
once, in the round's transaction), so the server keeps the last few parsed, by store and
round, and every request after the first reads them from memory. Readers must not
modify what they are given.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from apportion.store import StateStore
from apportion.store_status import DecisionLoader

#: decisions kept: the newest rounds are the ones waiting and running jobs name
SIZE = 4


class DecisionCache:
    """A small least-recently-used map of (store, round) -> its parsed decision."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.parsed = 0  # decisions read from a store (the misses), for tests

    def loader(self, store: StateStore) -> DecisionLoader:
        """A decision loader for :func:`apportion.store_status.pending_details` and
        :func:`~apportion.store_status.estimate_sources` reading through this cache."""
        def load(round_id: int) -> dict[str, Any]:
            key = (str(store.path), int(round_id))
            with self._lock:
                hit = self._kept.get(key)
                if hit is not None:
                    self._kept.move_to_end(key)
                    return hit
            decision = store.decision(round_id)  # KeyError when there is none: not kept
            with self._lock:
                self.parsed += 1
                self._kept[key] = decision
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
            return decision
        return load


#: the server's one cache (requests run on several threads)
DECISIONS = DecisionCache()
