"""Shared fixtures: small clusters and job lists built from the real catalogs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Ray started by tests writes nothing to the home directory and asks for no token
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def shared_data() -> Path:
    """The real data (``$APPORTION_DATA`` or ``../shared/data`` beside the repository), found
    the way the harness finds it; tests that need it are skipped like every other data test
    when a clone has none beside it."""
    from apportion.experiments.traces import data_root

    root = data_root()
    if not root.exists():
        pytest.skip(f"shared data not present at {root}")
    return root
