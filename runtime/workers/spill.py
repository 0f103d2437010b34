"""Hydra-style spilled training: models larger than a device, trained shard by shard.

Every shard's parameters and optimizer state live in host memory (the
coordinator). A *unit* promotes one shard to a device, runs its forward or
backward pass on one mini-batch, and returns the shard; the activations going
forward and the gradients going back are carried on the host between units.
Units of several models are dispatched to several devices either dynamically
by Sharded-LRTF (longest remaining time first, using the pilot-run runtimes) or
in a solver's fixed per-device order.

Why the backward unit recomputes the forward: a unit must leave nothing on the
device, and an autograd graph cannot outlive its device or cross processes, so
the forward unit runs without autograd and stores only its input; the backward
unit re-runs the shard's forward with autograd from that input, back-propagates
the carried gradient and steps the shard's own optimizer. Element-wise
optimizers (SGD, Adam) stepped per shard equal one whole-model step, so the
loss trajectory equals whole-model training (the core test).

A parameter shared by layers of different shards (a language model's output
layer tied to its embedding) is one parameter, not one per shard: the first
shard holding it owns it (its optimizer state and its step). A later shard's
backward unit computes the parameter's gradient but does not step it and hands
the gradient back; the owner's backward unit, which runs after it, adds it to
its own before stepping, and the stepped value is copied to every shard that
uses it. That is the whole model's gradient (the sum of both uses) and its one
step. Modules whose
forward updates buffers (BatchNorm running statistics) would see two updates;
dropout is replayed with the forward unit's RNG state.

Devices are worker processes on CPU (``workers=N``) or, in-process
(``workers=0``), the torch devices listed in ``devices`` (CUDA when present).
torch is imported lazily so the package imports without the torch extra.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from apportion.formulations.shards import Placement
from apportion.runtime.workers.pilot import OptimSpec

log = logging.getLogger(__name__)


@dataclass
class SpillJob:
    """One model to train: its layers, shard boundaries, loss, data and optimizer."""

    name: str
    layers: list[Any]  # torch.nn.Module per layer
    boundaries: list[int]  # first layer of each shard (Partition.boundaries)
    loss_fn: Any  # picklable torch loss module
    batches: list[tuple[Any, Any]]  # (x, y) per mini-batch of an epoch
    epochs: int = 1
    optim: OptimSpec = field(default_factory=OptimSpec)
    unit_runtimes: list[float] | None = None  # per unit of one mini-batch, for LRTF

    @property
    def num_shards(self) -> int:
        return len(self.boundaries)

    def shard_modules(self) -> list[Any]:
        import torch

        ends = self.boundaries[1:] + [len(self.layers)]
        return [torch.nn.Sequential(*self.layers[a:b]) for a, b in zip(self.boundaries, ends)]

    @property
    def num_units(self) -> int:
        return 2 * self.num_shards * len(self.batches) * self.epochs

    def unit(self, u: int) -> tuple[int, int, str]:
        """(mini-batch index, shard, 'fwd'|'bwd') of the job's u-th unit."""
        per = 2 * self.num_shards
        step, k = divmod(u, per)
        if k < self.num_shards:
            return step, k, "fwd"
        return step, per - 1 - k, "bwd"


@dataclass(frozen=True)
class Tie:
    """One parameter several shards use: ``owner`` (shard, name) steps it, ``users`` read it."""

    owner: tuple[int, str]
    users: tuple[tuple[int, str], ...]


def shared_parameters(shards: Sequence[Any]) -> list[Tie]:
    """The parameters held by more than one shard (by identity), each owned by the first
    shard holding it: the last of them to run its backward unit, so it steps once, after
    every use has added its gradient. A parameter shared inside one shard is one
    parameter of that shard already."""
    seen: dict[int, list[tuple[int, str]]] = {}
    for k, module in enumerate(shards):
        for name, p in module.named_parameters():
            if p.requires_grad:
                seen.setdefault(id(p), []).append((k, name))
    return [Tie(uses[0], tuple(uses[1:])) for uses in seen.values() if len(uses) > 1]


def promote(module: Any, state: dict[str, Any]) -> None:
    """Copy a shard's host state into its device buffer.

    On CUDA the copy runs on a side stream with non-blocking transfers and is
    waited for before returning, so a thread can promote the next shard while the
    current one computes (double buffering); on CPU it is a plain copy.
    """
    import torch

    params = module.state_dict()
    dev = next(iter(params.values())).device if params else torch.device("cpu")
    if dev.type == "cuda":
        stream = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(stream):
            for name, t in params.items():
                t.copy_(state[name], non_blocking=True)
        stream.synchronize()
    else:
        module.load_state_dict(state)


