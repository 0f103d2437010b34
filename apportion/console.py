"""The terminal side of the command line: safe text, logging, progress.

* :func:`printable` escapes control and format characters (an ANSI escape, a
  bell, a bidirectional override) so that text from a file or from an older
  store row can never drive the operator's terminal; ids, error messages and
  log lines all go through it.
* :func:`setup_logging` sends the ``apportion`` loggers to stderr (level from
  ``-v`` or ``$APPORTION_LOG``), escaped the same way, as text or, with ``--log-format
  json`` (``$APPORTION_LOG_FORMAT``), one JSON object a line for a log collector: ``time``
  (RFC 3339, UTC), ``level``, ``logger``, ``message`` and the record's structured fields
  (``extra={"fields": {...}}``: a round's backend and status, a request's path and
  status). Library modules only log through ``logging.getLogger(__name__)``.
* :class:`Progress` reports a long command's progress on stderr: a rich bar on
  a terminal, a plain line every few seconds otherwise (a CI log, a pipe), so
  stdout keeps only the data.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import sys
import threading
import time
import unicodedata
from types import TracebackType
from typing import Any, Self

from rich.console import Console

LOGGER = "apportion"
_ESCAPED = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def printable(text: object, keep_newlines: bool = True) -> str:
    """``text`` with every control or format character written as an escape (``\\x1b``).

    Newlines and tabs stay when ``keep_newlines`` (a multi-line message); for an id
    pass ``False``.
    """
    s = str(text)
    if s.isprintable() and "\n" not in s:
        return s
    out = []
    for c in s:
        if c in "\n\t" and keep_newlines:
            out.append(c)
        elif c != " " and unicodedata.category(c) in _ESCAPED:
            out.append(c.encode("unicode_escape").decode("ascii"))
        else:
            out.append(c)
    return "".join(out)


def stdout_console() -> Console:
    """A console on the current stdout (CliRunner and pipes swap it, so never cached)."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200, emoji=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, stderr=True, width=None if sys.stderr.isatty() else 200,
                   emoji=False)


def err_line(text: str) -> None:
    """One plain line on stderr (escaped, no markup)."""
    sys.stderr.write(printable(text) + "\n")
    sys.stderr.flush()


# -- logging ----------------------------------------------------------------------------------
class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now, with non-printable characters escaped."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ assigns it
        pass

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: what a log collector (Loki, Elasticsearch, Cloud
    Logging) indexes without a parser of its own."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, object] = {"time": at.isoformat(timespec="milliseconds")
                                  .replace("+00:00", "Z"), "level": record.levelname.lower(),
                                  "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                           for k, v in out.items()}, default=str, ensure_ascii=True)


LOG_FORMATS = ("text", "json")
_TEXT = logging.Formatter("%(levelname)s %(name)s: %(message)s")
_handler: _StderrHandler | None = None


def log_level(verbose: bool = False) -> int:
    """``-v``: INFO; else ``$APPORTION_LOG`` (DEBUG, INFO, WARNING, ERROR or a number); else
    WARNING."""
    env = os.environ.get("APPORTION_LOG", "").strip().upper()
    level = logging.WARNING
    if env:
        level = int(env) if env.isdigit() else logging.getLevelName(env)
        if not isinstance(level, int):
            level = logging.WARNING
    if verbose:
        level = min(level, logging.INFO)
    return level


def log_format(given: str | None = None) -> str:
    """``--log-format`` if given, else ``$APPORTION_LOG_FORMAT``, else text; anything else
    is a :class:`ValueError` naming the choices."""
    fmt = (given or os.environ.get("APPORTION_LOG_FORMAT") or "text").strip().lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: give one of {', '.join(LOG_FORMATS)}")
    return fmt


def setup_logging(verbose: bool = False, fmt: str | None = None) -> None:
    """Attach one stderr handler to the ``apportion`` logger and set its level; ``fmt``
    (text or json; None: as set before, else ``$APPORTION_LOG_FORMAT``) sets its format."""
    global _handler
    logger = logging.getLogger(LOGGER)
    if _handler is None:
        _handler = _StderrHandler()
        _handler.setFormatter(JsonFormatter() if log_format(
            fmt if fmt is not None else _env_format()) == "json" else _TEXT)
        logger.addHandler(_handler)  # records still propagate (pytest's caplog, embedders)
    elif fmt is not None:
        _handler.setFormatter(JsonFormatter() if log_format(fmt) == "json" else _TEXT)
    logger.setLevel(log_level(verbose))


