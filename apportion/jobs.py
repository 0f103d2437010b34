"""Jobs: what users submit, plus the little runtime state a round needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from apportion.plans import Cell


@dataclass(frozen=True)
class RunningState:
    """Where a running job is now: its cell and placement."""

    gpu_type: str
    gpus: int
    stages: int
    placement: dict[str, int] = field(default_factory=dict)
    tp: int = 1

    @property
    def cell_key(self) -> tuple[str, int, int]:
        return (self.gpu_type, self.gpus, self.stages)


@dataclass(frozen=True)
class JobSpec:
    """A training job. ``model`` is a catalog name; the global batch never changes."""

    id: str
    model: str
    global_batch_size: int
    iterations: int
    requested_gpus: int
    requested_gpu_type: str | None = None
    submit_time_s: float = 0.0
    tenant: str = "default"
    guaranteed: bool = False
    deadline_s: float | None = None
    backbone: str | None = None
    task: str | None = None
    accepts_sharing: bool = False
    iterations_done: int = 0
    running: RunningState | None = None
    admitted: bool = False  # a deadline job admitted earlier keeps its guarantee

    @property
    def remaining_iterations(self) -> int:
        return max(0, self.iterations - self.iterations_done)

    def wait_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.submit_time_s) if self.running is None else 0.0

    def is_current(self, cell: Cell) -> bool:
        return self.running is not None and self.running.cell_key == cell.key
