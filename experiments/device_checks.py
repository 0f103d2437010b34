"""The checks a session runs when it is lent a CUDA machine (`experiments/device_check.sh`).

Nothing here is a test: CI has no GPU. Each check writes one JSON file of figures under
the output folder, so a session's closing note quotes what a real GPU measured:

* ``trainer``: apportion's built-in trainer (the runtime worker, world 1) on
  ``cuda:0`` with the plans one GPU runs (DP, recomputation, accumulation): the
  device it chose, per-step wall time (forward and optimizer parts synchronised),
  the loss falling.
* ``run``: `apportion run --executor local` with a built-in job and a user
  workload (``examples/torch_train.py``, kind torchrun) of one GPU each, to
  finished; which device each rank used, from its own log line.
* ``spill``: Hydra's spilled trainer on CUDA: the pilot partition under a memory
  budget read from the CUDA allocator, the spilled losses against the same model
  trained whole on the GPU, the peak memory the spilled run held, its time against
  whole training.
* ``spill_builtin``: a spilled *plan* in the built-in trainer on ``cuda:0`` (gpt-tiny
  under a device budget against whole, and resumed under another budget), and the
  spilled estimate (``estimation.models.spill``) against the spilled trainer's
  steady-state steps of the ``spill`` check's MLP, one step at a time as the trainer
  runs them.

Run ``python experiments/device_checks.py OUT trainer run spill``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _write(out: Path, name: str, data: dict[str, Any]) -> None:
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    print(name, json.dumps({k: v for k, v in data.items() if k != "rows"}, default=str)[:3000],
          flush=True)


def check_trainer(out: Path) -> None:
    import torch
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.workers.trainer import LOSSES_FILE, Worker

    from apportion.plans import ExecutionPlan

    rows = []
    for model in ("gpt-tiny", "bert-tiny"):
        for label, plan in (("DP", ExecutionPlan()),
                            ("GC", ExecutionPlan(checkpointing=True)),
                            ("GA", ExecutionPlan(accumulation=2))):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = TrainConfig("dev", model, 32, 60, plan.as_dict(), tmp, lr=3e-3,
                                  warmup_iterations=5, grad_clip=1.0)
                w = Worker(cfg, 0, 1)
                rc = w.run()
                recs = [json.loads(x) for x in (Path(tmp) / LOSSES_FILE).read_text()
                        .splitlines()]
            steady = sorted(r["time_s"] for r in recs[5:])
            rows.append({"model": model, "plan": label, "rc": rc,
                         "device": str(w.torch_device),
                         "step_s_median": steady[len(steady) // 2],
                         "fwd_s": recs[-1]["fwd_s"], "opt_s": recs[-1]["opt_s"],
                         "loss_first": recs[0]["loss"], "loss_last5_min":
                         min(r["loss"] for r in recs[-5:])})
    _write(out, "trainer", {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                            else None, "rows": rows})


def check_run(out: Path) -> None:
    import yaml

    tmp = Path(tempfile.mkdtemp(prefix="apportion-device-run-"))
    jobs = {"jobs": [
        {"id": "builtin", "model": "gpt-tiny", "global_batch_size": 32, "iterations": 200,
         "requested_gpus": 1, "workload": {"train": {"lr": 3.0e-3, "warmup_iterations": 5}}},
        {"id": "user", "model": "gpt-tiny", "global_batch_size": 32, "iterations": 200,
         "requested_gpus": 1,
         "workload": {"kind": "torchrun", "command": [sys.executable,
                                                     str(ROOT / "examples" / "torch_train.py")],
                      "env": {"EXAMPLE_HIDDEN": "1024", "EXAMPLE_LAYERS": "4"}}}]}
    (tmp / "jobs.yaml").write_text(yaml.safe_dump(jobs))
    cli = [sys.executable, "-m", "apportion.cli"]
    sub = subprocess.run([*cli, "submit", "jobs.yaml", "--state", "s.db"], cwd=tmp,
                         capture_output=True, text=True, check=False)
    t0 = time.perf_counter()
    # one worker slot per job: with one GPU every rank pins cuda:0, and NCCL refuses two
    # ranks of one group on one GPU, so the jobs ask for one GPU each
    run = subprocess.run([*cli, "run", "--executor", "local", "--cluster", "local", "--state",
                          "s.db", "--interval", "3", "--until-idle", "--timeout", "240",
                          "--time-budget", "3"], cwd=tmp, capture_output=True, text=True,
                         check=False)
    wall = time.perf_counter() - t0
    st = subprocess.run([*cli, "status", "--state", "s.db", "--json"], cwd=tmp,
                        capture_output=True, text=True, check=False)
    status = json.loads(st.stdout) if st.returncode == 0 else {"error": st.stderr[-2000:]}
    logs = {}
    for d in sorted((tmp / "apportion-runs").glob("*")):
        for f in sorted(d.glob("rank*.*")) + sorted(d.glob("progress.jsonl")):
            logs[f"{d.name}/{f.name}"] = f.read_text()[-1500:]
    _write(out, "run", {"submit_rc": sub.returncode, "run_rc": run.returncode, "wall_s": wall,
                        "run_stderr": run.stderr[-4000:],
                        "jobs": status.get("jobs", status),
                        "logs": logs})


def check_spill(out: Path) -> None:
    import torch
    from apportion.runtime.workers.pilot import OptimSpec, partition
    from apportion.runtime.workers.spill import (
        SpillJob,
        SpillTrainer,
        make_batches,
        make_mlp,
        train_whole,
    )

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    width, depth, classes = int(os.environ.get("SPILL_WIDTH", "4096")), 12, 16
    layers, loss = make_mlp(width, depth, classes, 0)
    batches = make_batches(4, 256, width, classes, 1)
    opt = OptimSpec("adam", 1e-4)
    budget = float(os.environ.get("SPILL_BUDGET", str(1.0 * 2**30)))
    t0 = time.perf_counter()
    part = partition(layers, batches[0][0], budget, opt, loss_fn=loss, target=batches[0][1],
                     device=dev, repeats=2)
    pilot_s = time.perf_counter() - t0
    # double buffering prefetches the next shard into the reserve: its own, finer partition
    part_double = partition(layers, batches[0][0], budget, opt, loss_fn=loss,
                            target=batches[0][1], device=dev, repeats=2, double_buffer=True)
    whole_layers = [copy.deepcopy(m).to(dev) for m in layers]
    dev_batches = [(x.to(dev), y.to(dev)) for x, y in batches]
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    ref = train_whole(whole_layers, loss, dev_batches, 2, opt)
    whole_s = time.perf_counter() - t0
    whole_peak = torch.cuda.max_memory_allocated() if dev.startswith("cuda") else None
    del whole_layers, dev_batches
    result: dict[str, Any] = {"device": dev, "width": width, "layers": len(layers),
                              "param_bytes": sum(p.numel() * 4 for m in layers
                                                 for p in m.parameters()),
                              "budget_bytes": budget, "shards": part.boundaries,
                              "pilot_s": pilot_s, "whole_s": whole_s,
                              "whole_peak_bytes": whole_peak, "runs": []}
    for double in (False, True):
        p = part_double if double else part
        job = SpillJob("m", copy.deepcopy(layers), p.boundaries, loss, batches, 2, opt,
                       p.unit_runtimes(1))
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        rep = SpillTrainer([job], workers=0, devices=[dev], double_buffer=double).train()
        spill_s = time.perf_counter() - t0
        got = rep.losses["m"]
        result["runs"].append({
            "double_buffer": double, "spill_s": spill_s, "shards": p.boundaries,
            "peak_bytes": torch.cuda.max_memory_allocated() if dev.startswith("cuda") else None,
            "max_rel_loss_diff": max(abs(a - b) / abs(b) for a, b in zip(got, ref)),
            "losses": got, "units": len(rep.units_run)})
    result["whole_losses"] = ref
    _write(out, "spill", result)


def check_spill_builtin(out: Path) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    cuda = torch.cuda.is_available()
    dev = "cuda:0" if cuda else "cpu"
    result: dict[str, Any] = {"device": dev, "builtin": _spill_builtin_runs(cuda)}
    result["mlp"] = _spill_mlp_rows(dev, cuda)
    _write(out, "spill_builtin", result)


def _spill_builtin_runs(cuda: bool) -> list[dict[str, Any]]:
    """gpt-tiny through the worker whole, then spilled at the first budget that fits
    (``SPILL_MIB``, 128, 256 MiB): its losses against the whole run's, and a run stopped
    at step 5 and resumed at twice the budget against the uninterrupted one."""
    import statistics

    import torch
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.workers.trainer import LOSSES_FILE, Worker

    from apportion.plans import ExecutionPlan

    builtin: list[dict[str, Any]] = []

    def worker(tmp: str, plan: ExecutionPlan, iterations: int, stop_at: int | None = None
               ) -> dict[str, Any]:
        cfg = TrainConfig("dev", "gpt-tiny", 32, iterations, plan.as_dict(), tmp, lr=3e-3,
                          stop_at=stop_at)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        w = Worker(cfg, 0, 1)
        rc = w.run()
        recs = [json.loads(x) for x in (Path(tmp) / LOSSES_FILE).read_text().splitlines()]
        return {"plan": plan.label(), "rc": rc, "losses": [r["loss"] for r in recs],
                "step_s_median": statistics.median(r["time_s"] for r in recs[2:]) if
                len(recs) > 2 else None,
                "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "shards": getattr(getattr(w.par, "partition", None), "boundaries", None),
                "double_buffer": getattr(w.par, "double_buffer", None),
                "device": str(w.torch_device)}

    with tempfile.TemporaryDirectory() as tmp:
        whole = worker(tmp + "/w", ExecutionPlan(), 10)
    builtin.append(whole)
    budgets = (int(os.environ.get("SPILL_MIB", "64")), 128, 256)
    for mib in budgets if os.environ.get("SPILL_BUILTIN", "1") == "1" else ():
        try:
            with tempfile.TemporaryDirectory() as tmp:
                row = worker(tmp, ExecutionPlan(spill_shards=1, spill_budget_mib=mib), 10)
                part = worker(tmp + "/r", ExecutionPlan(spill_shards=1, spill_budget_mib=mib),
                              10, stop_at=5)
                rest = worker(tmp + "/r", ExecutionPlan(spill_shards=1,
                                                        spill_budget_mib=2 * mib), 10)
        except Exception as exc:  # noqa: BLE001 - a budget too small: say so, try the next
            builtin.append({"budget_mib": mib, "error": repr(exc)[:500]})
            continue
        row.update({"budget_mib": mib,
                    "max_rel_diff_vs_whole": max(abs(a - b) / abs(b) for a, b in
                                                 zip(row["losses"], whole["losses"])),
                    "resumed_equal": rest["losses"] == row["losses"],
                    "resumed_shards": [part["shards"], rest["shards"]]})
        builtin.append(row)
        break
    return builtin


def _spill_mlp_rows(dev: str, cuda: bool) -> list[dict[str, Any]]:
    """The spill estimate against steady-state spilled steps of the MLP of the ``spill``
    check, with and without double buffering."""
    import statistics

    import torch
    from apportion.estimation.models.spill import spill_estimate
    from apportion.runtime.workers.pilot import OptimSpec, partition
    from apportion.runtime.workers.spill import SpillJob, SpillTrainer, make_batches, make_mlp

    from apportion.gpus import get_gpu
    from apportion.models import _chain

    # the estimate against steady-state spilled steps of the MLP of the ``spill`` check
    width, depth, classes = int(os.environ.get("SPILL_WIDTH", "4096")), 12, 16
    batch = 256
    layers, loss = make_mlp(width, depth, classes, 0)
    batches = make_batches(8, batch, width, classes, 1)
    opt = OptimSpec("adam", 1e-4)
    budget = float(os.environ.get("SPILL_BUDGET", str(1.0 * 2**30)))
    t_c = _whole_step_s(layers, loss, batches, opt, dev, cuda)
    rows = []
    for name, kind, mod in ((f"l{i}", type(m).__name__, m) for i, m in enumerate(layers)):
        p = sum(q.numel() for q in mod.parameters())
        flops = 2.0 * p if kind == "Linear" else 5.0 * width
        rows.append((name, kind, flops, p, 4.0 * width * (2 if kind != "Linear" else 1),
                     4.0 * (classes if name == f"l{len(layers) - 1}" else width)))
    spec = _chain("mlp", "mlp", rows, 4, 1, width)
    mlp: list[dict[str, Any]] = []
    for double in (False, True):
        part = partition(layers, batches[0][0], budget, opt, loss_fn=loss, target=batches[0][1],
                         device=dev, repeats=1, double_buffer=double)
        job = SpillJob("m", copy.deepcopy(layers), part.boundaries, loss, [], 1, opt)
        trainer = SpillTrainer([job], workers=0, devices=[dev], double_buffer=double)
        times = []
        for x, y in batches:
            job.batches = [(x, y)]
            t0 = time.perf_counter()
            trainer.train()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        est = spill_estimate(spec, batch, get_gpu("H200"), t_c, budget)
        measured = statistics.median(times[2:])
        mlp.append({
            "double_buffer": double, "pilot_shards": part.boundaries,
            "estimate_shards": est.plan.spill_shards, "estimate_double": est.breakdown.get(
                "double_buffer"), "t_c_s": t_c, "steps_s": times, "measured_step_s": measured,
            "estimate_s": est.iter_time_s, "copy_s": est.breakdown.get("copy_s"),
            "hidden_s": est.breakdown.get("hidden_s"),
            "copy_bytes": est.breakdown.get("h2d_bytes", 0) + est.breakdown.get("d2h_bytes", 0),
            "error": est.iter_time_s / measured - 1.0})
    return mlp


def _whole_step_s(layers: list[Any], loss: Any, batches: list[Any], opt: Any, dev: str,
                  cuda: bool) -> float:
    """The median step of the whole MLP on ``dev``, its forward run twice (as a spilled
    step recomputes it), the first two steps left out as warm-up."""
    import statistics

    import torch

    whole_layers = torch.nn.Sequential(*[copy.deepcopy(m).to(dev) for m in layers])
    wopt = opt.make(whole_layers.parameters())
    recompute = []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            whole_layers(x)
        wopt.zero_grad()
        loss(whole_layers(x), y).backward()
        wopt.step()
        if cuda:
            torch.cuda.synchronize()
        recompute.append(time.perf_counter() - t0)
    del whole_layers, wopt
    return statistics.median(recompute[2:])


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def check_deepspeed(out: Path) -> None:
    """apportion's DeepSpeed trainer on cuda:0 (bf16, ZeRO-1): trained, checkpointed,
    resumed through the weights-only loader; then a planted model file refused."""
    import torch
    from apportion.runtime.executors.local.executor import free_port
    from apportion.runtime.workers.deepspeed_config import deepspeed_config, launch_command
    from apportion.runtime.workers.train_config import TrainConfig

    from apportion.plans import ExecutionPlan

    tmp = Path(tempfile.mkdtemp(prefix="apportion-device-ds-"))
    plan = ExecutionPlan(dp=1, zero_stage=1)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp / "ext"), "OMP_NUM_THREADS": "1"}
    rows = []

    def launch(iterations: int) -> subprocess.CompletedProcess[str]:
        cfg = TrainConfig("ds", "gpt-tiny", 32, iterations, plan.as_dict(), str(tmp))
        cfg.dump(tmp / "config.json")
        ds = deepspeed_config(plan, 32, device="cuda" if torch.cuda.is_available() else "cpu")
        (tmp / "ds.json").write_text(json.dumps(ds))
        t0 = time.perf_counter()
        r = subprocess.run(launch_command(plan, tmp / "config.json", tmp / "ds.json",
                                          free_port()), env=env, cwd=tmp, capture_output=True,
                           text=True, timeout=300, check=False)
        lines = [json.loads(x) for x in (tmp / "progress.jsonl").read_text().splitlines()
                 if x.strip()] if (tmp / "progress.jsonl").exists() else []
        steps = sorted(x["iter_time_s"] for x in lines if "iter_time_s" in x)
        rows.append({"iterations": iterations, "rc": r.returncode,
                     "wall_s": time.perf_counter() - t0,
                     "step_s_median": steps[len(steps) // 2] if steps else None,
                     "stderr": "\n".join(x for x in r.stderr.splitlines() if "Error" in x or "error" in x)[-3000:] if r.returncode else ""})
        return r

    if launch(20).returncode or launch(30).returncode:
        _write(out, "deepspeed", {"rows": rows})
        return
    losses = json.loads((tmp / "deepspeed_losses.json").read_text())
    ck = tmp / "checkpoint"
    tag = (ck / "latest").read_text().strip()
    marker = tmp / "pwned"
    model_file = next((ck / tag).glob("*model_states.pt"))
    torch.save({"module": {}, "evil": _Planted(marker)}, model_file)
    planted = launch(40)
    _write(out, "deepspeed", {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                              else None, "resumed_from": losses.get("resumed_from"),
                              "loss_first": losses["losses"][0], "loss_last": losses["losses"][-1],
                              "planted_refused": planted.returncode != 0
                              and "CheckpointError" in planted.stderr,
                              "planted_ran": marker.exists(), "rows": rows})


CHECKS = {"trainer": check_trainer, "run": check_run, "spill": check_spill,
          "deepspeed": check_deepspeed, "spill_builtin": check_spill_builtin}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in argv[1:]:
        t0 = time.perf_counter()
        try:
            CHECKS[name](out)
        except Exception as exc:  # noqa: BLE001 - one check's failure must not hide the others
            failed += 1
            _write(out, f"{name}-error", {"error": repr(exc)})
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
