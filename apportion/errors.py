"""Errors a user can act on.

Every bad input is reported as an :class:`InputError` naming the file, the field
and what is wrong; the CLI turns it into exit code 2 and writes nothing.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user-supplied input is wrong: names the file, the field and the problem."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        # an option's error names the option once ("--seeds: must be ..."), not twice as
        # source and field ("--seeds: seeds: must be ...")
        same = field.lower() in (source.lower(), source.lstrip("-").replace("-", "_").lower())
        super().__init__(f"{source}: {message}" if same else f"{source}: {field}: {message}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        # a worker process's error reaches its parent (compare, the partitioned solve)
        return (type(self), (self.source, self.field, self.message))


class CatalogError(KeyError):
    """An unknown catalog name (GPU type or model)."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])

    def __reduce__(self) -> tuple[type, tuple[str, str, list[str]]]:
        return (type(self), (self.kind, self.name, self.known))


class HostError(RuntimeError):
    """The host refused something apportion needs (a full disk, a read-only folder, a
    permission): one line naming what and the remedy. ``exit_code`` 75 ("try again later")
    when freeing space or waiting fixes it, 2 otherwise."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (type(self), (str(self), self.exit_code))

    @classmethod
    def from_os_error(cls, exc: OSError, what: str) -> HostError:
        import errno

        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return cls(f"{what}: {reason} (the disk is full or a file-size limit applies); "
                       "free space or raise the limit, then run it again; nothing was "
                       "replaced", 75)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return cls(f"{what}: {reason}; the folder is read-only or belongs to another "
                       "user: choose a writable path or fix its permissions", 2)
        return cls(f"{what}: {reason}", 2)
