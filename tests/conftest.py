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


@pytest.fixture(autouse=True, scope="session")
def _private_profile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never read or write the user's profile cache: fits made by one test (an
    estimator built by the registry caches its fitted parameters there) must not reach the
    user's next round, nor the user's cache reach a test."""
    os.environ["APPORTION_CACHE"] = str(tmp_path_factory.mktemp("apportion-cache"))


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


def stop_processes_mentioning(marker: str | Path, grace_s: float = 2.0) -> list[int]:
    """Stop exactly the processes whose command line names ``marker`` (a private temp dir).

    Tests start Ray clusters with their own temp folder; ``ray stop`` would stop every
    Ray on the host — another test's in-process Ray (whose driver then aborts the whole
    test process when its GCS disappears) or another user's cluster.
    """
    import contextlib
    import signal
    import time

    needle = str(marker).encode()
    mine = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "cmdline").read_bytes():
                mine.append(int(d.name))
        except OSError:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if mine:
            time.sleep(grace_s)
    return mine


# -- the test process's own exit ----------------------------------------------------------
# Once every result is reported, the pytest process leaves without the interpreter's
# teardown. That teardown destroys what in-process Ray drivers, JAX and torch left running
# (threads inside C extensions), and it segfaulted once in three full runs after 1,448
# passed tests (exit 139, nothing reported as failed), which would turn a green run red at
# random. The exit status is pytest's own; APPORTION_TEST_TEARDOWN=1 keeps the teardown (to
# look for such crashes with PYTHONFAULTHANDLER=1).
_SESSION: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _SESSION["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    status = _SESSION.get("status")
    if status is None or os.environ.get("APPORTION_TEST_TEARDOWN") == "1":
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
