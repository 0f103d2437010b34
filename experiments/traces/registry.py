"""The trace-format registry: every format a replay can read, by one name.

A :class:`TraceFormat` says how a file of its kind is **detected** (the header columns it
must have, and any further test on the content — never the file's name or folder), how it
is **loaded** (a function path -> :class:`~apportion.experiments.traces.base.Trace`), and
how its **ground truth** is given (the name of a registered truth, or a factory; the
truths ``--truth`` may choose instead; and any preparation for a replay, such as a
paper's adaptation). The comparison harness asks the format, never a string ladder.

Built-in formats register from their own modules in this package; a plug-in registers
through the ``apportion.trace_formats`` entry-point group (a :class:`TraceFormat`, or a
factory returning one), read on first use, so it is detected, listed by ``apportion
traces`` and replayed by ``simulate``/``compare`` like a built-in.

A file is given to the most specific format that detects it (the highest
``priority``); a file no format detects is refused by name (its columns, and the formats
that come closest with what each lacks), as is one two formats of one priority both
detect. Nothing is ever read as a format it does not match.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apportion.experiments.traces.base import Trace, check_trace_file

from apportion.errors import InputError
from apportion.inputs import MAX_TRACE_BYTES, read_head, read_text
from apportion.plugins import plugins

log = logging.getLogger(__name__)

#: the entry-point group of trace-format plug-ins
ENTRY_POINT_GROUP = "apportion.trace_formats"
#: columns a refusal shows (a file of garbage has one huge "column")
_SHOWN_COLUMNS, _SHOWN_CHARS = 12, 40


@dataclass
class Sniff:
    """What detection reads of a file: its path, its first line and that line's columns
    (a CSV header), and on demand one column's values (the whole file, by the bounded
    reader: a format told apart by its content, as ElasticFlow's by its models)."""

    path: Path
    first_line: str
    columns: frozenset[str]
    _values: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, path: str | Path) -> Sniff:
        p = Path(path)
        check_trace_file(p)
        head = read_head(p, "trace").decode("utf-8", "replace")  # the loader decodes strictly
        first = head.splitlines()[0] if head else ""
        header = next(csv.reader([first]), []) if first else []
        return cls(p, first, frozenset(c.strip().lstrip("\ufeff") for c in header))

    def values(self, column: str) -> frozenset[str]:
        """The distinct non-empty values of ``column`` (stripped); empty when there is no
        such column. The file is read by the bounded reader and streamed (only the distinct
        values are kept); a malformed row ends the scan, the loader then names it."""
        if column not in self.columns:
            return frozenset()
        if column not in self._values:
            text = read_text(self.path, "trace", max_bytes=MAX_TRACE_BYTES)
            reader = csv.reader(io.StringIO(text, newline=""))
            header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
            at = header.index(column)
            found: set[str] = set()
            try:
                for row in reader:
                    if len(row) > at and (v := row[at].strip()):
                        found.add(v)
            except csv.Error:
                pass
            self._values[column] = frozenset(found)
        return self._values[column]


@dataclass(frozen=True)
class Preparation:
    """What a format's preparation for one replay may read: the cluster, the replay's seed
    and ``--window-days``, and the ground truth chosen (its registered name and the
    truth itself, whose ``rate(job, gpu_type, gpus)`` gives iterations per second)."""

    cluster: Any
    seed: int
    window_days: float | None
    truth_name: str
    truth: Any


#: How a format's jobs are checked against the chosen truth before a replay: ``sample``
#: (one of the first 50 jobs has a rate on the cluster: the truth fits the trace at all),
#: ``every`` (each job has a rate at its GPU count on some type of the cluster: a user's
#: own trace, whose every job is theirs) or ``none`` (the preparation keeps only jobs the
#: truth rates, as Crius's adaptation does).
COVERAGE = ("sample", "every", "none")


@dataclass(frozen=True)
class TraceFormat:
    """One trace format: detection, loading, and its ground truth.

    * ``columns``: header columns a file must have; ``any_of``: at least one of these
      too; ``without``: columns it must not have; ``detect``: a further test on the
      :class:`Sniff` (a format with no columns is detected by ``detect`` alone).
    * ``priority``: the most specific format wins when several detect a file (a format
      identified by columns of its own: 50; the normalised-CSV family below it).
    * ``truth``: the ground truth of its replays (a name registered in
      :mod:`apportion.experiments.truths`, or a factory ``(cluster) -> truth``);
      ``truths``: the names ``--truth`` may choose instead (None: every truth that rates
      any trace's jobs), with ``why`` saying why others cannot apply.
    * ``prepare``: what a replay does to the loaded trace first (a paper's adaptation,
      work from durations), recording what it substitutes.
    * ``generated``: made by a generator (``synthetic:N``), never detected in a file.
    * ``example``: writes a small trace of the format into a folder and returns its
      ``--trace`` argument, and ``example_cluster`` a cluster it replays on: what
      :func:`apportion.testing.check_trace_format` checks, and what a reader can copy.
    """

    name: str
    doc: str
    load: Callable[[Path], Trace]
    columns: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    detect: Callable[[Sniff], bool] | None = None
    detected_by: str = ""  # in words, where columns do not say it (listings, refusals)
    priority: int = 50
    truth: str | Callable[[Any], Any] = "analytic"
    truths: tuple[str, ...] | None = None
    why: str = ""
    prepare: Callable[[Trace, Preparation], Trace] | None = None
    coverage: str = "sample"
    generated: bool = False
    example: Callable[[Path], str] | None = None
    example_cluster: str = "crius-testbed"

    def matches(self, sniff: Sniff) -> bool:
        """Whether ``sniff``'s file is of this format."""
        if self.generated or not (self.columns or self.any_of or self.detect):
            return False
        cols = sniff.columns
        if not set(self.columns) <= cols or (self.any_of and not set(self.any_of) & cols):
            return False
        if set(self.without) & cols:
            return False
        return self.detect(sniff) if self.detect is not None else True

    def lacks(self, columns: frozenset[str]) -> list[str]:
        """What a header of ``columns`` lacks (or has too many) to be of this format, in
        words; empty where the columns fit (content may still decide)."""
        out = [c for c in self.columns if c not in columns]
        if self.any_of and not set(self.any_of) & columns:
            out.append(" or ".join(self.any_of))
        out += [f"no {c} column" for c in self.without if c in columns]
        return out

    def described(self) -> str:
        """How a file of this format is recognised, in words."""
        if self.generated:
            return self.detected_by or "generated (a --trace name)"
        parts = []
        if self.columns:
            parts.append("columns " + ", ".join(self.columns))
        if self.any_of:
            parts.append("and " + " or ".join(self.any_of))
        if self.without:
            parts.append("without " + ", ".join(self.without))
        if self.detected_by:
            parts.append(self.detected_by)
        return " ".join(parts)

    def truth_name(self) -> str:
        return self.truth if isinstance(self.truth, str) else f"{self.name} (its own)"


