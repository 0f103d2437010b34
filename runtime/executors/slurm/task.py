"""The per-node agent of a Slurm launch: one task per node starts that node's ranks.

``srun`` starts ``python -m apportion.runtime.executors.slurm.task LAUNCH.json`` once
on every node of the allocation (what torchrun's agent does, without its
rendezvous service). The agent finds its node (``SLURMD_NODENAME``) in the
launch file, and starts one process per rank placed there with the
workload contract (``runtime.workload``): torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and apportion's ``APPORTION_*``.

* ``MASTER_PORT`` must be free on the first node, which only that node can
  tell: its agent binds a free port and publishes it in the job's folder
  (shared storage, as the checkpoints need anyway); the other agents wait
  for the file.
* Slurm's per-task variables (``SLURM_PROCID``, ``SLURM_NTASKS``, ...) describe
  the agents, not the ranks, and libraries that detect Slurm would read the
  wrong rank from them, so they are removed from the ranks' environment.
* SIGTERM (``scancel --signal=TERM``) and SIGINT are forwarded to every rank,
  which checkpoints and exits 0; a rank still running ``kill_grace_s`` later
  is killed (SIGKILL), so the step ends by itself and Slurm completes the
  job normally. A rank that fails stops its siblings the same way, since
  they would wait for it in a collective forever; its code becomes the
  agent's exit code, so ``srun --kill-on-bad-exit`` stops the other nodes too.
* Each rank's stdout and stderr are appended to ``rank<R>.stdout`` and
  ``rank<R>.stderr`` in the job's folder (a marker line opens every launch),
  and the agent writes ``slurm-exit-<launch>-<node>.json`` with every rank's
  exit code: what the executor reads to report a failure's reason.

Imports nothing heavy: it runs before (and beside) the training processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from apportion.runtime.workload import rank_env

TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS",
             "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
             "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
             "SLURM_STEPID", "SLURM_STEP_ID", "SLURM_TASK_PID", "SLURM_GTIDS",
             "SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST", "SLURM_CPU_BIND_TYPE",
             "SLURM_CPU_BIND_VERBOSE", "SLURM_DISTRIBUTION", "SLURM_LAUNCH_NODE_IPADDR",
             "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT",
             "SLURM_UMASK", "PMI_FD", "PMI_RANK", "PMI_SIZE")


EXIT_CANNOT_START = 127  # a shell's code for a command it cannot run


def rendezvous_path(jobdir: str | Path, launch_id: str) -> Path:
    return Path(jobdir) / f"slurm-rendezvous-{launch_id}.json"


def exit_path(jobdir: str | Path, launch_id: str, node: str) -> Path:
    return Path(jobdir) / f"slurm-exit-{launch_id}-{node}.json"


def launch_marker(launch_id: str) -> str:
    return f"==== apportion launch {launch_id} ===="


def _write_json(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _master_port(spec: dict[str, Any], first: bool) -> int:
    path = rendezvous_path(spec["jobdir"], spec["launch_id"])
    if first:
        port = _free_port()
        _write_json(path, {"master_addr": spec["master_addr"], "master_port": port})
        return port
    deadline = time.monotonic() + float(spec.get("rendezvous_timeout_s", 300))
    while time.monotonic() < deadline:
        try:
            return int(json.loads(path.read_text())["master_port"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            time.sleep(0.2)
    raise TimeoutError(f"no rendezvous file {path} from the first node "
                       f"({spec['nodes'][0]['name']}); is the job folder on shared storage?")


def _my_node(spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    for i, n in enumerate(spec["nodes"]):
        if n["name"] == name:
            return i, n
    raise LookupError(f"node {name!r} is not in this launch ({', '.join(n['name'] for n in spec['nodes'])})")


def _code(rc: int) -> int:
    """A process exit status as a shell would report it (128 + signal for a signal)."""
    return 128 - rc if rc < 0 else rc


def run(spec: dict[str, Any]) -> int:
    index, node = _my_node(spec)
    port = _master_port(spec, index == 0)
    base = _task_env(spec, port)
    jobdir = Path(spec["jobdir"])
    marker = launch_marker(spec["launch_id"])
    procs: dict[int, subprocess.Popen] = {}
    stopping: dict[str, Any] = {"requested": False, "at": None}

    def forward(signum: int, frame: Any) -> None:
        stopping["requested"] = True
        stopping["at"] = stopping["at"] or time.monotonic()
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    local = len(node["ranks"])
    unstarted: dict[int, int] = {}
    for i, r in enumerate(node["ranks"]):
        env = {**base, **rank_env(r, i, local)}
        out = open(jobdir / f"rank{r}.stdout", "ab")  # noqa: SIM115 - owned by the child
        err = open(jobdir / f"rank{r}.stderr", "ab")  # noqa: SIM115
        err.write(f"{marker} node {node['name']} rank {r}\n".encode())
        err.flush()
        try:
            procs[r] = subprocess.Popen(spec["command"], cwd=spec["cwd"], env=env, stdout=out,
                                        stderr=err, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        except OSError as exc:  # a missing binary, a bad cwd: this rank failed to start,
            # which is the job's failure (its reason in the rank's stderr), not the agent's
            err.write(f"apportion: cannot start {spec['command'][:1]}: "
                      f"{type(exc).__name__}: {exc}\n".encode())
            unstarted[r] = EXIT_CANNOT_START
            break
        finally:
            out.close()
            err.close()
        if stopping["requested"]:  # a stop that came while starting reaches the late ranks too
            forward(signal.SIGTERM, None)
    codes: dict[int, int] = dict(unstarted)
    first_failed: int | None = next(iter(unstarted), None)
    if first_failed is not None:  # the ranks that did start would wait for it for ever
        forward(signal.SIGTERM, None)
    grace = float(spec.get("kill_grace_s", 30))
    killed: set[int] = set()
    while any(r not in codes for r in procs):
        for r, p in procs.items():
            if r not in codes and p.poll() is not None:
                codes[r] = p.returncode
                if p.returncode != 0 and first_failed is None and not stopping["requested"]:
                    first_failed = r  # one rank failed: stop the others, which would wait for it
                    forward(signal.SIGTERM, None)
        since = stopping["at"]
        if since is not None and time.monotonic() - since > grace:  # the grace is over
            for r, q in procs.items():
                if q.poll() is None:
                    killed.add(r)
                    os.killpg(q.pid, signal.SIGKILL)
        time.sleep(0.1)
    bad = _failed_ranks(codes, first_failed, stopping["requested"])
    _write_json(exit_path(jobdir, spec["launch_id"], node["name"]),
                {"node": node["name"], "codes": {str(r): c for r, c in codes.items()},
                 "failed": bad, "killed_after_grace": sorted(killed),
                 "stop_requested": stopping["requested"] and first_failed is None,
                 "wall": time.time()})
    return _code(codes[bad[0]]) if bad else 0


def _task_env(spec: dict[str, Any], port: int) -> dict[str, str]:
    """The ranks' shared environment: the agent's without Slurm's task variables, the
    job's, ``python`` first on PATH, and the rendezvous address and port."""
    base = {k: v for k, v in os.environ.items() if k not in TASK_VARS}
    base.update(spec["env"])
    # `python` in a workload's command is the interpreter the agent runs under (apportion's),
    # whatever PATH the job sets (its own PATH follows it), as with every executor
    path = spec["env"].get("PATH", os.environ.get("PATH", ""))
    base["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), path])
    base.update({"MASTER_ADDR": spec["master_addr"], "MASTER_PORT": str(port)})
    return base


def _failed_ranks(codes: dict[int, int], first_failed: int | None,
                  stop_requested: bool) -> list[int]:
    """The ranks that failed, the first to fail leading; the ranks this agent (or the
    executor) stopped are not failures."""
    # ranks this agent (or the executor) stopped are not failures; the first that failed leads
    stopped_ok = {0, -signal.SIGTERM, -signal.SIGKILL}
    return ([first_failed] if first_failed is not None else []) + [
        r for r in sorted(codes) if r != first_failed and codes[r] != 0
        and not (stop_requested and codes[r] in stopped_ok)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m apportion.runtime.executors.slurm.task LAUNCH.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    try:
        return run(spec)
    except (LookupError, TimeoutError, OSError) as exc:
        print(f"apportion slurm agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
