"""``--token-file``: writes need ``Authorization: Bearer <token>``, reads stay open.

The token is read once at start (a missing, unreadable or empty file exits 2 naming
``--token-file``); it is compared in constant time.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from apportion.config import read_text
from apportion.errors import InputError


def read_token(path: Path) -> str:
    """The token in ``path``: its text without surrounding white space (a trailing newline,
    as ``echo`` and Kubernetes Secrets leave one)."""
    try:
        token = read_text(path, "token").strip()
    except InputError as exc:
        raise InputError("--token-file", "token_file", f"{path}: {exc.message}") from None
    except OSError as exc:
        raise InputError("--token-file", "token_file",
                         f"{path}: {exc.strerror or exc}") from None
    if not token:
        raise InputError("--token-file", "token_file", f"{path} is empty: put the token in it")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise InputError("--token-file", "token_file", f"{path}: the token must be one word "
                         "of printable characters")
    return token


def authorized(expected: str | None, header: str | None) -> bool:
    """True when no token is configured, or ``header`` is ``Bearer <expected>``."""
    if expected is None:
        return True
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                               expected.encode())
