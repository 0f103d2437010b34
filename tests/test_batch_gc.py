"""The command line's collector settings: thresholds for batch work while a command runs,
and what is alive frozen when it ends (so the interpreter's shutdown does not collect it
all again), whatever the command raised."""

from __future__ import annotations

import gc
import sys

import pytest

from apportion.batch_gc import GC_THRESHOLDS
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