_FORMATS: dict[str, TraceFormat] = {}
_PLUGINS = {"loaded": False}


def register(fmt: TraceFormat) -> TraceFormat:
    """Add ``fmt`` (a name already registered is replaced: a plug-in may refine a
    built-in). Returns it, so a module can keep the object it registered."""
    if not isinstance(fmt, TraceFormat):
        raise TypeError(f"{fmt!r} is not a TraceFormat")
    if fmt.coverage not in COVERAGE:
        raise ValueError(f"trace format {fmt.name}: coverage {fmt.coverage!r} is not one of "
                         f"{', '.join(COVERAGE)}")
    _FORMATS[fmt.name] = fmt
    return fmt


def load_plugins() -> list[str]:
    """Register what installed packages offer under ``apportion.trace_formats`` (once);
    returns the names added. A plug-in that fails to load is logged and left out."""
    if _PLUGINS["loaded"]:
        return []
    _PLUGINS["loaded"] = True
    added = []
    for name, obj in plugins(ENTRY_POINT_GROUP).items():
        try:
            fmt = obj if isinstance(obj, TraceFormat) else obj()
            register(fmt)
            added.append(fmt.name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the CLI
            log.warning("trace-format plug-in %s not registered: %s", name, exc)
    return added


def formats() -> dict[str, TraceFormat]:
    """Every registered trace format by name, plug-ins included."""
    load_plugins()
    return dict(_FORMATS)


def trace_format(name: str) -> TraceFormat:
    """The format registered as ``name`` (a KeyError naming the known ones)."""
    found = formats().get(name)
    if found is None:
        raise KeyError(f"unknown trace format {name!r}; known: {', '.join(sorted(_FORMATS))}")
    return found


def detect(path: str | Path) -> TraceFormat:
    """The format of a trace file, from its content (never its name): the most specific
    registered format that detects it. A file none detects, or two of one priority
    both do, is refused by name (:class:`InputError`, exit 2)."""
    sniff = Sniff.of(path)
    every = formats().values()
    found = [f for f in every if f.matches(sniff)]
    if not found:
        raise InputError(str(sniff.path), "(columns)", _no_format(sniff, list(every)))
    top = max(f.priority for f in found)
    best = sorted(f.name for f in found if f.priority == top)
    if len(best) > 1:
        raise InputError(str(sniff.path), "(columns)", f"the file matches the trace formats "
                         f"{' and '.join(best)} alike; one of them must be made more specific "
                         "(a plug-in's detection overlaps another's)")
    return _FORMATS[best[0]]


def _no_format(sniff: Sniff, every: list[TraceFormat]) -> str:
    """Why no format reads a file: its columns, and the closest formats with what each
    lacks (those a header decides; the others by how they are recognised)."""
    cols = sorted(sniff.columns)
    shown = [c if len(c) <= _SHOWN_CHARS else c[:_SHOWN_CHARS] + "..." for c in
             cols[:_SHOWN_COLUMNS]]
    more = f" and {len(cols) - _SHOWN_COLUMNS} more" if len(cols) > _SHOWN_COLUMNS else ""
    what = f"its columns ({', '.join(shown)}{more})" if any(cols) else "its first line"
    near = sorted((len(f.lacks(sniff.columns)), f.name, f.lacks(sniff.columns))
                   for f in every if not f.generated and (f.columns or f.any_of))
    close = "; ".join(f"{name} (needs {', '.join(lacks)})" if lacks else
                      f"{name} (the columns fit but not the content: {_fmt(name).described()})"
                      for _, name, lacks in near[:3])
    others = ", ".join(f"{f.name} ({f.described()})" for f in every
                       if not f.generated and not (f.columns or f.any_of))
    return (f"{what} match no registered trace format, so it is not read as any; closest: "
            f"{close}" + (f"; also {others}" if others else "") +
            " (`apportion traces` lists every format)")


def _fmt(name: str) -> TraceFormat:
    return _FORMATS[name]


def detect_format(path: str | Path) -> str:
    """The name of a trace file's format (:func:`detect`)."""
    return detect(path).name


def load_any(path: str | Path) -> Trace:
    """Detect the format of a file by its content (:func:`detect`) and load it; the trace
    carries the format's name."""
    fmt = detect(path)
    t = fmt.load(Path(path))
    if not isinstance(t, Trace):
        raise TypeError(f"trace format {fmt.name}: load returned {type(t).__name__}, not a "
                        "Trace")
    return t if t.format == fmt.name else replace(t, format=fmt.name)
