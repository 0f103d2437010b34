"""The one way a conformance check fails: an :class:`AssertionError` naming what failed.

A check's conditions are never bare ``assert`` statements (``python -O`` strips them, and
a check would then pass whatever it checked), and whatever the checked code raises (a
policy's :class:`~apportion.validator.InvalidDecision`, a loader's error, a crash) becomes
that same failure, the exception chained so its traceback stays: a plug-in's author, and
the project's own conformance suites, catch one type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def expect(ok: Any, what: str) -> None:
    """Fail with ``what`` unless ``ok`` (kept under ``python -O``)."""
    if not ok:
        raise AssertionError(what)


def subject(thing: Any) -> str:
    """How a failure names what it checked: a name as given, an object by its ``name`` (a
    plug-in's object may have none: then by its class)."""
    if isinstance(thing, str):
        return thing
    return str(getattr(thing, "name", None) or type(thing).__name__)


def check(fn: Callable[P, R]) -> Callable[P, R]:
    """A conformance check: whatever the checked code raises other than the check's own
    :class:`AssertionError` is reported as one, naming the check and what it checked."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except AssertionError:
            raise
        except Exception as exc:
            what = subject(args[0]) if args else ""
            raise AssertionError(f"{fn.__name__}({what}): {type(exc).__name__}: {exc}") \
                from exc

    return run


__all__ = ["check", "expect", "subject"]
