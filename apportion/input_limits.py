"""Budgets a document must keep before it is built: nodes, nesting, entries, number length.

Reading a document costs time in proportion to its nodes, not its bytes: PyYAML composes
and constructs every node (about 11 µs each), and pydantic's list of problems grows with
every entry that is wrong (a 4 MB JSON list of ``{}`` is 6.5 million problems, a minute
of CPU). A 200 KB text of nested brackets is 100,000 nodes, and a body of that size cost
the service seconds of CPU before its 422. :class:`TreeLimits` bounds a document by what
its cost depends on:

* **nodes**, with aliases expanded (each alias counts the nodes of its anchor's tree, so
  an alias bomb is refused here too, at the budget, not at the file reader's million);
* **nesting** (a real jobs document nests 5 levels);
* **entries of one list or mapping** (a request submits at most so many jobs);
* **the length of a number** (Python refuses to convert an integer of more than 4,300
  digits; a field of 64 characters is already far past every bound).

YAML is measured on the parser's events (libyaml's, in C, where PyYAML has it) before a
single node is composed, and the measuring stops at the first excess, so a document over
a budget costs about 1 µs per node up to the budget, never the full parse. JSON is parsed
by the C decoder first (microseconds per node) and the data measured after. Either way
the refusal is an :class:`~apportion.errors.InputError` naming the place, as the fields
of a validated document are named (``jobs[3].iterations``).

Nothing here imports an area package: the limits belong to the core reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from apportion.errors import InputError
from apportion.inputs import MAX_NUMBER_CHARS

__all__ = ["LongNumber", "TreeLimits", "check_data_limits", "check_yaml_limits"]

_EVENT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


@dataclass(frozen=True)
class TreeLimits:
    """What one document may hold. ``what`` names the document in messages ("a request
    body"), and ``advice`` says what to do instead when a size budget is exceeded."""

    max_nodes: int
    max_depth: int
    max_items: int
    max_number_chars: int = MAX_NUMBER_CHARS
    what: str = "a document"
    advice: str = ""

    def too_big(self, source: str, where: str, message: str) -> InputError:
        """A size budget exceeded: the message, and what to do instead."""
        return InputError(source, where, message + (f"; {self.advice}" if self.advice else ""))


class LongNumber(str):
    """A JSON number too long to be read as one (see :func:`json_number`), kept as its text
    so that :func:`check_data_limits` can name the field that holds it."""


def json_number(limit: int = MAX_NUMBER_CHARS) -> tuple[Any, Any]:
    """``parse_int`` and ``parse_float`` hooks for :func:`json.loads`: a number longer than
    ``limit`` characters becomes a :class:`LongNumber` instead of an ``int`` (Python
    refuses 4,300 digits with a ValueError that names no field) or a ``float`` (a
    5,000-digit float reads as infinity)."""

    def parse_int(text: str) -> Any:
        return LongNumber(text) if len(text) > limit else int(text)

    def parse_float(text: str) -> Any:
        return LongNumber(text) if len(text) > limit else float(text)

    return parse_int, parse_float


def _where(path: list[str]) -> str:
    out = ""
    for part in path:
        out += part if part.startswith("[") else ("." if out else "") + part
    return out or "(top level)"


def _key(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _is_number(value: str) -> bool:
    """Whether YAML reads this plain scalar as an int or a float (its resolver's rules)."""
    if not value:
        return False
    resolvers = yaml.SafeLoader.yaml_implicit_resolvers.get(value[0], [])
    return any(tag in _NUMBER_TAGS and regexp.match(value) for tag, regexp in resolvers)


class _Frame:
    """An open sequence or mapping while the events are read."""

    __slots__ = ("anchor", "count", "height", "in_key", "is_map", "key", "start")

    def __init__(self, is_map: bool, anchor: str | None, start: int) -> None:
        self.is_map, self.anchor, self.start = is_map, anchor, start
        self.count = 0          # entries so far (a mapping's pairs, a sequence's items)
        self.height = 1         # levels of nesting at and below it
        self.in_key = False     # a mapping: the node being read is a key (else a value)
        self.key = "?"          # a mapping: the key of the value being read


def _path(stack: list[_Frame]) -> list[str]:
    """Where the node being read is, as a field path's parts."""
    return [("(key)" if f.in_key else f.key) if f.is_map else f"[{f.count - 1}]"
            for f in stack]


def check_yaml_limits(text: str, source: str, limits: TreeLimits) -> None:
    """Refuse YAML text over ``limits`` before any node is composed (see the module's
    docstring). Malformed text is left to the loader, whose messages name the line: the
    measuring stops there, having found nothing over the budget so far."""
    nodes = 0
    stack: list[_Frame] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, height) of its tree
    open_anchors: set[str] = set()

    def enter(size: int, height: int) -> _Frame | None:
        """A node of ``size`` nodes and ``height`` levels joins the innermost collection;
        that collection (a mapping whose key this node is, or None)."""
        nonlocal nodes
        top = stack[-1] if stack else None
        key_of = None
        if top is not None:
            if top.is_map:
                top.in_key = not top.in_key  # a mapping's nodes alternate: key, value
                if top.in_key:
                    top.count += 1
                    top.key = "?"
                    key_of = top
            else:
                top.count += 1
            if top.count > limits.max_items:
                kind = "mapping" if top.is_map else "list"
                raise limits.too_big(source, _where(_path(stack)[:-1]), f"a {kind} of more "
                                     f"than {limits.max_items:,} entries; {limits.what} may "
                                     f"hold {limits.max_items:,} in one")
            top.height = max(top.height, height + 1)
        nodes += size
        if nodes > limits.max_nodes:
            raise limits.too_big(source, _where(_path(stack)), f"{limits.what} may hold at "
                                 f"most {limits.max_nodes:,} nodes (aliases expanded); this "
                                 "one holds more")
        if len(stack) + height > limits.max_depth:
            raise InputError(source, _where(_path(stack)), f"nested more than "
                             f"{limits.max_depth} levels deep; {limits.what} may nest "
                             f"{limits.max_depth}")
        return key_of

    try:
        for ev in yaml.parse(text, Loader=_EVENT_LOADER):
            kind = type(ev)
            if kind is yaml.ScalarEvent:
                key_of = enter(1, 0)
                value = ev.value
                if (len(value) > limits.max_number_chars and not ev.style
                        and ev.implicit[0] and _is_number(value)):
                    raise InputError(source, _where(_path(stack)), f"a number of "
                                     f"{len(value):,} characters; at most "
                                     f"{limits.max_number_chars} are accepted")
                if key_of is not None:
                    key_of.key = _key(value)
                if ev.anchor is not None:
                    anchors[ev.anchor] = (1, 0)
            elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
                enter(1, 1)
                stack.append(_Frame(kind is yaml.MappingStartEvent, ev.anchor, nodes))
                if ev.anchor is not None:
                    open_anchors.add(ev.anchor)
            elif kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
                done = stack.pop()
                if done.anchor is not None:
                    open_anchors.discard(done.anchor)
                    anchors[done.anchor] = (nodes - done.start + 1, done.height)
                if stack:
                    stack[-1].height = max(stack[-1].height, done.height + 1)
            elif kind is yaml.AliasEvent:
                if ev.anchor in open_anchors:
                    enter(1, 0)
                    raise InputError(source, _where(_path(stack)), "an alias refers to a "
                                     "node that contains it (a recursive alias)")
                size, height = anchors.get(ev.anchor, (1, 0))
                enter(size, height)
    except yaml.YAMLError:
        return  # the loader reports it, naming the line


def check_data_limits(data: Any, source: str, limits: TreeLimits) -> None:
    """Refuse parsed data (JSON's) over ``limits``: the same budgets, counted as
    :func:`check_yaml_limits` counts them (a mapping's keys are nodes too), and a
    :class:`LongNumber` anywhere is refused naming its field."""
    nodes = 0
    stack: list[tuple[Any, list[str]]] = [(data, [])]
    while stack:
        value, where = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise limits.too_big(source, _where(where), f"{limits.what} may hold at most "
                               f"{limits.max_nodes:,} nodes; this one holds more")
        if isinstance(value, LongNumber):
            raise InputError(source, _where(where), f"a number of {len(value):,} "
                                 f"characters; at most {limits.max_number_chars} are accepted")
        if isinstance(value, (dict, list)):
            if len(where) + 1 > limits.max_depth:
                raise InputError(source, _where(where), f"nested more than "
                                     f"{limits.max_depth} levels deep; {limits.what} may nest "
                                     f"{limits.max_depth}")
            if len(value) > limits.max_items:
                kind = "mapping" if isinstance(value, dict) else "list"
                raise limits.too_big(source, _where(where), f"a {kind} of more than "
                                   f"{limits.max_items:,} entries; {limits.what} may hold "
                                   f"{limits.max_items:,} in one")
            if isinstance(value, dict):
                nodes += len(value)  # its keys, as YAML counts them
                if nodes > limits.max_nodes:
                    raise limits.too_big(source, _where(where), f"{limits.what} may hold at "
                                         f"most {limits.max_nodes:,} nodes; this one holds "
                                         "more")
                stack.extend((v, [*where, _key(k)]) for k, v in reversed(value.items()))
            else:
                stack.extend((v, [*where, f"[{i}]"]) for i, v in reversed(list(enumerate(value))))
