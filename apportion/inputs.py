"""The one reader of input files: YAML, JSON, CSV and NPZ under the same rules.

Every option that reads a file (``--jobs``, ``--cluster``, ``--tenants``,
``submit``, ``--tables``, ``--tasks``, a task's ``data`` for ``--gains auto``,
``--trace``, ``--gpu-map``, ``--k8s-config``, ``--units``, ``--decision``, ...)
reads it through this module, so a hostile or careless file is refused the same
way wherever it is given, and the refusal is an :class:`InputError` naming the
file, the place (``(file)``, ``line 3``, ``line 4, column gpus``) and what is
wrong, never a traceback or a hang. The rules, and why:

* **A regular file.** A FIFO blocks a read for ever, ``/dev/zero`` never ends,
  a socket cannot be read: each is refused by what it is, before it is opened;
  the descriptor is opened non-blocking and checked again, so a FIFO swapped in
  after the check cannot hang the read either.
* **A size limit** (:data:`MAX_FILE_BYTES`, 4 MB; bigger only where a format
  needs it, such as the public traces, or where the command is told so:
  ``--max-input-bytes``): the read itself is bounded, so a file that grows while it
  is read is refused too. A file read a line at a time (:func:`iter_lines`: a
  JSON-lines queue) is bounded twice: each line (:data:`MAX_LINE_BYTES`) and the
  whole; no copy of the whole file is ever held.
* **UTF-8 text** for the text formats.
* **YAML aliases bounded before any walk.** An anchor referenced many times is
  one node to the composer but many to whoever walks the data as a tree
  (validation, the duplicate-key check, a depth check): nine levels of nine
  aliases is a billion nodes from a kilobyte (the "billion laughs"). The
  composed node graph is measured once, with memoisation, before anything is
  constructed; aliases may add at most :data:`MAX_YAML_ALIAS_NODES` nodes, or
  :data:`YAML_ALIAS_NODES_PER_NODE` times the document's own nodes where that is more
  (a merge key per job in a 100,000-job queue adds 2 million nodes: linear in the
  file, which its size limit bounds, where a bomb grows exponentially), a
  recursive alias is refused, and so is nesting deeper than
  :data:`MAX_YAML_DEPTH` levels.
* **CSV fields and rows bounded** (:data:`MAX_FIELD_CHARS` characters a field,
  :data:`MAX_CSV_COLUMNS` columns); a NUL byte, a ragged row or a duplicate
  column name is refused with its line; numbers are parsed by
  :func:`parse_number`, which refuses text, ``nan``, ``inf``, absurd lengths
  and values outside the bounds the caller gives.
* **NPZ arrays bounded before they are decompressed**: every array's header
  (shape, dtype) is read first and the total element count checked against
  :data:`MAX_NPZ_ELEMENTS`; pickled objects are never loaded; a file that is
  not a zip archive is refused.

Nothing here imports an area package: the reader belongs to the core, below
every area that reads a file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from apportion import protected
from apportion.errors import InputError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_CSV_COLUMNS", "MAX_FIELD_CHARS", "MAX_FILE_BYTES", "MAX_LINE_BYTES",
           "MAX_NPZ_ELEMENTS", "MAX_TRACE_BYTES", "MAX_YAML_ALIAS_NODES", "MAX_YAML_DEPTH",
           "YAML_ALIAS_NODES_PER_NODE", "CsvTable", "check_count", "check_input_file",
           "iter_lines", "parse_count", "parse_csv_text", "parse_json_line",
           "parse_json_text", "parse_number", "parse_shipped_yaml", "parse_yaml_text",
           "read_bytes", "read_csv", "read_head", "read_json", "read_npz", "read_text",
           "read_yaml"]

#: Inputs are small (a 1,000-job YAML is ~200 KB); pure-Python YAML needs ~7 s per MB.
MAX_FILE_BYTES = 4 * 2**20
#: The public cluster traces (ITP: 4.3 MB, 60,000 jobs) are the one input that is bigger.
MAX_TRACE_BYTES = 256 * 2**20
#: Nodes YAML aliases may add over the document's own (a merge key per job is far below).
MAX_YAML_ALIAS_NODES = 1_000_000
#: ... or this many times the document's own nodes, where that is more: a merge key of a
#: few fields per job adds about twice the job's own nodes, so a queue too large for the
#: fixed budget (100,000 jobs, read with ``--max-input-bytes``) keeps its aliases, while a
#: bomb (exponential in its own size) is refused as before
YAML_ALIAS_NODES_PER_NODE = 4
#: One line of a file read a line at a time (a JSON-lines queue: one job, its workload
#: included): far above a real one (150 bytes), far below what would exhaust memory.
MAX_LINE_BYTES = 2**20
#: Levels of nesting a YAML or JSON input may have (real inputs have fewer than 10).
MAX_YAML_DEPTH = 64
#: Characters in one CSV field (a model name, a job id, a number: all far shorter).
MAX_FIELD_CHARS = 4096
#: Columns a CSV may have.
MAX_CSV_COLUMNS = 1024
#: Elements all the arrays of one NPZ may hold together (32 MB of float64).
MAX_NPZ_ELEMENTS = 4 * 2**20
#: Characters a number may be written with (Python refuses int() past 4,300 digits).
MAX_NUMBER_CHARS = 64


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------
def _file_kind(mode: int) -> str:
    return ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a character device"
            if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def check_input_file(path: str | Path, kind: str = "input") -> os.stat_result:
    """Refuse, before opening, anything but an existing regular file (after symlinks).

    A FIFO would block the read forever, a device such as /dev/zero never ends, a
    socket cannot be read: all are refused by what they are, with the file named.
    """
    src = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(src, "(file)", "no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(src, "(file)", f"cannot read: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(src, "(file)", f"is a directory, not a {kind} file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(src, "(file)", f"{_file_kind(st.st_mode)}, not a regular file; "
                         f"give a {kind} file")
    return st


def read_bytes(path: str | Path, kind: str = "input", *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A bounded read of a regular file; every failure is an :class:`InputError`.

    The size is checked before the read (a 100 MB sparse file costs nothing) and the
    read itself stops one byte past the limit, so a file that grows meanwhile is refused
    too. The descriptor is opened non-blocking and checked again, so a FIFO swapped in
    after :func:`check_input_file` cannot hang the read.
    """
    src = str(path)
    fd = _open_checked(path, kind, max_bytes)
    try:
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InputError(src, "(file)", f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:
        raise InputError(src, "(file)", f"{kind} inputs are limited to {max_bytes} bytes")
    return raw


def _open_checked(path: str | Path, kind: str, max_bytes: int | None) -> int:
    """A descriptor of a regular file of at most ``max_bytes`` (None: any size), opened by
    the reader's rules: checked before opening (:func:`check_input_file`), opened
    non-blocking and checked again, and remembered as an input of the command
    (:mod:`apportion.protected`). The caller closes it."""
    src = str(path)
    st = check_input_file(path, kind)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(src, "(file)", f"file is {st.st_size} bytes; {kind} inputs are "
                         f"limited to {max_bytes} bytes")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(src, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        fst = os.fstat(fd)
        mode = fst.st_mode
        if not stat.S_ISREG(mode):
            raise InputError(src, "(file)", f"{_file_kind(mode)}, not a regular file")
        protected.protect(path, f"a {kind} input", st=fst)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_head(path: str | Path, kind: str = "input", size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes of a regular file, by the same rules as :func:`read_bytes`
    (checked before opening, opened non-blocking and checked again), for readers that tell
    a format from its first line before reading the whole file."""
    src = str(path)
    fd = _open_checked(path, kind, None)
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise InputError(src, "(file)", f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def iter_lines(path: str | Path, kind: str = "input", *, max_bytes: int,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """The lines of a regular file with their numbers (from 1), read a megabyte at a time,
    so no copy of the whole file is ever held (a 100,000-job queue streams through).

    The rules of :func:`read_bytes`, and two bounds: a line longer than ``max_line_bytes``
    is refused with its number before it is all read, and the file as a whole may hold
    ``max_bytes`` (checked before opening and counted while reading, so a file that grows
    meanwhile is refused too). Each line is UTF-8 text without its ``\n`` (nor a ``\r``
    before it); a line that is not UTF-8 is refused with its number. The file is closed
    when the lines run out, on a refusal, or when the caller stops early.
    """
    src = str(path)
    fd = _open_checked(path, kind, max_bytes)
    try:
        number, total, pending = 0, 0, b""
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError as exc:
                raise InputError(src, "(file)", f"cannot read: {exc.strerror or exc}") from None
            total += len(chunk)
            if total > max_bytes:
                raise InputError(src, "(file)", f"{kind} inputs are limited to {max_bytes} "
                                 "bytes")
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop() if chunk else b""
            if not chunk and lines and lines[-1] == b"":
                lines.pop()  # the file ended with a newline
            for raw in lines:
                number += 1
                yield number, _line_text(raw, src, number, max_line_bytes)
            if len(pending) > max_line_bytes:
                raise InputError(src, f"line {number + 1}", f"a line of more than "
                                 f"{max_line_bytes} bytes; at most {max_line_bytes} are "
                                 "accepted")
            if not chunk:
                return
    finally:
        os.close(fd)


def _line_text(raw: bytes, source: str, number: int, max_line_bytes: int) -> str:
    if len(raw) > max_line_bytes:
        raise InputError(source, f"line {number}", f"a line of {len(raw)} bytes; at most "
                         f"{max_line_bytes} are accepted")
    try:
        return raw.removesuffix(b"\r").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(source, f"line {number}", f"not UTF-8 text: {exc.reason} at byte "
                         f"{exc.start} of the line") from None


def _decode(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(source, "(file)", f"not UTF-8 text: {exc.reason} at byte "
                         f"{exc.start}") from None


def read_text(path: str | Path, kind: str = "input", *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A bounded, UTF-8 read of an input file (:func:`read_bytes`, then decoded)."""
    return _decode(read_bytes(path, kind, max_bytes=max_bytes), str(path))


# ---------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------
class _Refused(Exception):
    """The composed YAML is refused as a whole (an alias bomb, a cycle, too deep)."""


class _UniqueKeys:
    """A loader mixin that refuses duplicate mapping keys (YAML would keep the last silently)
    and measures the composed node graph before anything is constructed."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]

    #: whether the text may hold an alias (a ``*``): without one the node graph is a tree,
    #: whose size is the file's and which can hold no cycle, so only its depth is measured
    may_alias = True

    def get_single_node(self) -> Any:
        node = super().get_single_node()  # type: ignore[misc]
        if node is not None:
            if self.may_alias:
                _measure(node)
            else:
                _measure_depth(node)
        return node


def _children(node: yaml.Node) -> Iterable[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return ()


def _measure(root: yaml.Node, alias_budget: int = MAX_YAML_ALIAS_NODES,
             max_depth: int = MAX_YAML_DEPTH,
             per_node: int = YAML_ALIAS_NODES_PER_NODE) -> None:
    """Refuse a node graph whose tree (aliases expanded) is too big, cyclic or too deep.

    Aliases make the composed graph a DAG that shares nodes; its tree size is counted
    bottom-up with each shared node counted once (memoised by identity), so the cost is
    linear in the file, however many nodes the aliases stand for. Aliases may add
    ``alias_budget`` nodes, or ``per_node`` times the document's own where that is more.
    Counts saturate far past any budget (at 2**62), so a chain of doubling aliases never
    builds huge integers.
    """
    cap = 2**62
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = list(_children(node))
            size[key] = min(cap, 1 + sum(size[id(c)] for c in kids))
            depth[key] = 1 + max((depth[id(c)] for c in kids), default=0)
            if depth[key] > max_depth:
                raise _Refused(f"nesting too deep (more than {max_depth} levels)")
            continue
        if key in size:
            continue
        if key in started:  # its post-visit is still below on the stack: an ancestor
            raise _Refused("an alias refers to a node that contains it (a recursive alias)")
        started.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    extra = size[id(root)] - len(started)
    budget = max(alias_budget, per_node * len(started))
    if extra > budget:
        raise _Refused(f"aliases expand to more than {budget} nodes beyond the "
                       f"file's own {len(started)} (an alias bomb?); write the values out")


def _measure_depth(root: yaml.Node, max_depth: int = MAX_YAML_DEPTH) -> None:
    """Refuse a node tree deeper than ``max_depth`` (a tree: no node is shared, so each is
    visited once, level by level, as :func:`_measure` would count it)."""
    level, depth = [root], 0
    while level:
        depth += 1
        if depth > max_depth:
            raise _Refused(f"nesting too deep (more than {max_depth} levels)")
        below: list[yaml.Node] = []
        for node in level:
            if isinstance(node, yaml.SequenceNode):
                below.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                for pair in node.value:
                    below.extend(pair)
        level = below


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """SafeLoader refusing duplicate keys and alias bombs."""


class _FastUniqueKeyLoader(_UniqueKeys, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The same on libyaml's parser where PyYAML has it (a 1,000-job file parses about
    ten times faster); a file it refuses as malformed is parsed again by the pure-Python
    loader, so error messages are the same either way."""


# -- numbers as YAML 1.2 and a person read them --------------------------------------------
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _NoSexagesimal:
    """A resolver pattern that is YAML 1.1's, except that a scalar with a ``:`` is never a
    number: YAML 1.1 reads ``1:30`` as 90 (base 60, for times), which nobody writing
    ``requested_gpus: 1:30`` means; YAML 1.2 dropped it. Such a scalar stays a string, and
    the schema refuses it by name."""

    def __init__(self, pattern: Any) -> None:
        self.pattern = pattern

    def match(self, value: str) -> Any:
        return None if ":" in value else self.pattern.match(value)


def _yaml12_resolvers(resolvers: dict[Any, list[tuple[str, Any]]]
                      ) -> dict[Any, list[tuple[str, Any]]]:
    return {first: [(tag, _NoSexagesimal(rx) if tag in (_INT_TAG, _FLOAT_TAG) else rx)
                    for tag, rx in entries] for first, entries in resolvers.items()}


def _bounded_number(kind: str) -> Any:
    """The safe constructor of ``kind`` numbers, except that a scalar of more than
    :data:`MAX_NUMBER_CHARS` characters stays its text: Python's ``int`` refuses 4,300
    digits with a ValueError (a long one costs quadratic time before that), and as text the
    schema refuses it naming its field ("jobs[0].iterations: a valid integer")."""
    tag = _INT_TAG if kind == "int" else _FLOAT_TAG
    base = yaml.SafeLoader.yaml_constructors[tag]

    def construct(loader: Any, node: Any) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            return node.value
        return base(loader, node)

    return construct


_SCALAR_NODE = yaml.ScalarNode
_STR_TAG = "tag:yaml.org,2002:str"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MAP_TAG = "tag:yaml.org,2002:map"
_MERGE_TAG = "tag:yaml.org,2002:merge"
#: scalar tags whose safe constructor is a plain function of the node (no generator)
_PLAIN_SCALAR_TAGS = frozenset({"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool",
                                "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


class _TreeConstruct:
    """Construction of a node tree (a text with no alias) by one recursive walk.

    PyYAML's constructor is general: every node goes through ``construct_object``'s
    bookkeeping (the memo of shared nodes, generators finished later for recursive
    structures), and every scalar's tag is resolved by matching the resolver's regular
    expressions. A tree shares no node and holds no cycle, and its depth is measured before
    construction (``_measure_depth``), so a direct walk builds the same data: strings and
    sequences and mappings of the core tags directly, the other plain scalars by the safe
    constructor's own functions, and anything else (a merge key, a complex key, a set, a
    timestamp, an unknown tag) by the general path, which also raises its errors. A
    10,000-job file of plain scalars repeats a few hundred distinct ones, so resolving each
    distinct scalar once (per document) saves most of the resolver's time."""

    may_alias = False
    #: each distinct scalar's tag (the loader's own, made at its first scalar)
    _resolved: dict[tuple[Any, Any], Any] | None = None

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is not _SCALAR_NODE:
            return super().resolve(kind, value, implicit)  # type: ignore[misc]
        memo = self._resolved
        if memo is None:
            memo = self._resolved = {}
        key = (value, implicit)
        tag = memo.get(key)
        if tag is None:
            tag = memo[key] = super().resolve(kind, value, implicit)  # type: ignore[misc]
        return tag

    def construct_document(self, node: Any) -> Any:
        data = self._tree(node)
        self.state_generators: list[Any] = []
        self.constructed_objects: dict[Any, Any] = {}
        self.recursive_objects: dict[Any, Any] = {}
        self.deep_construct = False
        return data

    def _tree(self, node: Any) -> Any:
        tag = node.tag
        if isinstance(node, yaml.ScalarNode):
            if tag == _STR_TAG:
                return node.value
            if tag in _PLAIN_SCALAR_TAGS:
                return self.yaml_constructors[tag](self, node)  # type: ignore[attr-defined]
        elif isinstance(node, yaml.SequenceNode):
            if tag == _SEQ_TAG:
                return [self._tree(item) for item in node.value]
        elif tag == _MAP_TAG and all(isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG
                                     for k, _ in node.value):
            keys = [self._tree(k) for k, _ in node.value]
            seen: set[Any] = set()
            for key, (key_node, _) in zip(keys, node.value):
                if isinstance(key, (str, int, float, bool)):
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)
            return {key: self._tree(v) for key, (_, v) in zip(keys, node.value)}
        return self.construct_object(node, deep=True)  # type: ignore[attr-defined]


for _loader in (_UniqueKeyLoader, _FastUniqueKeyLoader):
    _loader.yaml_implicit_resolvers = _yaml12_resolvers(_loader.yaml_implicit_resolvers)
    _loader.add_constructor(_INT_TAG, _bounded_number("int"))
    _loader.add_constructor(_FLOAT_TAG, _bounded_number("float"))


class _TreeUniqueKeyLoader(_TreeConstruct, _UniqueKeyLoader):
    """The pure-Python loader for a text with no ``*`` (no alias: a tree)."""


class _FastTreeUniqueKeyLoader(_TreeConstruct, _FastUniqueKeyLoader):
    """libyaml's loader for a text with no ``*`` (no alias: a tree)."""


#: Texts longer than this are parsed by libyaml first (when PyYAML has it).
_FAST_PATH_CHARS = 16384


#: libyaml's safe loader where PyYAML was built with it (the same constructors and
#: resolver as the pure-Python one, its parser in C)
_SHIPPED_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_shipped_yaml(text: str) -> Any:
    """A data file shipped inside the package (the GPU catalog, the efficiency table, the
    bundled clusters): trusted, so none of a user file's checks, on libyaml's parser where
    there is one (the 16 KB GPU catalog took 60 ms to parse in Python, a sixteenth of a
    1,000-job round)."""
    return yaml.load(text, Loader=_SHIPPED_LOADER)


def parse_yaml_text(text: str, source: str) -> Any:
    """YAML text to data (safe tags only); every failure is an :class:`InputError`."""
    try:
        tree = "*" not in text  # an alias needs one; without it no node is shared
        if len(text) > _FAST_PATH_CHARS and _FastUniqueKeyLoader is not _UniqueKeyLoader:
            with contextlib.suppress(yaml.YAMLError):
                return yaml.load(text, Loader=_FastTreeUniqueKeyLoader if tree
                                 else _FastUniqueKeyLoader)
        return yaml.load(text, Loader=_TreeUniqueKeyLoader if tree else _UniqueKeyLoader)
    except _Refused as exc:
        raise InputError(source, "(file)", f"YAML refused: {exc}") from None
    except RecursionError:
        raise InputError(source, "(file)", "malformed YAML: nesting too deep") from None
    except yaml.reader.ReaderError as exc:  # a character YAML never allows (NUL, C0 controls)
        c = exc.character
        code = ord(c) if isinstance(c, str) else int(c)
        raise InputError(source, "(file)", f"malformed YAML: character #x{code:04x} at "
                         f"position {exc.position}: special characters are not allowed") \
            from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise InputError(source, where, f"malformed YAML: {problem}") from None


def read_yaml(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Parse a YAML file; every failure becomes an :class:`InputError` naming the file."""
    return parse_yaml_text(read_text(path, "YAML", max_bytes=max_bytes), str(path))


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------
class _JsonConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a JSON input (Python's json takes them)."""


def _no_constant(name: str) -> Any:
    raise _JsonConstant(name)


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _constant_place(text: str) -> str:
    """``line L, column C`` of the first NaN/Infinity outside a string (for the message)."""
    for m in _JSON_TOKENS.finditer(text):
        if m.group(1):
            line = text.count("\n", 0, m.start()) + 1
            return f"line {line}, column {m.start() - text.rfind(chr(10), 0, m.start())}"
    return "(file)"


def _json_depth_ok(data: Any, max_depth: int) -> bool:
    stack = [(data, 1)]
    while stack:
        d, level = stack.pop()
        if isinstance(d, (dict, list)):
            if level > max_depth:
                return False
            stack.extend((v, level + 1) for v in (d.values() if isinstance(d, dict) else d))
    return True


def _bounded_json_int(text: str) -> int | str:
    """A JSON integer; one of more than :data:`MAX_NUMBER_CHARS` characters stays its text,
    as in the YAML reader, so the schema refuses it naming its field (Python's own limit
    of 4,300 digits comes with a message about ``sys``)."""
    return text if len(text) > MAX_NUMBER_CHARS else int(text)


def parse_json_text(text: str, source: str) -> Any:
    """JSON text to data; ``NaN``/``Infinity``, malformed text, too deep nesting and numbers
    too long to convert are an :class:`InputError` naming the line and column."""
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_json_int)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}, column {exc.colno}",
                         f"malformed JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(source, "(file)", "malformed JSON: nesting too deep") from None
    except _JsonConstant as exc:
        raise InputError(source, _constant_place(text), f"{exc} is not a number: JSON has "
                         "no NaN or Infinity, and no input takes them") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise InputError(source, "(file)", f"malformed JSON: {exc}") from None
    if not _json_depth_ok(data, MAX_YAML_DEPTH):
        raise InputError(source, "(file)", f"malformed JSON: nesting too deep (more than "
                         f"{MAX_YAML_DEPTH} levels)")
    return data


def parse_json_line(text: str, source: str, line: int) -> Any:
    """One line of a JSON-lines file by :func:`parse_json_text`'s rules, a refusal naming
    the file's line (``line 7, column 12``) rather than the text's."""
    try:
        return parse_json_text(text, source)
    except InputError as exc:
        where = exc.field
        m = re.match(r"line \d+, column (\d+)$", where)
        where = f"line {line}, column {m.group(1)}" if m else f"line {line}"
        raise InputError(source, where, exc.message) from None


def read_json(path: str | Path, kind: str = "JSON") -> Any:
    """Parse a JSON file by the reader's rules (:func:`parse_json_text`)."""
    return parse_json_text(read_text(path, kind), str(path))


# ---------------------------------------------------------------------------
# Numbers (in CSV fields, trace lines, command-line values)
# ---------------------------------------------------------------------------
def parse_number(text: str, source: str, where: str, *, integer: bool = False,
                 minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None) -> float | int:
    """A finite number written as text, within bounds; :class:`InputError` otherwise.

    ``integer``: a whole number (``8`` or ``8.0``), returned as ``int``. ``minimum`` and
    ``maximum`` are inclusive, ``above`` exclusive. Text longer than
    :data:`MAX_NUMBER_CHARS` is refused before any conversion (Python's ``int`` refuses
    4,300 digits only after reading them).
    """
    s = str(text).strip()
    if not s:
        raise InputError(source, where, "a number is required, the field is empty")
    if len(s) > MAX_NUMBER_CHARS:
        raise InputError(source, where, f"a number of {len(s)} characters; at most "
                         f"{MAX_NUMBER_CHARS} are accepted")
    try:
        value = float(s)
    except ValueError:
        raise InputError(source, where, f"{s!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(source, where, f"must be a finite number, got {s!r}")
    if integer:
        if value != int(value):
            raise InputError(source, where, f"must be a whole number, got {s!r}")
        try:
            value = int(s)
        except ValueError:  # "8.0", "1e3": whole, written as a float
            value = int(value)
    if above is not None and not value > above:
        raise InputError(source, where, f"must be greater than {above:g}, got {s}")
    if minimum is not None and value < minimum:
        raise InputError(source, where, f"must be at least {minimum:g}, got {s}")
    if maximum is not None and value > maximum:
        raise InputError(source, where, f"must be at most {maximum:g}, got {s}")
    return value


def _option_field(option: str) -> str:
    return option.lstrip("-").replace("-", "_") or option


def check_count(value: int, option: str, *, maximum: int, minimum: int = 1,
                what: str = "") -> int:
    """A count given on the command line (``--seeds``, ``--batch``, a case's jobs), bounded
    before anything is allocated for it; :class:`InputError` names the option and the
    limit. ``what`` names the part of the option's value, where it has several."""
    field_name = what or _option_field(option)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(option, field_name, f"must be a whole number, got {value!r}")
    if value < minimum:
        raise InputError(option, field_name, f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise InputError(option, field_name, f"must be at most {maximum:,} (the limit), "
                         f"got {value:,}")
    return value


def parse_count(text: str, option: str, *, maximum: int, minimum: int = 1,
                what: str = "") -> int:
    """A count written as text in an option's value (``--sizes 1000,2000``, ``--case
    J:G:B``): a whole number (:func:`parse_number`), then :func:`check_count`."""
    field_name = what or _option_field(option)
    value = parse_number(text, option, field_name, integer=True)
    return check_count(int(value), option, maximum=maximum, minimum=minimum, what=what)


# ---------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------
@dataclass
class CsvTable:
    """A CSV read by the reader's rules: its header, rows (column -> text) and the line
    each row starts on, for messages that name it."""

    source: str
    header: tuple[str, ...]
    rows: list[dict[str, str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int, column: str) -> str:
        """``line N, column NAME`` of row ``i``'s field (the names users see)."""
        return f"line {self.lines[i]}, column {column}"

    def number(self, i: int, column: str, **bounds: Any) -> float | int:
        """Row ``i``'s ``column`` as a number (:func:`parse_number`'s bounds)."""
        return parse_number(self.rows[i].get(column) or "", self.source, self.where(i, column),
                            **bounds)

    def optional_number(self, i: int, column: str, **bounds: Any) -> float | int | None:
        """As :meth:`number`, ``None`` when the column is absent or the field empty."""
        text = (self.rows[i].get(column) or "").strip()
        return None if not text else self.number(i, column, **bounds)

    def iter(self) -> Iterator[tuple[int, dict[str, str]]]:
        return iter(enumerate(self.rows))


def _csv_lines(text: str) -> Iterator[str]:
    return iter(io.StringIO(text, newline=""))


def parse_csv_text(text: str, source: str, *, required: Sequence[str] = (),
                   delimiter: str = ",", max_field: int = MAX_FIELD_CHARS) -> CsvTable:
    """CSV text to a :class:`CsvTable` with the reader's limits (see the module docstring).

    The first line is the header: names are stripped (and a UTF-8 byte-order mark
    dropped), must be unique, at most :data:`MAX_CSV_COLUMNS`. ``required`` columns must
    be present. A row with more fields than the header, a NUL byte or a field over
    ``max_field`` characters is refused with its line. Empty lines are skipped.
    """
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise InputError(source, f"line {line}", "a NUL byte; a CSV is text")
    old = csv.field_size_limit()
    csv.field_size_limit(max_field + 1)  # the csv module stops a runaway quoted field
    try:
        reader = csv.reader(_csv_lines(text), delimiter=delimiter, strict=False)
        try:
            head = next(reader, None)
            if head is None:
                raise InputError(source, "(header)", "an empty file; a CSV needs a header line")
            header = tuple(h.strip().lstrip("\ufeff") for h in head)
            if len(header) > MAX_CSV_COLUMNS:
                raise InputError(source, "(header)", f"{len(header)} columns; at most "
                                 f"{MAX_CSV_COLUMNS} are accepted")
            seen: set[str] = set()
            for name in header:
                if len(name) > max_field:
                    raise InputError(source, "(header)", f"a column name of {len(name)} "
                                     f"characters; at most {max_field}")
                if name in seen:
                    raise InputError(source, "(header)", f"column {name!r} appears twice")
                seen.add(name)
            missing = [c for c in required if c not in seen]
            if missing:
                raise InputError(source, "(header)", f"missing columns {', '.join(missing)} "
                                 f"(needs {', '.join(required)})")
            table = CsvTable(source, header)
            while True:
                start = reader.line_num + 1
                row = next(reader, None)
                if row is None:
                    break
                if not any(row):  # an empty line (a line of spaces is a row: pandas reads it)
                    continue
                if len(row) > len(header):
                    raise InputError(source, f"line {start}", f"{len(row)} fields, the header "
                                     f"has {len(header)}")
                for f in row:
                    if len(f) > max_field:
                        raise InputError(source, f"line {start}", f"a field of {len(f)} "
                                         f"characters; at most {max_field} are accepted")
                table.rows.append(dict(zip(header, row)))
                table.lines.append(start)
        except csv.Error as exc:
            where = f"line {reader.line_num}" if reader.line_num else "(file)"
            msg = str(exc)
            if "field larger than field limit" in msg:
                msg = f"a field of more than {max_field} characters"
            raise InputError(source, where, f"malformed CSV: {msg}") from None
    finally:
        csv.field_size_limit(old)
    return table


def read_csv(path: str | Path, kind: str = "CSV", *, required: Sequence[str] = (),
             delimiter: str = ",", max_bytes: int = MAX_FILE_BYTES) -> CsvTable:
    """Read a CSV file by the reader's rules (:func:`read_text`, :func:`parse_csv_text`)."""
    return parse_csv_text(read_text(path, kind, max_bytes=max_bytes), str(path),
                          required=required, delimiter=delimiter)


# ---------------------------------------------------------------------------
# NPZ
# ---------------------------------------------------------------------------
def read_npz(path: str | Path, names: Sequence[str], kind: str = "NPZ", *,
             max_elements: int = MAX_NPZ_ELEMENTS,
             max_bytes: int = MAX_FILE_BYTES) -> dict[str, np.ndarray]:
    """The arrays ``names`` of an ``.npz`` file, bounded before anything is decompressed.

    The archive is read once (:func:`read_bytes`); each array's ``.npy`` header gives its
    shape and dtype, and their element count together must stay within
    ``max_elements``: a 4 MB archive of zeros would otherwise inflate to gigabytes.
    Object arrays (pickles) are refused, never loaded. Missing arrays, a file that is not
    a zip archive and a truncated array are :class:`InputError` naming the file.
    """
    import numpy as np  # here, not at the top: every command reads YAML, few read arrays

    src = str(path)
    raw = read_bytes(path, kind, max_bytes=max_bytes)
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InputError(src, "(file)", f"not an .npz archive (not a zip file: {exc})") from None
    out: dict[str, np.ndarray] = {}
    total = 0
    with archive:
        members = set(archive.namelist())
        for name in names:
            member = f"{name}.npy"
            if member not in members:
                raise InputError(src, "(file)", f"no array {name!r} (needs "
                                 f"{', '.join(repr(n) for n in names)})")
            try:
                with archive.open(member) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                    else:
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
                    if dtype.hasobject:
                        raise InputError(src, name, "an array of Python objects (a pickle); "
                                         "only numbers and strings are read")
                    count = math.prod(shape)
                    total += count
                    if total > max_elements:
                        raise InputError(src, name, f"array of shape {tuple(shape)}: the "
                                         f"arrays may hold {max_elements} elements together")
                    nbytes = count * dtype.itemsize
                    data = fh.read(nbytes)
            except InputError:
                raise
            except (ValueError, OSError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
                raise InputError(src, name, f"unreadable array: {exc}") from None
            if len(data) != nbytes:
                raise InputError(src, name, f"truncated array: {len(data)} of {nbytes} bytes")
            arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
            out[name] = arr.copy()
    return out
