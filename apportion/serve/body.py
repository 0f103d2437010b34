"""A ``POST /api/v1/jobs`` body as jobs: the ``submit`` jobs-YAML format, as YAML or JSON.

Every problem is an :class:`~apportion.errors.InputError` naming the field (the route
answers 422 with it), raised before the store is opened: a bad body writes nothing. JSON
is read strictly (a duplicate key or ``NaN`` is refused, as the YAML reader refuses a
duplicate key), so both spellings of a document mean one thing.
"""

from __future__ import annotations

import json
from typing import Any

from apportion.config import MAX_FILE_BYTES, parse_yaml_text
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.submission import jobs_to_submit

SOURCE = "request body"
JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml",
              "text/plain", "")
MAX_BODY_BYTES = MAX_FILE_BYTES


class UnsupportedMediaType(ValueError):
    """A body in neither YAML nor JSON (HTTP 415)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InputError(SOURCE, "(body)", f"malformed JSON: duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise InputError(SOURCE, "(body)", f"malformed JSON: {name} is not a number JSON allows")


def parse_body(raw: bytes, content_type: str) -> Any:
    """The document in ``raw``: JSON for ``application/json``, YAML for the YAML types
    (and for a body with no content type, as ``curl --data-binary @jobs.yaml`` sends)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind not in JSON_TYPES and kind not in YAML_TYPES:
        raise UnsupportedMediaType(f"content type {kind!r}: send application/json or "
                                   "application/yaml")
    if len(raw) > MAX_BODY_BYTES:
        raise InputError(SOURCE, "(body)", f"bodies are limited to {MAX_BODY_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(SOURCE, "(body)", f"not UTF-8 text: {exc.reason}") from None
    if kind in JSON_TYPES:
        try:
            return json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise InputError(SOURCE, f"line {exc.lineno}, column {exc.colno}",
                             f"malformed JSON: {exc.msg}") from None
        except RecursionError:
            raise InputError(SOURCE, "(body)", "malformed JSON: nesting too deep") from None
    return parse_yaml_text(text, SOURCE)


def jobs_from_body(raw: bytes, content_type: str, now: float) -> list[JobSpec]:
    """The validated jobs of a body, stamped as ``apportion submit`` stamps them."""
    data = parse_body(raw, content_type)
    if data is None:
        raise InputError(SOURCE, "(top level)", "empty body: expected a mapping with 'jobs'")
    return jobs_to_submit(data, SOURCE, now)
