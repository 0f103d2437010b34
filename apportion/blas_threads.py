"""One BLAS thread for the scheduler's own arithmetic.

A round's vectors are its model's columns: tens of thousands of floats at most. OpenBLAS
(bundled with numpy) splits a dot product that long over its threads, and the threads then
spin, waiting for more work, on the cores the solver and the simulator need. Measured on
the project's 2-core machine: a deterministic replay of Philly's densest day took 64.9 CPU-s
with numpy's default threads and 49.5 CPU-s with one, the schedule identical to the last
digit (``experiments/results/bench/speed.md``).

The limit is set through threadpoolctl on the libraries loaded in this process and restored
when the block ends. It never goes through the environment (``OPENBLAS_NUM_THREADS``),
which the training workers that ``apportion run`` starts would inherit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy  # noqa: F401 - loads numpy's OpenBLAS before the controller looks for it
from threadpoolctl import ThreadpoolController

__all__ = ["one_blas_thread"]

_controller: Any = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with one thread in every BLAS library loaded when first called."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    with _controller.limit(limits=1, user_api="blas"):
        yield