def optimized_names(module: Any, hold: Sequence[str] = ()) -> list[str]:
    """The names of the parameters a shard's own optimizer steps, in its order: every
    trainable parameter but those ``hold`` names (tied parameters another shard owns).
    Checkpoints map the optimizer's indices back to names through this."""
    return [n for n, p in module.named_parameters() if p.requires_grad and n not in hold]


def run_unit(module: Any, state: dict[str, Any], opt_state: dict[str, Any] | None, kind: str,
             optim: OptimSpec, loss_fn: Any, x: Any, y: Any, grad: Any, first: bool, last: bool,
             rng: Any, device: str, promoted: bool = False, hold: Sequence[str] = (),
             add_grads: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute one unit on ``device`` with ``module`` as the device-side buffer: load the
    host state into it (promotion, unless a double buffer already did), compute, and return
    host copies of what changed.

    ``hold``: parameters this shard uses but another shard owns (tied): their gradients
    are returned (``"held"``), not stepped. ``add_grads``: gradients of this shard's own
    parameters computed by later shards, added before the step. The optimizer's
    hyper-parameters are always ``optim``'s (a schedule may change the learning rate
    between steps); only its state (moments, step count) is carried in ``opt_state``."""
    import torch

    dev = torch.device(device)
    if not promoted:
        promote(module, state)
    module.train()
    xin = x.to(dev, non_blocking=True)
    if kind == "fwd":
        rng_state = torch.get_rng_state()
        with torch.no_grad():
            out = module(xin)
            if last:
                return {"loss": float(loss_fn(out, y.to(dev))), "rng": rng_state}
        return {"out": out.to("cpu"), "rng": rng_state}
    named = dict(module.named_parameters())
    for p in named.values():
        p.grad = None
    inp = xin.detach().requires_grad_(not first and xin.is_floating_point())
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng)
        out = module(inp)
    if last:
        loss_fn(out, y.to(dev)).backward()
    else:
        out.backward(grad.to(dev))
    for name, g in (add_grads or {}).items():  # a tied parameter's other uses
        p = named[name]
        p.grad = g.to(dev) if p.grad is None else p.grad + g.to(dev)
    opt = optim.make([named[n] for n in optimized_names(module, hold)])
    if opt is not None:
        if opt_state is not None:
            opt.load_state_dict(opt_state)
            for group in opt.param_groups:
                group.update(opt.defaults)  # the spec's hyper-parameters, not the saved ones
        opt.step()
    pin = dev.type == "cuda"
    back = {"state": {k: _to_cpu(v, pin) for k, v in module.state_dict().items()},
            "opt": _to_cpu(opt.state_dict(), pin) if opt is not None else None}
    if hold:
        back["held"] = {n: _to_cpu(named[n].grad, pin) for n in hold}
    if not first:
        back["grad"] = _to_cpu(inp.grad, pin)
    if pin:  # the copies above did not block: they are read once this returns
        torch.cuda.current_stream(dev).synchronize()
    return back


def _empty_like(template: Any, device: str) -> Any:
    """A device copy of a shard's module with storage allocated, not filled: promotion
    writes every state-dict entry; only non-persistent buffers (which promotion does not
    carry) are copied from the template."""
    import torch

    module = _meta_copy(template).to_empty(device=torch.device(device))
    persistent = set(template.state_dict())
    src = dict(template.named_buffers())
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name not in persistent:
                buf.copy_(src[name])
    return module


def _meta_copy(template: Any) -> Any:
    """The module's structure without its data (a deep copy made on the meta device)."""
    import torch

    memo: dict[int, Any] = {id(b): torch.empty_like(b, device="meta") for b in template.buffers()}
    for prm in template.parameters():
        memo[id(prm)] = torch.nn.Parameter(torch.empty_like(prm, device="meta"),
                                           requires_grad=prm.requires_grad)
    return copy.deepcopy(template, memo)


