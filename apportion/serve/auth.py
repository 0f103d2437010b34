"""Writes need ``Authorization: Bearer <token>``; reads stay open unless a read token is
given (``--read-token-file``: then reads need it, or the write token).

Where the token comes from:

* ``--token-file FILE``: read once at start (a missing, unreadable or empty file exits 2
  naming ``--token-file``);
* nothing given: a random token is made at start and written to ``<state>.token`` beside
  the store, readable by its owner only (0600), as Jupyter writes its own; the server's
  start line names the file. It is made again at each start and removed at a clean stop;
* ``--no-token``: writes need no token, allowed only on a loopback address.

The token is compared in constant time.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import secrets
import stat
from pathlib import Path

from apportion.config import read_text
from apportion.errors import InputError

#: bytes of randomness in a generated token (256 bits, URL-safe base64)
TOKEN_BYTES = 32


def read_token(path: Path, flag: str = "--token-file") -> str:
    """The token in ``path``: its text without surrounding white space (a trailing newline,
    as ``echo`` and Kubernetes Secrets leave one); problems name ``flag``."""
    field = flag.lstrip("-").replace("-", "_")
    try:
        token = read_text(path, "token").strip()
    except InputError as exc:
        raise InputError(flag, field, f"{path}: {exc.message}") from None
    except OSError as exc:
        raise InputError(flag, field, f"{path}: {exc.strerror or exc}") from None
    if not token:
        raise InputError(flag, field, f"{path} is empty: put the token in it")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise InputError(flag, field, f"{path}: the token must be one word of printable "
                         "characters")
    return token


def generated_token_path(state: Path) -> Path:
    """Where a generated token is written: ``<state>.token``, beside the store's lock."""
    return Path(str(state) + ".token")


def write_generated_token(state: Path) -> tuple[str, Path]:
    """A new random token, written to :func:`generated_token_path` (mode 0600).

    The file is written under a temporary name created exclusively and never through a
    link, then renamed over the old one: a reader sees a whole token or none, and a
    symbolic link planted as ``<state>.token`` is replaced, never written through.
    Failures are :class:`InputError` naming ``--state`` (its folder is where it goes)."""
    path = generated_token_path(state).absolute()
    token = secrets.token_urlsafe(TOKEN_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, (token + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        why = exc.strerror or str(exc)
        if exc.errno == errno.EISDIR:
            why = "is a directory"
        raise InputError(str(path), "--state", f"cannot write the generated API token: {why} "
                         "(give --token-file, or --no-token on loopback)") from None
    return token, path


def remove_generated_token(path: Path, token: str) -> None:
    """Remove ``path`` if it still holds ``token`` (a later server may have replaced it)."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and path.read_text().strip() == token:
            path.unlink()


def authorized(expected: str | None, header: str | None) -> bool:
    """True when no token is configured, or ``header`` is ``Bearer <expected>``."""
    if expected is None:
        return True
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                               expected.encode())
