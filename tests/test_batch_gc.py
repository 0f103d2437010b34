"""The command line's collector settings: its imports with the collector off and frozen
after, thresholds for batch work while a command runs, a one-off round with the collector
off, and what is alive frozen when a command ends (so the interpreter's shutdown does not
collect it all again), whatever the command raised."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from apportion.batch_gc import GC_THRESHOLDS, collector_paused
from apportion.cli.app import main


@pytest.mark.parametrize("argv", [["--version"], ["no-such-command"]])
def test_main_sets_batch_thresholds_and_freezes_at_the_end(monkeypatch: pytest.MonkeyPatch,
                                                           argv: list[str]) -> None:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    monkeypatch.setattr(sys, "argv", ["apportion", *argv])
    try:
        with pytest.raises(SystemExit):
            main()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_restores_the_collector_and_freezes_when_asked(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.unfreeze()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled and gc.get_freeze_count() == 0
        with pytest.raises(KeyError), collector_paused(freeze_after=True):
            raise KeyError("the block failed")
        assert gc.isenabled() == enabled and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


def test_the_command_lines_imports_run_without_collections() -> None:
    """A fresh interpreter importing the command line collects at most once (before the
    pause: the package's first lines), where the default thresholds collect about a hundred
    times, and leaves the collector on with the imports' objects frozen."""
    code = ("import gc; seen = []; gc.callbacks.append(lambda p, i: seen.append(p)); "
            "import apportion.cli; "
            "print(seen.count('start'), gc.isenabled(), gc.get_freeze_count() > 10000)")
    count, enabled, frozen = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                            text=True, check=True).stdout.split()
    assert int(count) <= 1 and enabled == "True" and frozen == "True"


def test_a_commands_module_loads_without_collections() -> None:
    """The command line imports a command's module when the command runs
    (apportion.cli.commands): that import runs with the collector off too, and what it made
    is frozen after."""
    code = ("import gc, apportion.cli; from apportion.cli.commands import entry, function; "
            "before = gc.get_freeze_count(); seen = []; "
            "gc.callbacks.append(lambda p, i: seen.append(p)); "
            "function(entry('solve-round')); "
            "print(seen.count('start'), gc.isenabled(), gc.get_freeze_count() > before + 10000)")
    count, enabled, frozen = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                            text=True, check=True).stdout.split()
    assert int(count) == 0 and enabled == "True" and frozen == "True"
