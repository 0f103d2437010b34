"""This machine's NVIDIA GPUs, for the local executor's cluster and its ranks' devices.

Read from ``nvidia-smi`` rather than torch: the scheduler process never imports torch (a
second of start-up, and the core installs without it), and a driver without CUDA tools
still answers. ``CUDA_VISIBLE_DEVICES``, when set, narrows the GPUs to those it names, as
it would for any CUDA program. A machine without a driver has none, and the local
executor's slots stay CPU worker processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from apportion.errors import CatalogError
from apportion.gpus import canonical_gpu_name


def local_gpus() -> list[tuple[str, str]]:
    """``(CUDA device id, product name)`` of each GPU this process may use ([] for none)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        r = subprocess.run([exe, "--query-gpu=index,name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    found = []
    for line in r.stdout.splitlines():
        idx, _, name = line.partition(",")
        if idx.strip().isdigit():
            found.append((idx.strip(), name.strip()))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        names = dict(found)
        found = [(v, names[v]) for v in wanted if v in names]
    return found


def catalog_type(product: str) -> str | None:
    """The catalog GPU type of an ``nvidia-smi`` product name ("NVIDIA H100 80GB HBM3" is
    the product label NVIDIA-H100-80GB-HBM3), None where the catalog has no such GPU."""
    for name in (product, product.replace(" ", "-"), product.removeprefix("NVIDIA ")):
        try:
            return canonical_gpu_name(name)
        except CatalogError:
            continue
    return None


def pick_devices(gpus: Sequence[str], busy: set[str], workers: int) -> list[str] | None:
    """The first ``workers`` GPUs not ``busy``, one per rank (None: not enough free)."""
    free = [g for g in gpus if g not in busy]
    return free[:workers] if len(free) >= workers else None