def _to_cpu(obj: Any, pin: bool = False) -> Any:
    """Host copies of the tensors in ``obj``. With ``pin`` a CUDA tensor lands in pinned
    memory, copied without blocking (the caller synchronises before reading it): the next
    promotion of that state copies from pinned memory, which pageable memory made the
    spilled run's bottleneck (20 s against 0.1 s whole on an H200). Freed
    pinned blocks are reused by torch's caching host allocator."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if pin and t.is_cuda:
            out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            return out.copy_(t, non_blocking=True)
        return t.to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v, pin) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v, pin) for v in obj]
    return obj


def _worker(rank: int, templates: list[list[Any]], tasks: Any, results: Any, threads: int) -> None:
    """A CPU 'device': keeps device-side shard buffers, runs the units it is sent."""
    import torch

    torch.set_num_threads(threads)
    buffers = [[copy.deepcopy(t) for t in job] for job in templates]
    while True:
        msg = tasks.get()
        if msg is None:
            return
        key, (j, k), args = msg
        try:
            results.put((rank, key, run_unit(buffers[j][k], **args)))
        except Exception as exc:  # noqa: BLE001 - report, so the coordinator does not wait forever
            results.put((rank, key, {"error": repr(exc)}))


@dataclass
class SpillReport:
    """Per-job loss per mini-batch, the units run per device, and the wall time."""

    losses: dict[str, list[float]]
    units_run: list[tuple[int, int, int]]  # (device, job, unit) in completion order
    wall_s: float


class SpillTrainer:
    """Train several :class:`SpillJob` s at once, shard by shard, on several devices."""

    def __init__(self, jobs: Sequence[SpillJob], workers: int = 2, devices: Sequence[str] = ("cpu",),
                 threads_per_worker: int = 1, double_buffer: bool = False) -> None:
        import torch

        # Double buffering (in-process devices): while a unit computes, a copier thread
        # promotes the shard of the same job's next unit into its own buffer. Only that
        # unit is prefetched, and only when its shard differs from the running one: no
        # other unit can change that shard's state before it runs, so the copy is exact.
        self.double_buffer = double_buffer and workers == 0
        self.prefetched = 0
        self._prefetch: dict[int, tuple[tuple[int, int], Any]] = {}
        self._copier = None
        if self.double_buffer:
            from concurrent.futures import ThreadPoolExecutor

            self._copier = ThreadPoolExecutor(max_workers=max(1, len(devices)))

        self.jobs = list(jobs)
        self.workers = workers
        self.devices = list(devices) if workers == 0 else ["cpu"] * workers
        self.threads = threads_per_worker
        self.templates = [j.shard_modules() for j in self.jobs]
        # Host memory: every shard's state dict and optimizer state.
        self.host = [[{k: v.detach().clone() for k, v in m.state_dict().items()} for m in mods]
                     for mods in self.templates]
        self.opt_state: list[list[dict[str, Any] | None]] = [[None] * len(m) for m in self.templates]
        self.ties = [shared_parameters(mods) for mods in self.templates]
        # in-process device buffers per device, least recently used first (see _local)
        self._buffers: dict[int, OrderedDict[tuple[int, int], Any]] = {}
        self._torch = torch

    # -- bookkeeping shared by both dispatch policies ------------------------------------------
    def _remaining(self, j: int, u: int) -> float:
        job = self.jobs[j]
        per = job.unit_runtimes or [1.0] * (2 * job.num_shards)
        left = job.num_units - u
        full, part = divmod(left, len(per))
        return full * sum(per) + sum(per[len(per) - part:])

    def held(self, j: int, k: int) -> list[str]:
        """The names in shard ``k`` of job ``j`` of tied parameters another shard owns."""
        return [name for tie in self.ties[j] for ku, name in tie.users if ku == k]

    def _args(self, j: int, u: int, carry: dict[str, Any]) -> tuple[tuple[int, int], dict[str, Any]]:
        job = self.jobs[j]
        step, k, kind = job.unit(u)
        x, y = job.batches[step % len(job.batches)]
        inp = x if k == 0 else carry["act"][k]
        args = {"state": self.host[j][k], "opt_state": self.opt_state[j][k], "kind": kind,
                "optim": job.optim, "loss_fn": job.loss_fn, "x": inp, "y": y,
                "grad": carry.get("grad"), "first": k == 0, "last": k == job.num_shards - 1,
                "rng": carry["rng"].get(k), "device": "cpu"}
        if kind == "bwd":
            args["hold"] = self.held(j, k)
            args["add_grads"] = {tie.owner[1]: carry["tied"][t] for t, tie in enumerate(self.ties[j])
                                 if tie.owner[0] == k and t in carry["tied"]}
        return (j, k), args

    def _absorb(self, j: int, u: int, res: dict[str, Any], carry: dict[str, Any],
                losses: dict[str, list[float]]) -> None:
        if "error" in res:
            raise RuntimeError(f"unit {u} of {self.jobs[j].name} failed: {res['error']}")
        job = self.jobs[j]
        _step, k, kind = job.unit(u)
        if kind == "fwd":
            carry["rng"][k] = res["rng"]
            if "loss" in res:
                losses[job.name].append(res["loss"])
            else:
                carry["act"][k + 1] = res["out"]
            return
        self.host[j][k] = res["state"]
        self.opt_state[j][k] = res["opt"]
        carry["grad"] = res.get("grad")
        for t, tie in enumerate(self.ties[j]):
            for ku, name in tie.users:  # a later shard's gradient of a parameter it does not own
                if ku == k:
                    g = res["held"][name]
                    carry["tied"][t] = g if t not in carry["tied"] else carry["tied"][t] + g
            if tie.owner[0] == k:  # stepped: every shard that uses it reads the new value
                carry["tied"].pop(t, None)
                value = self.host[j][k][tie.owner[1]]
                for ku, name in tie.users:
                    self.host[j][ku] = {**self.host[j][ku], name: value}

    # -- running ----------------------------------------------------------------------------------
    def train(self, order: Sequence[Placement] | None = None) -> SpillReport:
        """Run every unit of every job. ``order=None``: Sharded-LRTF picks, whenever a
        device is idle, the job with the longest remaining time. Otherwise ``order`` is a
        schedule (``Placement.model`` indexes the jobs) whose per-device order is followed."""
        t0 = time.perf_counter()
        n_dev = len(self.devices)
        queues: list[list[tuple[int, int]]] | None = None
        if order is not None:
            queues = [[] for _ in range(n_dev)]
            for pl in sorted(order, key=lambda q: (q.start, q.end, q.model, q.unit)):
                queues[pl.device % n_dev].append((pl.model, pl.unit))
        nxt = [0] * len(self.jobs)
        running = [False] * len(self.jobs)
        carries: list[dict[str, Any]] = [{"act": {}, "rng": {}, "tied": {}} for _ in self.jobs]
        losses: dict[str, list[float]] = {j.name: [] for j in self.jobs}
        done: list[tuple[int, int, int]] = []
        idle = list(range(n_dev))
        total = sum(j.num_units for j in self.jobs)
        pool = _Pool(self) if self.workers else None
        inflight: dict[int, tuple[int, int]] = {}
        try:
            while len(done) < total:
                before = len(done) + len(inflight)
                for p in list(idle):
                    pick = self._pick(p, queues, nxt, running)
                    if pick is None:
                        continue
                    j, u = pick
                    key, args = self._args(j, u, carries[j])
                    args["device"] = self.devices[p] if not self.workers else "cpu"
                    running[j] = True
                    idle.remove(p)
                    inflight[p] = (j, u)
                    if pool:
                        pool.submit(p, key, args)
                    else:
                        promoted = self._claim_prefetch(p, j, u)
                        module = self._local(p, key)  # before the prefetch: never the victim
                        self._start_prefetch(p, j, u, queues)
                        res = run_unit(module, promoted=promoted, **args)
                        self._finish((p, key, res), inflight, carries, losses, nxt, running, done, idle,
                                     queues)
                if pool and inflight:
                    self._finish(pool.get(), inflight, carries, losses, nxt, running, done, idle,
                                 queues)
                elif not inflight and len(done) < total and len(done) == before:
                    raise RuntimeError("spilled training stalled: the order skips a unit")
        finally:
            if pool:
                pool.close()
            for _, fut in self._prefetch.values():
                fut.result()
            self._prefetch.clear()
        return SpillReport(losses, done, time.perf_counter() - t0)

    def _claim_prefetch(self, p: int, j: int, u: int) -> bool:
        """Wait for device p's prefetch; True when it promoted exactly this unit's shard."""
        pf = self._prefetch.pop(p, None)
        if pf is None:
            return False
        (pj, pu), fut = pf
        fut.result()
        if (pj, pu) == (j, u):
            self.prefetched += 1
            return True
        return False

    def _start_prefetch(self, p: int, j: int, u: int,
                        queues: list[list[tuple[int, int]]] | None) -> None:
        job = self.jobs[j]
        if self._copier is None or u + 1 >= job.num_units:
            return
        if queues is not None and (not queues[p] or queues[p][0] != (j, u + 1)):
            return  # this device runs another job's unit next
        k_now, k_next = job.unit(u)[1], job.unit(u + 1)[1]
        if k_next == k_now:
            return  # the same buffer: it is in use now
        module = self._local(p, (j, k_next))
        fut = self._copier.submit(promote, module, self.host[j][k_next])
        self._prefetch[p] = ((j, u + 1), fut)

    def _pick(self, p: int, queues: list[list[tuple[int, int]]] | None, nxt: list[int],
              running: list[bool]) -> tuple[int, int] | None:
        if queues is not None:
            if queues[p] and not running[queues[p][0][0]] and nxt[queues[p][0][0]] == queues[p][0][1]:
                return queues[p].pop(0)
            return None
        best, key = None, -1.0
        for j, job in enumerate(self.jobs):  # linear scan: Sharded-LRTF
            if not running[j] and nxt[j] < job.num_units:
                r = self._remaining(j, nxt[j])
                if r > key:
                    best, key = (j, nxt[j]), r
        return best

    def _finish(self, got: tuple[int, tuple[int, int], dict[str, Any]],
                inflight: dict[int, tuple[int, int]], carries: list[dict[str, Any]],
                losses: dict[str, list[float]], nxt: list[int], running: list[bool],
                done: list[tuple[int, int, int]], idle: list[int],
                queues: list[list[tuple[int, int]]] | None) -> None:
        p, _, res = got
        j, u = inflight.pop(p)
        self._absorb(j, u, res, carries[j], losses)
        nxt[j] += 1
        running[j] = False
        done.append((p, j, u))
        idle.append(p)
        idle.sort()

    def _local(self, p: int, key: tuple[int, int]) -> Any:
        """Device p's buffer for shard ``key`` (job, shard): at most one buffer per device,
        two with double buffering (the running shard's and the prefetched one's), the least
        recently used dropped first. A buffer per shard kept for the whole run would hold
        every shard's parameters on the device at once: on an H200 a 0.8 GB model spilled
        under a 1 GiB budget peaked at 2.2 GB that way."""
        cache = self._buffers.setdefault(p, OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        while len(cache) >= (2 if self.double_buffer else 1):
            cache.popitem(last=False)
        cache[key] = _empty_like(self.templates[key[0]][key[1]], self.devices[p])
        return cache[key]


class _Pool:
    """Worker processes (spawned: torch and fork do not mix), one task queue each."""

    def __init__(self, trainer: SpillTrainer) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(trainer.workers)]
        self.procs = [ctx.Process(target=_worker, args=(r, trainer.templates, q, self.results,
                                                         trainer.threads), daemon=True)
                      for r, q in enumerate(self.tasks)]
        for pr in self.procs:
            pr.start()

    def submit(self, p: int, key: tuple[int, int], args: dict[str, Any]) -> None:
        self.tasks[p].put((key, key, args))

    def get(self, timeout: float = 600.0) -> tuple[int, tuple[int, int], dict[str, Any]]:
        """The next finished unit; fails fast if a worker died instead of waiting forever."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, pr in enumerate(self.procs) if not pr.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"spill workers {dead or 'all'} stopped answering") from None

    def close(self) -> None:
        for q in self.tasks:
            q.put(None)
        for pr in self.procs:
            pr.join(timeout=10)
            if pr.is_alive():
                pr.terminate()


def train_whole(layers: Sequence[Any], loss_fn: Any, batches: Sequence[tuple[Any, Any]],
                epochs: int, optim: OptimSpec) -> list[float]:
    """Reference: the same model trained whole, one optimizer, same batches; losses per step."""
    import torch

    model = torch.nn.Sequential(*layers)
    opt = optim.make(list(model.parameters()))
    out = []
    for _ in range(epochs):
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            out.append(loss.item())
    return out


def make_mlp(width: int, depth: int, classes: int, seed: int) -> tuple[list[Any], Any]:
    """A small deterministic MLP (Linear/GELU/LayerNorm layers) and its loss, for tests."""
    import torch

    torch.manual_seed(seed)
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)]
    layers.append(torch.nn.Linear(width, classes))
    return layers, torch.nn.CrossEntropyLoss()


def make_batches(n: int, batch: int, width: int, classes: int, seed: int) -> list[tuple[Any, Any]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, width, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]

