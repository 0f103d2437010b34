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

Failures while writing become :class:`apportion.errors.HostError` (a full disk
exits 75, "try again later"; a permission problem exits 2), never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from apportion.errors import HostError, InputError

STDOUT = "-"

__all__ = ["STDOUT", "OutputTarget", "any_stdout", "check_output", "check_output_dir",
           "check_outputs", "current_umask", "is_stdout", "open_output", "write_json",
           "write_text"]


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

    @property
    def is_socket(self) -> bool:
        return stat.S_ISSOCK(self.mode)


def _writable_dir(folder: Path, given: str, option: str) -> None:
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


def check_output(path: str | Path | None, option: str) -> OutputTarget | None:
    """Check one output path before any work; :class:`InputError` names the option."""
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
    if st is None:  # new file (or a dangling symlink: its target is created)
        _writable_dir(real.parent, given, option)
        return OutputTarget(option, given, "new", real)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(given, option, "is a folder; give a file name")
    if _is_descriptor_link(p, real):
        # /dev/stdout, /dev/fd/N, /proc/self/fd/N: an open file of this process (a pipe, a
        # terminal, or the file a shell redirected to): appended to in place, never replaced
        return OutputTarget(option, given, "special", p, st.st_mode)
    if stat.S_ISREG(st.st_mode):
        _writable_dir(real.parent, given, option)
        if not os.access(real, os.W_OK):
            raise InputError(given, option, "the file is read-only for this user")
        return OutputTarget(option, given, "regular", real, st.st_mode)
    # a device, a FIFO or a socket: written in place, never replaced
    if not stat.S_ISSOCK(st.st_mode) and not os.access(real, os.W_OK):
        raise InputError(given, option, "not writable by this user")
    return OutputTarget(option, given, "special", real, st.st_mode)


def _is_descriptor_link(p: Path, real: Path) -> bool:
    given = os.path.abspath(p)
    return (str(real).startswith("/proc/") or given.startswith(("/proc/", "/dev/fd/"))
            or given in ("/dev/stdout", "/dev/stderr"))


def check_outputs(*pairs: tuple[str | Path | None, str]) -> list[OutputTarget | None]:
    """Check several ``(path, option)`` outputs of one command: each one, then that no two
    name the same file and at most one is stdout."""
    targets = [check_output(p, opt) for p, opt in pairs]
    seen: dict[str, str] = {}
    for t in targets:
        if t is None:
            continue
        key = STDOUT if t.kind == "stdout" else str(t.real)
        if key in seen and (t.kind != "special" or key == STDOUT):
            raise InputError(t.given, t.option, f"also given to {seen[key]}; each output needs "
                             "its own file (at most one may be -, stdout)")
        seen[key] = t.option
    return targets


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


@contextlib.contextmanager
def open_output(path: str | Path, option: str = "output", *, binary: bool = False,
                newline: str | None = None) -> Iterator[IO[Any]]:
    """A file handle for one output, with the rules of this module (see the docstring).

    The body writes to the handle; a regular file appears (atomically) only when the
    body returns normally, so an exception leaves the old file, or none.
    """
    target = check_output(path, option)
    assert target is not None
    if target.kind == "stdout":
        stream: IO[Any] = sys.stdout.buffer if binary else sys.stdout
        yield stream
        stream.flush()
        return
    real = target.real
    assert real is not None
    if target.kind == "special":
        if target.is_socket:
            with _socket_writer(real, binary, newline) as fh:
                yield fh
            return
        try:  # append: a no-op for devices and pipes, and never truncates a redirected file
            fh = open(real, "ab" if binary else "a",  # noqa: SIM115 (closed below) encoding=None if binary else "utf-8",
                      newline=None if binary else newline)
        except OSError as exc:
            raise _host_error(exc, str(real)) from None
        try:
            yield fh
            fh.flush()
        except OSError as exc:
            raise _host_error(exc, str(real)) from None
        finally:
            with contextlib.suppress(OSError):
                fh.close()
        return
    yield from _atomic(real, target, binary, newline)


def _atomic(real: Path, target: OutputTarget, binary: bool,
            newline: str | None) -> Iterator[IO[Any]]:
    mode = (stat.S_IMODE(target.mode) if target.kind == "regular"
            else 0o666 & ~current_umask())
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    except OSError as exc:
        raise _host_error(exc, str(real)) from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8",
                       newline=None if binary else newline) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _host_error(exc, str(real)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename durable
        dfd = os.open(real.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def _socket_writer(real: Path, binary: bool, newline: str | None) -> Iterator[IO[Any]]:
    """A listening Unix socket is written by connecting to it and sending the bytes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(real))
    except OSError as exc:
        sock.close()
        raise HostError(f"cannot write {real}: it is a socket and nothing accepts a "
                        f"connection on it ({exc.strerror or exc})", 2) from None
    fh = sock.makefile("wb" if binary else "w", encoding=None if binary else "utf-8",
                       newline=None if binary else newline)
    try:
        yield fh
        fh.flush()
    except OSError as exc:
        raise _host_error(exc, str(real)) from None
    finally:
        with contextlib.suppress(OSError):
            fh.close()
        sock.close()


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


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
