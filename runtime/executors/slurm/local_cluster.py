"""A private Slurm cluster on this one machine: several ``slurmd`` nodes with typed GPUs.

For tests, CI and demos of the Slurm executor: every file lives in one folder
(``slurm.conf``, ``gres.conf``, state, spool, logs, a private ``munged`` with
its own key and socket), every port is a free one, and the clients find the
cluster through the ``SLURM_CONF`` environment variable (see :meth:`env`), so
nothing under ``/etc/slurm`` or ``/run/munge`` is touched and two such
clusters (two test runs) can run side by side. Needs root (``slurmd`` runs
jobs as their submitter and ``munged`` must own its key) and Debian's
``slurm-wlm`` and ``munge`` packages (22.05 measured).

GPUs are stand-ins: empty files named in ``gres.conf`` (without ``File=`` the
node registers no GPU and goes INVAL); every other resource is real to Slurm:
typed GRES counts, ``--nodelist`` pinning, queueing behind busy GPUs, job
steps, signals. ``SlurmdParameters=config_overrides`` lets each node declare
more CPUs than the host has, so every stand-in GPU can get its own task.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")


@dataclass(frozen=True)
class FakeNode:
    """One ``slurmd`` of the private cluster: a name, a GRES type and count, CPUs, memory."""

    name: str
    gres_type: str
    gpus: int
    cpus: int = 4
    memory_mib: int = 8000
    mem_spec_mib: int = 0  # MemSpecLimit: memory Slurm keeps for the node's own daemons


def missing_binaries() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty: a cluster can start)."""
    return [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class LocalSlurm:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager)."""

    root: Path
    nodes: list[FakeNode] = field(default_factory=lambda: [FakeNode("a40-0", "a40", 2),
                                                          FakeNode("a10-0", "a10", 2)])
    partition: str = "main"
    started: bool = False

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "sock"

    def env(self) -> dict[str, str]:
        """Variables that point Slurm's clients at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # -- configuration -----------------------------------------------------------
    def _write_config(self) -> None:
        r = self.root
        for sub in ("etc", "state", "spool", "log", "dev", "munge"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o711)
        host = socket.gethostname()
        ctld_port = _free_port()
        lines = [
            "ClusterName=apportion-test",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            f"PlugStackConfig={r / 'etc' / 'plugstack.conf'}",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",  # heterogeneous jobs start only from backfill
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            "KillWait=2",
            "MinJobAge=600",
            "InactiveLimit=0",
            "SlurmdTimeout=60",
        ]
        gres = ["AutoDetect=off"]
        k = 0
        for n in self.nodes:
            port = _free_port()
            lines.append(f"NodeName={n.name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={n.cpus} RealMemory={n.memory_mib} Gres=gpu:{n.gres_type}:{n.gpus}"
                         + (f" MemSpecLimit={n.mem_spec_mib}" if n.mem_spec_mib else ""))
            files = []
            for _ in range(n.gpus):
                dev = r / "dev" / f"nvidia{k}"
                dev.touch()
                files.append(str(dev))
                k += 1
            gres.append(f"NodeName={n.name} Name=gpu Type={n.gres_type} File={','.join(files)}")
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        (r / "etc" / "plugstack.conf").write_text("")

    # -- life cycle ------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalSlurm:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"Slurm is not installed here (missing {', '.join(missing)}): "
                               "apt-get install slurm-wlm munge")
        if os.geteuid() != 0:
            raise RuntimeError("a private Slurm cluster needs root (slurmd and munged)")
        self._write_config()
        m = self.root / "munge"
        key = m / "key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        env = {**os.environ, **self.env()}
        self.started = True
        subprocess.run([_binary("munged"), "--force", f"--socket={self.munge_socket}",
                        f"--key-file={key}", f"--pid-file={m / 'pid'}",
                        f"--log-file={m / 'log'}", f"--seed-file={m / 'seed'}"],
                       check=True, capture_output=True, timeout=30)
        conf = str(self.conf)
        subprocess.run([_binary("slurmctld"), "-f", conf], env=env, check=True,
                       capture_output=True, timeout=30)
        for n in self.nodes:
            subprocess.run([_binary("slurmd"), "-f", conf, "-N", n.name], env=env, check=True,
                           capture_output=True, timeout=30)
        self.wait_idle(timeout_s)
        return self

    def wait_idle(self, timeout_s: float) -> None:
        """Until every node reports idle (raises with the nodes' states and the logs' tails)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env={**os.environ, **self.env()},
                               capture_output=True, text=True, timeout=30, check=False)
            states = dict(line.split(None, 1) for line in r.stdout.splitlines() if " " in line)
            if len(states) == len(self.nodes) and all(s.strip() == "idle" for s in states.values()):
                return
            time.sleep(0.3)
        tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-8:])
                          for p in sorted((self.root / "log").glob("*.log")))
        raise RuntimeError(f"Slurm nodes not idle within {timeout_s:g}s: {states}\n{tails}")

    def _pids(self) -> list[int]:
        files = [self.root / "slurmctld.pid", self.root / "munge" / "pid"]
        files[1:1] = [self.root / f"slurmd-{n.name}.pid" for n in self.nodes]
        pids = []
        for f in files:
            try:
                pids.append(int(f.read_text().strip()))
            except (OSError, ValueError):
                continue
        return pids

    def stop(self) -> None:
        """Cancel what still runs and let it drain, then stop the daemons this object started
        (by their pids) and any ``slurmstepd`` of this cluster left behind."""
        if not self.started:
            return
        env = {**os.environ, **self.env()}
        subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=env,
                       capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + 20.0  # steps report to slurmd and srun while they end
        while time.monotonic() < deadline:
            r = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                               text=True, timeout=30, check=False)
            if r.returncode != 0 or not r.stdout.strip():
                break
            time.sleep(0.2)
        pids = self._pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 15.0
        for pid in pids:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in self._step_daemons():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.started = False

    def _step_daemons(self) -> list[int]:
        """``slurmstepd`` processes started by this cluster's slurmd (their SLURM_CONF is ours)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if not (d / "cmdline").read_bytes().startswith(b"slurmstepd"):
                    continue
                if mine in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
        return out

    def __enter__(self) -> LocalSlurm:  # noqa: PYI034 - start() returns self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False
