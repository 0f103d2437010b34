"""Output files, written one way for every output option of every command.

Operators point ``--json``, ``--dump-problem``, ``--jobs-csv``, ``--markdown``
and ``--out`` at all sorts of things: ``-`` for a pipe, ``/dev/stdout``, a
named pipe another program reads, a symlink kept in a config folder, a file in
a shared folder with a group-writable umask. The rules, and why:

* ``-`` is stdout (the human tables then go to stderr, so the pipe carries only
  the data).
* An existing target that is not a regular file (a character or block device,
  a FIFO, a socket, or a symlink to one of those) is written **in place**, as a
  shell redirection would: replacing ``/dev/stdout`` or ``/dev/null`` with a
  regular file (what a temporary-file-and-rename does) breaks the host.
* A regular file is replaced **atomically** (temporary file in the same folder,
  ``fsync``, rename): a reader never sees half a file, a crash never leaves one.
  A new file gets ``0666 & ~umask`` (what ``open()`` would give); a replaced
  file keeps its permission bits. ``mkstemp``'s 0600 would hide results from
  the group the umask allows.
* A symlink to a regular file (or a dangling one) is followed: the target is
  replaced atomically and the link is kept.
* Every output path is checked before any work is done (:func:`check_outputs`),
  so a bad path costs nothing and, with ``--state``, commits nothing.
* An output is never one of the command's own inputs or its store (nor the store's
  ``-wal``/``-shm``/``.lock`` files): :mod:`apportion.protected` remembers what the
  command reads, and the check refuses such an output by name, at check time and again
  at write time.
* What was checked is what is written: the folder a file is replaced in is opened
  once and every step goes through that descriptor (``openat``-style), and a
  device or FIFO is opened without following links and compared with the file
  checked, so swapping either for a symlink after the check is refused, never
  written through.
* A FIFO nothing reads is refused (after :data:`FIFO_READER_WAIT_S`), never a
  write that blocks for ever. :class:`PreparedOutputs` opens a command's outputs
  before it commits anything, so whatever can be refused is refused first.

Failures while writing become :class:`apportion.errors.HostError` (a full disk
exits 75, "try again later"; a permission problem exits 2), never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from apportion import protected
from apportion.errors import HostError, InputError

STDOUT = "-"

__all__ = ["STDOUT", "OutputFailed", "OutputTarget", "PreparedOutputs", "any_stdout",
           "check_output", "check_output_dir", "check_outputs", "current_umask", "is_stdout",
           "open_output", "write_json", "write_text"]


def is_stdout(path: str | Path | None) -> bool:
    """Whether an output option names stdout (``-``)."""
    return path is not None and str(path) == STDOUT


def any_stdout(*paths: str | Path | None) -> bool:
    """Whether an output goes to this process's stdout: ``-``, or a path that is the same
    file (``/dev/stdout``, or the file stdout is redirected to); the human tables then go to
    stderr so the data stays clean."""
    try:
        out = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test runner's buffer)
        out = None
    for p in paths:
        if p is None:
            continue
        if is_stdout(p):
            return True
        if out is not None:
            try:
                if os.path.samestat(os.stat(p), out):
                    return True
            except (OSError, ValueError):
                continue
    return False


def current_umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass(frozen=True)
class OutputTarget:
    """A checked output: where the bytes go and how they get there."""

    option: str
    given: str
    kind: str  # "stdout" | "special" | "regular" (exists) | "new"
    real: Path | None  # the file written (symlinks resolved); None for stdout
    mode: int = 0  # st_mode of an existing target
    # (st_dev, st_ino) when checked: of the existing target ("special", "regular") and of
    # the folder a file is replaced in ("regular", "new"); the write re-checks them through
    # the descriptor it writes with, so a swap after the check is refused, never followed
    ident: tuple[int, int] | None = None
    folder: tuple[int, int] | None = None

    @property
    def is_socket(self) -> bool:
        return stat.S_ISSOCK(self.mode)


def _writable_dir(folder: Path, given: str, option: str) -> tuple[int, int]:
    try:
        st = folder.stat()
    except FileNotFoundError:
        raise InputError(given, option, f"folder {folder} does not exist") from None
    except OSError as exc:
        raise InputError(given, option, f"folder {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(given, option, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(given, option, f"folder {folder} is not writable by this user "
                         "(or is on a read-only file system); choose another path")
    return (st.st_dev, st.st_ino)


#: the first check of each (path, option) in this process: the write compares what it finds
#: with it (:func:`_pinned`), so a swap between a command's early check and its write is
#: refused; an entry is dropped once the output is written
_CHECKED: dict[tuple[str, str], OutputTarget] = {}


def check_output(path: str | Path | None, option: str) -> OutputTarget | None:
    """Check one output path before any work; :class:`InputError` names the option. The
    first check of a path is remembered: the write holds the output to it."""
    target = _check_output(path, option)
    if target is not None and target.kind != "stdout":
        _CHECKED.setdefault((os.path.abspath(target.given), option), target)
    return target


def _pinned(path: str | Path, option: str) -> OutputTarget:
    """The output as it is now, held to its first check: the same file (or folder, for a
    file replaced atomically) by identity, reached by the same resolved path. A symlink
    planted at the path, a device or FIFO swapped, a folder replaced by a link to another:
    refused, never written through."""
    target = _check_output(path, option)
    assert target is not None
    if target.kind == "stdout":
        return target
    first = _CHECKED.pop((os.path.abspath(target.given), option), None)
    if first is None or _is_descriptor_link(Path(target.given), Path(target.given)):
        return target  # /dev/stdout, /proc/self/fd/N: this process's own, nothing to swap
    special = target.kind == "special"
    if first.real != target.real or (first.kind == "special") != special \
            or (special and first.ident != target.ident):
        raise _changed(target, "the output")
    return dataclasses.replace(target, folder=first.folder or target.folder,
                               ident=first.ident if special else target.ident)


def _check_output(path: str | Path | None, option: str) -> OutputTarget | None:
    if path is None:
        return None
    given = str(path)
    if given == STDOUT:
        return OutputTarget(option, given, "stdout", None)
    if not given or "\0" in given:
        raise InputError(repr(given), option, "not a usable path")
    p = Path(given)
    try:
        real = Path(os.path.realpath(p))
    except (OSError, ValueError) as exc:
        raise InputError(given, option, f"cannot resolve: {exc}") from None
    try:
        st = os.stat(p)  # follows symlinks
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a symlink loop, a path through a file, ...
        raise InputError(given, option, f"cannot use as an output: "
                         f"{exc.strerror or exc}") from None
    hit = protected.claimed(real, st)
    if hit is not None:
        raise InputError(given, option, f"is {hit.what} of this command ({hit.given}); an "
                         "output never replaces an input or the store: choose another file")
    if st is None:  # new file (or a dangling symlink: its target is created)
        folder = _writable_dir(real.parent, given, option)
        return OutputTarget(option, given, "new", real, folder=folder)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(given, option, "is a folder; give a file name")
    if _is_descriptor_link(p, real):
        # /dev/stdout, /dev/fd/N, /proc/self/fd/N: an open file of this process (a pipe, a
        # terminal, or the file a shell redirected to): appended to in place, never replaced
        return OutputTarget(option, given, "special", p, st.st_mode)
    ident = (st.st_dev, st.st_ino)
    if stat.S_ISREG(st.st_mode):
        folder = _writable_dir(real.parent, given, option)
        if not os.access(real, os.W_OK):
            raise InputError(given, option, "the file is read-only for this user")
        return OutputTarget(option, given, "regular", real, st.st_mode, ident, folder)
    # a device, a FIFO or a socket: written in place, never replaced
    if not stat.S_ISSOCK(st.st_mode) and not os.access(real, os.W_OK):
        raise InputError(given, option, "not writable by this user")
    return OutputTarget(option, given, "special", real, st.st_mode, ident)


def _is_descriptor_link(p: Path, real: Path) -> bool:
    given = os.path.abspath(p)
    return (str(real).startswith("/proc/") or given.startswith(("/proc/", "/dev/fd/"))
            or given in ("/dev/stdout", "/dev/stderr"))


def check_outputs(*pairs: tuple[str | Path | None, str],
                  inputs: tuple[tuple[str | Path | None, str], ...] = ()
                  ) -> list[OutputTarget | None]:
    """Check several ``(path, option)`` outputs of one command: each one, then that no two
    name the same file and at most one is stdout. ``inputs``: the command's input options
    ``(path, option)``, refused as outputs here, before any work."""
    protected.protect_paths(*inputs)
    targets = [check_output(p, opt) for p, opt in pairs]
    _distinct(targets)
    return targets


def _distinct(targets: list[OutputTarget | None]) -> None:
    """No two outputs of one command on the same file, at most one on stdout."""
    seen: dict[str, str] = {}
    for t in targets:
        if t is None:
            continue
        key = STDOUT if t.kind == "stdout" else str(t.real)
        if key in seen and (t.kind != "special" or key == STDOUT):
            raise InputError(t.given, t.option, f"also given to {seen[key]}; each output needs "
                             "its own file (at most one may be -, stdout)")
        seen[key] = t.option


def check_output_dir(path: str | Path | None, option: str) -> Path | None:
    """An output folder (``--out DIR``, ``--workdir``): an existing writable folder, or one
    that can be created under the nearest existing ancestor."""
    if path is None:
        return None
    given = str(path)
    if not given or "\0" in given:
        raise InputError(repr(given), option, "not a usable path")
    p = Path(given)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(given, option, f"cannot use as a folder: {exc.strerror or exc}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(given, option, "exists and is not a folder")
        _writable_dir(p, given, option)
        return p
    anc = Path(os.path.abspath(p)).parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    _writable_dir(anc, given, option)
    return p


def _host_error(exc: OSError, target: str) -> HostError:
    return HostError.from_os_error(exc, f"cannot write {target}")


class OutputFailed(HostError):
    """Writing an output failed (the disk is full, the reader went away): ``target`` and
    ``reason`` let a caller that has already committed something say so instead of the
    generic remedy (``solve-round --state`` must not suggest a rerun that commits twice)."""

    def __init__(self, exc: OSError, target: str) -> None:
        base = _host_error(exc, target)
        super().__init__(str(base), base.exit_code)
        self.target = target
        self.reason = exc.strerror or str(exc)

    def __reduce__(self) -> Any:  # a plain HostError across processes
        return (HostError, (str(self), self.exit_code))


#: how long an output FIFO may take to get its reader (``cat PIPE`` started just after)
FIFO_READER_WAIT_S = 1.0

_WRITE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK


def _changed(target: OutputTarget, what: str) -> InputError:
    return InputError(target.given, target.option, f"{what} changed after it was checked "
                      "(replaced or swapped for a link); nothing was written through it")


def _open_special(target: OutputTarget) -> int:
    """A descriptor for a device or FIFO, opened without following a link that was swapped
    in after the check, and refused if it is not the file that was checked. A FIFO is
    opened non-blocking: with no reader (after :data:`FIFO_READER_WAIT_S`) it is refused
    instead of blocking the command for ever."""
    real = target.real
    assert real is not None
    descriptor = _is_descriptor_link(real, real)  # /dev/stdout, /proc/self/fd/N: ours
    flags = _WRITE_FLAGS | (0 if descriptor else os.O_NOFOLLOW)
    waited = 0.0
    while True:
        try:
            fd = os.open(real, flags)
            break
        except OSError as exc:
            if exc.errno == errno.ENXIO and waited < FIFO_READER_WAIT_S:
                time.sleep(0.05)
                waited += 0.05
                continue
            if exc.errno == errno.ENXIO:
                raise InputError(target.given, target.option, "a named pipe (FIFO) that "
                                 "nothing reads: a write would block for ever; start its "
                                 "reader first") from None
            if exc.errno == errno.ELOOP:
                raise _changed(target, "the output") from None
            raise _host_error(exc, str(real)) from None
    try:
        st = os.fstat(fd)
        if not descriptor and target.ident is not None \
                and (st.st_dev, st.st_ino) != target.ident:
            raise _changed(target, "the output")
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)  # the reader sets the pace
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_folder(target: OutputTarget, real: Path) -> int:
    """The folder a file is replaced in, pinned by a descriptor that is the folder checked:
    every later step (the temporary file, the rename, the fsync) goes through it, so a
    folder swapped for a link after the check cannot redirect the write."""
    try:
        dfd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _host_error(exc, str(real)) from None
    st = os.fstat(dfd)
    if target.folder is not None and (st.st_dev, st.st_ino) != target.folder:
        os.close(dfd)
        raise _changed(target, f"the folder {real.parent}")
    return dfd


class _Opened:
    """One output opened for writing: ``stream`` takes the bytes; :meth:`finish` makes them
    final (a regular file appears by an atomic rename), :meth:`abort` leaves the old file."""

    def __init__(self, target: OutputTarget, binary: bool = False,
                 newline: str | None = None) -> None:
        self.target = target
        self.binary = binary
        self.newline = newline
        self.stream: IO[Any] | None = None
        self._sock: socket.socket | None = None
        self._dfd: int | None = None
        self._tmp: str | None = None
        self._done = False
        kind = target.kind
        if kind == "stdout":
            self.stream = sys.stdout.buffer if binary else sys.stdout
        elif kind == "special" and target.is_socket:
            self._open_socket()
        elif kind == "special":
            self.stream = self._fdopen(_open_special(target))
        else:
            self._open_temp()

    def _fdopen(self, fd: int) -> IO[Any]:
        return os.fdopen(fd, "wb" if self.binary else "w",
                         encoding=None if self.binary else "utf-8",
                         newline=None if self.binary else self.newline)

    def _open_socket(self) -> None:
        real = self.target.real
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(real))
        except OSError as exc:
            sock.close()
            raise HostError(f"cannot write {real}: it is a socket and nothing accepts a "
                            f"connection on it ({exc.strerror or exc})", 2) from None
        self._sock = sock
        self.stream = sock.makefile("wb" if self.binary else "w",
                                    encoding=None if self.binary else "utf-8",
                                    newline=None if self.binary else self.newline)

    def _open_temp(self) -> None:
        real = self.target.real
        assert real is not None
        mode = (stat.S_IMODE(self.target.mode) if self.target.kind == "regular"
                else 0o666 & ~current_umask())
        dfd = _open_folder(self.target, real)
        try:
            for _ in range(100):
                name = f".{real.name}.{secrets.token_hex(6)}.tmp"
                try:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=dfd)
                    break
                except FileExistsError:
                    continue
            else:
                raise FileExistsError(errno.EEXIST, "no free temporary name", str(real.parent))
            os.fchmod(fd, mode)
        except OSError as exc:
            os.close(dfd)
            raise _host_error(exc, str(real)) from None
        self._dfd, self._tmp = dfd, name
        self.stream = self._fdopen(fd)

    def finish(self) -> None:
        """Flush (and for a file: fsync, rename into place, fsync the folder)."""
        if self._done:
            return
        target, stream = self.target, self.stream
        assert stream is not None
        try:
            stream.flush()
            if self._tmp is not None:
                real = target.real
                assert real is not None and self._dfd is not None
                os.fsync(stream.fileno())
                stream.close()
                os.replace(self._tmp, real.name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
                self._tmp = None
                with contextlib.suppress(OSError):  # make the rename durable
                    os.fsync(self._dfd)
        except OSError as exc:
            self.abort()
            raise OutputFailed(exc, str(target.real or target.given)) from None
        self._close()

    def abort(self) -> None:
        """Leave things as they were: a temporary file is removed, the old file kept."""
        if self._tmp is not None and self._dfd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp, dir_fd=self._dfd)
            self._tmp = None
        self._close()

    def _close(self) -> None:
        if self._done:
            return
        self._done = True
        if self.target.kind != "stdout" and self.stream is not None:
            with contextlib.suppress(OSError):
                self.stream.close()
        if self._sock is not None:
            self._sock.close()
        if self._dfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dfd)
            self._dfd = None


@contextlib.contextmanager
def open_output(path: str | Path, option: str = "output", *, binary: bool = False,
                newline: str | None = None) -> Iterator[IO[Any]]:
    """A file handle for one output, with the rules of this module (see the docstring).

    The body writes to the handle; a regular file appears (atomically) only when the
    body returns normally, so an exception leaves the old file, or none.
    """
    target = _pinned(path, option)
    opened = _Opened(target, binary, newline)
    assert opened.stream is not None
    try:
        yield opened.stream
    except OSError as exc:
        opened.abort()
        raise OutputFailed(exc, str(target.real or target.given)) from None
    except BaseException:
        opened.abort()
        raise
    opened.finish()


class PreparedOutputs:
    """Several outputs of one command, checked **and opened** before it commits anything.

    ``solve-round --state`` commits a round and then writes its outputs. Opening them
    first means that whatever can be refused is refused while nothing is committed: a
    FIFO nothing reads, a folder that is read-only or gone, a socket nothing accepts on.
    What can still fail afterwards (a full disk) raises :class:`OutputFailed`, which the
    caller reports with what it committed. Use as a context manager: outputs not
    written by the end are discarded (their temporary files removed, old files kept).
    """

    def __init__(self, *pairs: tuple[str | Path | None, str]) -> None:
        self._opened: dict[str, _Opened] = {}
        targets = [_pinned(p, opt) if p is not None else None for p, opt in pairs]
        _distinct(targets)
        try:
            for t in targets:
                if t is not None:
                    self._opened[t.option] = _Opened(t)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write_json(self, option: str, data: Any) -> None:
        """Write ``data`` as JSON to the output given for ``option`` and make it final."""
        opened = self._opened.pop(option)
        assert opened.stream is not None
        try:
            opened.stream.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        except OSError as exc:
            opened.abort()
            raise OutputFailed(exc, str(opened.target.real or opened.target.given)) from None
        opened.finish()

    def close(self) -> None:
        for opened in self._opened.values():
            opened.abort()
        self._opened.clear()


def write_with(path: str | Path, write: Callable[[IO[Any]], None], option: str = "output",
               *, binary: bool = False, newline: str | None = None) -> None:
    """Open ``path`` as an output (see :func:`open_output`) and let ``write`` fill it."""
    with open_output(path, option, binary=binary, newline=newline) as fh:
        write(fh)


def write_text(path: str | Path, text: str, option: str = "output") -> None:
    with open_output(path, option) as fh:
        fh.write(text)


def write_json(path: str | Path, data: Any, option: str = "output") -> None:
    """JSON (indented, one trailing newline), by the rules of this module."""
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    write_text(path, text, option)
