"""The worker image's build, checked as far as a machine without a container runtime can:
the Dockerfile copies every source folder the package is built from (pyproject's
package-dir, and the README its metadata reads), .dockerignore keeps none of them out, the
build arguments docs/kubernetes-slurm.md names exist with their defaults, and the
Dockerfile's own install step (`pip install .` of exactly the files it copies) builds a
wheel holding the trainer the pods run, the serve extra's dashboard and the bundled data.
What is not checked here: `docker build` itself (no daemon on these machines), the torch
wheel index, and the image running on a GPU node."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _copied() -> list[str]:
    """The sources of the Dockerfile's COPY lines (the last word is the destination)."""
    out: list[str] = []
    for line in DOCKERFILE.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            out += words[1:-1]
    return out


def _ignored(path: str) -> bool:
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    return any(fnmatch.fnmatch(path, r) or path.startswith(r.rstrip("/") + "/")
               for r in rules if not r.startswith("!"))


def test_every_package_folder_is_copied_and_none_ignored() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(meta["tool"]["setuptools"]["package-dir"].values())
    tops = {f.split("/")[0] for f in folders}
    copied = set(_copied())
    needed = tops | {"pyproject.toml", meta["project"]["readme"]}
    assert needed <= copied, sorted(needed - copied)
    for path in needed:
        assert not _ignored(path), path


def test_build_arguments_are_the_documented_ones() -> None:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE, re.M))
    assert args["VARIANT"] == "cpu" and args["EXTRAS"] == "k8s,serve"
    assert {"PYTHON", "TORCH", "TORCH_CUDA"} <= set(args)
    docs = (ROOT / "docs" / "kubernetes-slurm.md").read_text()
    for a in ("VARIANT", "TORCH", "TORCH_CUDA", "EXTRAS"):
        assert f"--build-arg {a}=" in docs, a
    assert "USER 10001" in DOCKERFILE  # deploy/ runs the pods as this user
    deploy = (ROOT / "deploy" / "scheduler.yaml").read_text()
    assert "runAsUser: 10001" in deploy


@pytest.mark.skipif(shutil.which("git") is None, reason="copies the tracked files with git")
def test_the_install_step_builds_from_the_copied_files(tmp_path: Path) -> None:
    """`pip install ".[EXTRAS]"` of the image, as a wheel built from only what the
    Dockerfile copies (tracked files; no network, no dependencies)."""
    ctx = tmp_path / "ctx"
    tracked = subprocess.run(["git", "ls-files", "-z", *_copied()], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    files = [f for f in tracked if f and not _ignored(f)]
    for f in files:
        (ctx / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, ctx / f)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"), str(ctx)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next((tmp_path / "wheel").glob("apportion-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in ("apportion/runtime/workers/trainer.py", "apportion/serve/static/index.html",
                   "apportion/serve/static/dashboard.js", "apportion/data/gpus.yaml",
                   "apportion/cli/app.py", "apportion/solvers/chain.py"):
        assert member in names, member
