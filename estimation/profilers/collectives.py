"""Collective microbenchmark over torch.distributed, producing the communication tables.

All-reduce, all-gather, reduce-scatter and send/recv at sizes from 1 KB up to
``max_bytes`` (256 MB by default; tests use a few hundred KB), with ``ranks``
processes on this machine (gloo here; nccl on CUDA machines). Each point is
the median over ``repeats`` timed runs after a warm-up, timed on rank 0
between barriers, so the figure is the collective's wall time as the
estimators use it. The result is a
:class:`~apportion.estimation.models.tables.CommTables` under the link name given
(``loopback`` for processes on one host), saved as JSON.

Where gloo lacks reduce-scatter, it is measured as what the framework would
run instead (an all-reduce followed by taking the local shard) and the table
says so in its metadata.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from apportion.estimation.models.tables import COLLECTIVES, CommTables

log = logging.getLogger(__name__)

KB = 1024
MB = 1024 * 1024


def sizes_between(min_bytes: int = KB, max_bytes: int = 256 * MB, factor: int = 4) -> list[int]:
    """Geometric sizes ``min_bytes, min_bytes*factor, ...`` up to and including ``max_bytes``."""
    if min_bytes <= 0 or max_bytes < min_bytes or factor < 2:
        raise ValueError("need 0 < min_bytes <= max_bytes and factor >= 2")
    out, s = [], min_bytes
    while s < max_bytes:
        out.append(s)
        s *= factor
    out.append(max_bytes)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, backend: str, sizes: Sequence[int],
            collectives: Sequence[str], repeats: int, out_path: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    results: dict[str, list[list[float]]] = {c: [] for c in collectives}
    notes: dict[str, str] = {}

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)  # float32 elements, divisible by world
        buf = torch.ones(n, dtype=torch.float32, device=device)
        shard = torch.empty(n // world, dtype=torch.float32, device=device)
        for coll in collectives:
            def run() -> None:
                if coll == "all_reduce":
                    dist.all_reduce(buf)
                elif coll == "all_gather":
                    gather = getattr(dist, "all_gather_single", None) or \
                        dist.all_gather_into_tensor
                    gather(buf, buf[: n // world].clone())
                elif coll == "reduce_scatter":
                    try:
                        scatter = getattr(dist, "reduce_scatter_single", None) or \
                            dist.reduce_scatter_tensor
                        scatter(shard, buf)
                    except (RuntimeError, NotImplementedError, ValueError):
                        notes["reduce_scatter"] = "all_reduce + local shard (no gloo reduce-scatter)"
                        dist.all_reduce(buf)
                        shard.copy_(buf[: n // world])
                elif coll == "send_recv":
                    if rank == 0:
                        dist.send(buf, 1)
                    elif rank == 1:
                        dist.recv(buf, 0)
            times = []
            for it in range(repeats + 1):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                run()
                sync()
                if coll == "send_recv":
                    dist.barrier()  # receiver done
                dt = time.perf_counter() - t0
                if it > 0:
                    times.append(dt)
            if rank == 0:
                results[coll].append([float(n * 4), statistics.median(times)])
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"results": results, "notes": notes}, fh)
    dist.barrier()
    dist.destroy_process_group()


def measure(ranks: Sequence[int] = (2, 4), max_bytes: int = 256 * MB, min_bytes: int = KB,
            factor: int = 4, repeats: int = 5, backend: str | None = None,
            collectives: Sequence[str] = COLLECTIVES, link: str | None = None,
            tables: CommTables | None = None) -> CommTables:
    """Run the microbenchmark for each world size in ``ranks``; return (and extend) the tables."""
    import torch
    import torch.multiprocessing as mp

    backend = backend or ("nccl" if torch.cuda.is_available() and
                          torch.cuda.device_count() >= max(ranks) else "gloo")
    link = link or ("nvlink" if backend == "nccl" else "loopback")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ValueError(f"unknown collective {c!r}")
    out = tables or CommTables()
    sizes = sizes_between(min_bytes, max_bytes, factor)
    meta: dict[str, Any] = dict(out.meta)
    meta.update({"backend": backend, "link": link, "repeats": repeats, "sizes": sizes,
                 "torch": torch.__version__, "host": socket.gethostname()})
    for world in ranks:
        if world < 2:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "result.json")
            t0 = time.perf_counter()
            mp.start_processes(_worker, args=(world, _free_port(), backend, sizes,
                                              list(collectives), repeats, path),
                               nprocs=world, join=True, start_method="spawn")
            import json

            data = json.loads(Path(path).read_text())
            log.info("collectives over %d ranks measured in %.1fs", world,
                     time.perf_counter() - t0)
        for coll, pts in data["results"].items():
            if pts:
                out.add(coll, link, 2 if coll == "send_recv" else world,
                        [(x, max(y, 1e-9)) for x, y in pts])
        for k, v in data["notes"].items():
            meta[f"note:{k}"] = v
    out.meta = meta
    return out
