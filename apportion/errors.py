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
        super().__init__(f"{source}: {field}: {message}")


class CatalogError(KeyError):
    """An unknown catalog name (GPU type or model)."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])
