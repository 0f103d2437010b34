"""What an importer read from an engine: the nodes it offers, and every node it left out or
cut down, with why.

An operator reading a cluster file must be able to tell why a node they know is missing
(drained, not Ready, tainted, a MIG-only node) or offers less than its hardware (GPUs in
use, Slurm's ``MemSpecLimit``). Every importer (Slurm, Kubernetes, Ray) returns an
:class:`Imported`; ``apportion cluster import`` prints its notes on stderr, one line per
reason with the nodes it concerns, whatever the log level.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Note:
    """One node left out (``left_out``) or offered with less than it has, and why."""

    node: str
    why: str
    left_out: bool


@dataclass
class Imported:
    """Node records (the shape ``runtime.cluster_import`` groups) and the notes on them."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def leave_out(self, node: str, why: str) -> None:
        self.notes.append(Note(node, why, True))

    def reduce(self, node: str, why: str) -> None:
        self.notes.append(Note(node, why, False))

    @property
    def left_out(self) -> list[Note]:
        return [n for n in self.notes if n.left_out]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.nodes[i]

    def lines(self, limit: int = 12) -> list[str]:
        """The notes for a reader: one line per reason (left-out ones first), naming at most
        ``limit`` nodes and counting the rest."""
        by: dict[tuple[bool, str], list[str]] = {}
        for n in self.notes:
            by.setdefault((not n.left_out, n.why), []).append(n.node)
        out = []
        for (kept, why), nodes in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            names = ", ".join(nodes[:limit]) + (f" and {len(nodes) - limit} more"
                                                if len(nodes) > limit else "")
            what = "offered in part" if kept else "left out"
            out.append(f"{what}: {len(nodes)} node{'s' if len(nodes) != 1 else ''} "
                       f"({names}): {why}")
        return out
