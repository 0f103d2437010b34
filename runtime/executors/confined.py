"""Job folders nobody else can redirect: opened without following links, owned, checked.

A job's folder (``<workdir>/<job folder name>``) has a predictable name, and the executor
writes into it as whoever runs apportion, often root: its launch files, ``OWNER``, the
ranks' logs, ``STOP``, the folder lock, and the workers' checkpoints below
``checkpoint/``. Anyone who can write ``--workdir`` could plant a symlink there first: a
linked job folder or ``checkpoint/`` sent the job's writes outside ``--workdir``, and a
``.OWNER.tmp`` link to a file had that file overwritten as root.

So every write here goes the way the store's lock already does:

* the job folder (and ``checkpoint/`` in it) is created and then opened relative to its
  parent with ``O_NOFOLLOW | O_DIRECTORY``: a link is refused, never followed;
* it must belong to this user (a folder someone else made is theirs to fill with links),
  and it is made writable by its owner only, so nobody else can plant an entry later; an
  entry that is already a symbolic link is refused by name;
* each file is opened relative to the folder's descriptor with ``O_NOFOLLOW``; a file
  replaced whole is written to a fresh ``O_EXCL`` name and renamed over (a rename never
  writes through a link); a file appended to (a log, the lock, ``STOP``) must be a regular
  file of this user with one name (no hard link to a file elsewhere).

A refusal is :class:`UnsafeFolder`: the launch fails, the store records why, the other
jobs go on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

#: the bits a job folder never has: nobody but its owner may add or rename entries
_OTHERS_WRITE = 0o022


class UnsafeFolder(OSError):
    """A job folder (or an entry in it) that could send a write elsewhere: refused."""


def _open_dir_at(parent_fd: int, name: str, shown: Path, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFolder(f"{shown}: a symbolic link or not a folder; refused (a "
                               "job's writes would land wherever it points): remove it, "
                               "apportion creates the folder itself") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafeFolder(f"{shown}: owned by uid {st.st_uid}, not by this user "
                           f"({os.geteuid()}); refused (its owner could plant links in it): "
                           "remove it, apportion creates the folder itself")
    if st.st_mode & _OTHERS_WRITE:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_OTHERS_WRITE)
    return fd


def _refuse_links(fd: int, shown: Path) -> None:
    with os.scandir(fd) as entries:
        for e in entries:
            if e.is_symlink():
                raise UnsafeFolder(f"{shown / e.name}: a symbolic link in a job folder; "
                                   "refused (a write to it would land wherever it points): "
                                   "remove it")


@contextlib.contextmanager
def job_folder(jobdir: str | Path, create: bool = True) -> Iterator[int]:
    """A descriptor of ``jobdir``, checked as the module says; closed on leaving.

    The parent (``--workdir``, the operator's own choice, links included) is opened as
    given; the job folder itself is never reached through a link."""
    p = Path(jobdir)
    parent = p.parent
    if create:
        parent.mkdir(parents=True, exist_ok=True)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_dir_at(pfd, p.name, p, create)
    finally:
        os.close(pfd)
    try:
        yield fd
    finally:
        os.close(fd)


def confine(jobdir: str | Path, subfolders: tuple[str, ...] = ()) -> Path:
    """Create (or check) ``jobdir`` and its ``subfolders``: no links, this user's, writable
    by this user only, no symbolic link among their entries. Returns ``jobdir``."""
    p = Path(jobdir)
    with job_folder(p) as fd:
        _refuse_links(fd, p)
        for name in subfolders:
            sub = _open_dir_at(fd, name, p / name, create=True)
            try:
                _refuse_links(sub, p / name)
            finally:
                os.close(sub)
    return p


def _checked_file(fd: int, shown: Path) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        what = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
                f"a hard link ({st.st_nlink} names)" if st.st_nlink != 1 else
                f"owned by uid {st.st_uid}")
        raise UnsafeFolder(f"{shown}: {what}; refused (a write to it would change another "
                           "file): remove it")
    return fd


def open_in(jobdir: str | Path, name: str, flags: int = os.O_WRONLY | os.O_APPEND,
            mode: int = 0o644) -> int:
    """A descriptor of ``jobdir/name``, created if missing, never through a link, checked
    to be this user's own regular file with one name (logs, the lock, ``STOP``)."""
    p = Path(jobdir)
    with job_folder(p) as dfd:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFolder(f"{p / name}: a symbolic link; refused (a write to it "
                                   "would land wherever it points): remove it") from None
            raise
    return _checked_file(fd, p / name)


def touch_in(jobdir: str | Path, name: str) -> None:
    """Create ``jobdir/name`` (a flag file such as ``STOP``) by the rules of :func:`open_in`."""
    os.close(open_in(jobdir, name))


def replace_in(jobdir: str | Path, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``jobdir/name`` whole with ``data``: written to a fresh name in the folder
    (``O_EXCL``: never an existing file or link), synced, renamed over ``name``."""
    p = Path(jobdir)
    with job_folder(p) as dfd:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def unlink_in(jobdir: str | Path, name: str) -> None:
    """Remove ``jobdir/name`` if present (the name itself, never what a link points at)."""
    p = Path(jobdir)
    try:
        with job_folder(p, create=False) as dfd, contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
