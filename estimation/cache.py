"""On-disk cache of profiles and estimates, keyed by model, device type and plan.

Profiling costs seconds to minutes per stage; a scheduler asks for the same
(model, device, plan) again and again, across rounds and processes. Entries
are JSON files named by the SHA-256 of the canonical JSON of the key, grouped
in one folder per kind, written atomically (temporary file, then rename) so a
crashed writer never leaves half an entry. The key itself is stored next to
the value and compared on read, so a hash collision can never return a wrong
entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$APPORTION_CACHE`` or the user's cache folder (:func:`apportion.env.cache_dir`)."""
    from apportion.env import cache_dir

    return cache_dir()


def cache_key(model: str, device: str, plan: Mapping[str, Any] | str, **extra: Any
              ) -> dict[str, Any]:
    """The canonical key: model, device type, plan (a dict or a label) and extras."""
    return {"model": model, "device": device,
            "plan": dict(plan) if isinstance(plan, Mapping) else str(plan), **extra}


class DiskCache:
    """JSON values under ``root/<kind>/<sha256>.json``."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    @staticmethod
    def _digest(key: Mapping[str, Any]) -> str:
        text = json.dumps(key, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def path(self, kind: str, key: Mapping[str, Any]) -> Path:
        return self.root / kind / f"{self._digest(key)}.json"

    def get(self, kind: str, key: Mapping[str, Any]) -> Any | None:
        p = self.path(kind, key)
        try:
            if not p.exists():
                return None
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            log.warning("unreadable cache entry %s; ignoring it", p)
            return None
        want = json.loads(json.dumps(key, sort_keys=True, default=str))
        if data.get("key") != want:
            return None
        return data.get("value")

    def has(self, kind: str, **fields: Any) -> bool:
        """Whether any entry of ``kind`` has a key with these field values (a scan: caches
        of profiles are small)."""
        folder = self.root / kind
        try:
            entries = list(folder.glob("*.json"))
        except OSError:
            return False
        for p in entries:
            try:
                key = json.loads(p.read_text()).get("key", {})
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(key, dict) and all(key.get(k) == v for k, v in fields.items()):
                return True
        return False

    def put(self, kind: str, key: Mapping[str, Any], value: Any) -> Path:
        """Store an entry; a cache that cannot be written (read-only, full, no permission)
        is a warning, once per cache, and the value is simply not cached."""
        p = self.path(kind, key)
        payload = {"key": json.loads(json.dumps(key, sort_keys=True, default=str)),
                   "value": value}
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=p.parent)
        except OSError as exc:
            self._unwritable(exc)
            return p
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(payload, fh, default=str)
            os.replace(tmp, p)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            self._unwritable(exc)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p

    def _unwritable(self, exc: OSError) -> None:
        if not getattr(self, "_warned", False):
            self._warned = True
            log.warning("profile cache %s is not writable (%s); continuing without caching "
                        "(set APPORTION_CACHE to a writable folder)", self.root,
                        exc.strerror or exc)
