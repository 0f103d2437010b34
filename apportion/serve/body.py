"""A ``POST /api/v1/jobs`` body as jobs: the ``submit`` jobs-YAML format, as YAML or JSON.

Every problem is an :class:`~apportion.errors.InputError` naming the field (the route
answers 422 with it), raised before the store is opened: a bad body writes nothing. JSON
is read strictly (a duplicate key or ``NaN`` is refused, as the YAML reader refuses a
duplicate key), so both spellings of a document mean one thing.

**Only content types a browser must ask about first.** A web page may send a
cross-site ``POST`` without a CORS preflight only with a *CORS-safelisted* content type
(``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``) or
with none; such a "simple" request reaches the server before the browser checks
anything. Those are refused (415), so every body this route reads came with
``application/json`` or a YAML type, which a browser sends cross-site only after a
preflight (``OPTIONS``) that this server never grants: a page on another site cannot
submit jobs, whatever the token setting.

**A budget per body** (:data:`BODY_LIMITS`): nodes, nesting, entries of one list and
the length of a number are measured before the document is built
(:mod:`apportion.input_limits`), so a small text that would take seconds to parse and
validate is refused in microseconds per node, naming the place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from apportion.config import MAX_FILE_BYTES, parse_yaml_text
from apportion.errors import InputError
from apportion.input_limits import TreeLimits, check_data_limits, check_yaml_limits, json_number
from apportion.jobs import JobSpec
from apportion.submission import jobs_to_submit

SOURCE = "request body"
JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
#: what a browser sends cross-site without a preflight (the Fetch standard's CORS-safelisted
#: request content types), and no content type at all: refused, see the module docstring
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "")
MAX_BODY_BYTES = MAX_FILE_BYTES
#: jobs one request may submit (a 4 MB body holds about 20,000 plain jobs)
MAX_BODY_JOBS = 20_000
#: the budget of one body: 20 nodes a job on average at the most jobs; a jobs document
#: nests 5 levels (document, jobs, a job, running, placement)
BODY_LIMITS = TreeLimits(max_nodes=MAX_BODY_JOBS * 20, max_depth=16, max_items=MAX_BODY_JOBS,
                         what="a request body",
                         advice="submit the jobs in several requests")


class UnsupportedMediaType(ValueError):
    """A body in neither YAML nor JSON, or in a type a browser sends cross-site without
    asking (HTTP 415)."""


@dataclass(frozen=True)
class Submission:
    """The validated jobs of a body, and which of them gave their own ``submit_time_s``
    (the others are stamped with the time of the request)."""

    jobs: list[JobSpec]
    timed: frozenset[int]


def media_type(content_type: str) -> str:
    """``application/yaml`` of ``application/yaml; charset=utf-8``."""
    return content_type.split(";")[0].strip().lower()


def check_media_type(content_type: str | None) -> str:
    """The body's media type, or :class:`UnsupportedMediaType` saying what to send."""
    kind = media_type(content_type or "")
    if kind in JSON_TYPES or kind in YAML_TYPES:
        return kind
    if kind in SIMPLE_TYPES:
        what = f"content type {kind!r}" if kind else "a body without a content type"
        raise UnsupportedMediaType(
            f"{what} is refused: a web page can send it from another site without asking "
            "the browser first; send Content-Type: application/yaml or application/json")
    raise UnsupportedMediaType(f"content type {kind!r}: send application/json or "
                               "application/yaml")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InputError(SOURCE, "(body)", f"malformed JSON: duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise InputError(SOURCE, "(body)", f"malformed JSON: {name} is not a number JSON allows")


_PARSE_INT, _PARSE_FLOAT = json_number(BODY_LIMITS.max_number_chars)


def parse_body(raw: bytes, content_type: str) -> Any:
    """The document in ``raw``: JSON for ``application/json``, YAML for the YAML types,
    measured against :data:`BODY_LIMITS` before it is built."""
    kind = check_media_type(content_type)
    if len(raw) > MAX_BODY_BYTES:
        raise InputError(SOURCE, "(body)", f"bodies are limited to {MAX_BODY_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(SOURCE, "(body)", f"not UTF-8 text: {exc.reason}") from None
    if kind in JSON_TYPES:
        try:
            data = json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant,
                              parse_int=_PARSE_INT, parse_float=_PARSE_FLOAT)
        except json.JSONDecodeError as exc:
            raise InputError(SOURCE, f"line {exc.lineno}, column {exc.colno}",
                             f"malformed JSON: {exc.msg}") from None
        except RecursionError:
            raise InputError(SOURCE, "(body)", "malformed JSON: nesting too deep") from None
        check_data_limits(data, SOURCE, BODY_LIMITS)
        return data
    check_yaml_limits(text, SOURCE, BODY_LIMITS)
    return parse_yaml_text(text, SOURCE)


def submission_from_body(raw: bytes, content_type: str, now: float) -> Submission:
    """The validated jobs of a body, stamped as ``apportion submit`` stamps them."""
    data = parse_body(raw, content_type)
    if data is None:
        raise InputError(SOURCE, "(top level)", "empty body: expected a mapping with 'jobs'")
    jobs = jobs_to_submit(data, SOURCE, now)
    entries = data.get("jobs", []) if isinstance(data, dict) else []
    timed = frozenset(i for i, e in enumerate(entries)
                      if isinstance(e, dict) and "submit_time_s" in e)
    return Submission(jobs, timed)


def jobs_from_body(raw: bytes, content_type: str, now: float) -> list[JobSpec]:
    """The validated jobs of a body (:func:`submission_from_body`'s jobs)."""
    return submission_from_body(raw, content_type, now).jobs
