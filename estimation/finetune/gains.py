"""Task2Vec-predicted transfer gains as a scheduler uses them across rounds (``--gains auto``).

YMIR's Alg. 1 in a policy (``ymir-task2vec``, ``apportion-task2vec``): every task of a
backbone the policy has seen is embedded with the Task2Vec probe on its samples
(``<task_data>/<backbone>@<task>`` or ``<task>``, ``.npz`` or ``.csv``; ``task_data``
defaults to ``$APPORTION_TASK_DATA``, else ``<APPORTION_DATA>/titan-finetune/task-data``),
pairs are scored, and the scores map to gains calibrated on the gains measured so far
(:meth:`Task2VecGains.measured`: a transfer or a merge that ran to its end), the
calibrated default map until two are (:func:`~apportion.estimation.finetune.
transferability.auto_gains`). A task without samples gets no gains (no transfer, no
merge); a missing folder is refused by name (:class:`~apportion.errors.InputError`, exit
2). One implementation for every policy that predicts gains this way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from apportion.estimation.finetune.transferability import auto_gains

from apportion.env import data_root
from apportion.errors import InputError
from apportion.finetune_spec import SPATIAL_SEP, TEMPORAL_SEP


class Task2VecGains:
    """Per backbone: the tasks the prediction covers, its gains, and the measured gains
    that calibrate it (recomputed when a new task or a new measurement appears)."""

    def __init__(self, task_data: str | Path | None = None, who: str = "the policy") -> None:
        self.task_data = task_data
        self.who = who
        self._predicted: dict[str, tuple[frozenset[str], int, dict[str, dict[str, float]]]] = {}
        self._measured: dict[str, dict[str, dict[str, float]]] = {}
        self.reports: dict[str, dict[str, Any]] = {}  # backbone -> auto_gains' report

    def folder(self) -> Path:
        if self.task_data is not None:
            return Path(self.task_data)
        env = os.environ.get("APPORTION_TASK_DATA")
        return Path(env) if env else data_root() / "titan-finetune" / "task-data"

    def check_folder(self) -> Path:
        """The task samples' folder; a missing one is refused by name (exit 2)."""
        folder = self.folder()
        if not folder.is_dir():
            raise InputError(str(folder), "task data", f"no such folder: {self.who} predicts "
                             "transfer gains with Task2Vec from each task's samples "
                             "(<backbone>@<task>.npz or .csv, none shipped); give "
                             "APPORTION_TASK_DATA")
        return folder

    @staticmethod
    def task_file(folder: Path, backbone: str, task: str) -> Path | None:
        for stem in (f"{backbone}@{task}", task):
            for ext in (".npz", ".csv"):
                if (folder / f"{stem}{ext}").is_file():
                    return folder / f"{stem}{ext}"
        return None

    def predictions(self, backbone: str | None, tasks: frozenset[str]
                    ) -> dict[str, dict[str, float]]:
        """Task2Vec's gains among ``tasks`` of ``backbone`` (``temporal`` {"A->B": g},
        ``spatial`` {"A||B": g}), calibrated on the gains measured so far."""
        bb = backbone or ""
        stamp = sum(len(v) for v in self._measured.get(bb, {}).values())
        got = self._predicted.get(bb)
        if got is not None and got[0] == tasks and got[1] == stamp:
            return got[2]
        folder = self.check_folder()
        files = {t: self.task_file(folder, bb, t) for t in sorted(tasks)}
        pred: dict[str, dict[str, float]] = {"temporal": {}, "spatial": {}}
        if sum(f is not None for f in files.values()) >= 2:
            auto = auto_gains([(t, f, f"task {t}") for t, f in files.items()],
                              self._measured.get(bb))
            pred = {"temporal": auto.temporal, "spatial": auto.spatial}
            self.reports[bb] = auto.report()
        self._predicted[bb] = (tasks, stamp, pred)
        return pred

    def temporal(self, backbone: str | None, src_task: str | None, dst_task: str | None,
                 tasks: frozenset[str]) -> float | None:
        """The predicted gain of a ``dst_task`` job started from a finished ``src_task``
        job's weights (None: no prediction, so no transfer)."""
        return self.predictions(backbone, tasks)["temporal"].get(
            f"{src_task}{TEMPORAL_SEP}{dst_task}")

    def spatial(self, backbone: str | None, a: str | None, b: str | None,
                tasks: frozenset[str]) -> float | None:
        """The predicted gain of ``a`` and ``b`` merged (either order; None: no merge)."""
        pred = self.predictions(backbone, tasks)["spatial"]
        return pred.get(f"{a}{SPATIAL_SEP}{b}", pred.get(f"{b}{SPATIAL_SEP}{a}"))

    def measured(self, backbone: str, kind: str, pair: str, gain: float) -> None:
        """A mode that ran to its end: its gain as the rate source measured the run."""
        self._measured.setdefault(backbone, {"temporal": {}, "spatial": {}})[kind][pair] = \
            round(gain, 6)