def _env_format() -> str:
    """``$APPORTION_LOG_FORMAT`` where it names a format (a bad one is refused by the
    command that takes ``--log-format``), else text."""
    try:
        return log_format()
    except ValueError:
        return "text"


def adopt_logger(name: str, level: int = logging.WARNING) -> None:
    """Send a library's own logger (uvicorn's) through apportion's handler, in its format,
    rather than Python's bare last-resort one: with ``--log-format json`` every line on
    stderr is then one JSON object."""
    if _handler is None:
        setup_logging()
    logger = logging.getLogger(name)
    if _handler not in logger.handlers:
        logger.addHandler(_handler)  # type: ignore[arg-type]
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(level)


def service_logs(*names: str) -> None:
    """Make the named loggers (a round's line, a request's) speak at the default level:
    a service's operator reads them without ``-v``. ``$APPORTION_LOG`` set to a level
    keeps its word."""
    if os.environ.get("APPORTION_LOG", "").strip():
        return
    for name in names:
        logging.getLogger(name).setLevel(logging.INFO)


def verbose_requested(argv: list[str]) -> bool:
    """Whether a command line asks for tracebacks (``-v``/``--verbose``, or APPORTION_LOG=DEBUG)."""
    if os.environ.get("APPORTION_LOG", "").strip().upper() == "DEBUG":
        return True
    return any(a in ("-v", "--verbose") for a in argv)


# -- progress ---------------------------------------------------------------------------------
def progress_interval_s() -> float:
    """Seconds between plain progress lines (``$APPORTION_PROGRESS_S``, default 10)."""
    try:
        return max(0.0, float(os.environ.get("APPORTION_PROGRESS_S", "10")))
    except ValueError:
        return 10.0


class Progress:
    """Progress of one long command on stderr.

    ``update(done, total)`` with counts where the work has them; with
    ``heartbeat=True`` a background thread also reports the elapsed time, for
    work that has no counts (a benchmark grid, a solver). On a terminal a rich
    bar; otherwise a plain line at most every :func:`progress_interval_s`
    seconds, and one at the end.
    """

    def __init__(self, description: str, total: int | None = None, unit: str = "",
                 heartbeat: bool = False, enabled: bool = True) -> None:
        self.description = printable(description, keep_newlines=False)
        self.total = total
        self.unit = unit
        self.done = 0
        self.enabled = enabled
        self.heartbeat = heartbeat
        self.tty = sys.stderr.isatty()
        self.interval = progress_interval_s()
        self._t0 = time.monotonic()
        self._last = -1e18
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        self._t0 = time.monotonic()
        if self.tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=stderr_console(), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.description, total=self.total)
        else:
            self._line(force=True)
            if self.heartbeat:
                self._thread = threading.Thread(target=self._beat, daemon=True,
                                                name="apportion-progress")
                self._thread.start()
        return self

    def update(self, done: float, total: float | None = None) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done = int(done)
            if total is not None:
                self.total = int(total)
            if self._rich is not None:
                self._rich.update(self._task, completed=self.done, total=self.total)
            else:
                self._line()

    def _beat(self) -> None:
        while not self._stop.wait(max(0.05, self.interval)):
            with self._lock:
                self._line()

    def _line(self, force: bool = False, final: str = "") -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        count = ""
        if self.total:
            count = f" {self.done}/{self.total}{' ' + self.unit if self.unit else ''}"
        elif self.done:
            count = f" {self.done}{' ' + self.unit if self.unit else ''}"
        sys.stderr.write(f"{self.description}:{count}{',' if count else ''} "
                         f"{final or 'running'}, {now - self._t0:.0f} s\n")
        sys.stderr.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._rich is not None:
            self._rich.stop()
        else:
            with self._lock:
                self._line(force=True, final="failed" if exc_type else "done")


__all__ = ["LOG_FORMATS", "JsonFormatter", "Progress", "adopt_logger", "err_line", "log_format", "log_level",
           "printable", "service_logs", "setup_logging", "stderr_console", "stdout_console",
           "verbose_requested"]
