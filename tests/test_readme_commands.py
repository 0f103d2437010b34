"""The newcomer's path: every command of the README and of docs/, as written, on a fresh
clone.

``git clone`` of this checkout into a temporary folder; the clone's own package is what
runs: a ``sitecustomize`` on ``PYTHONPATH`` maps ``apportion`` and its areas
(``apportion.solvers`` -> ``solvers/``, ...) to the clone, as an editable install of it
would (``make run`` installs it editable), and ``apportion`` and ``python`` scripts come
first on ``PATH``. Dependencies come from this environment (a pip install of the clone
would take minutes; ``.ci/run`` does that one). The files the README tells a newcomer to save (the blocks
marked ``<!-- file: NAME -->``: cluster.yaml, jobs.yaml, units.json, tasks.yaml) are
written first; then every line of every ``sh`` block runs, in order, in the clone, and
must exit 0. ``APPORTION_DATA`` points at this checkout's data (a clone has none beside
it); commands that need the data are skipped when there is none.

:data:`LONG`, the allow-list: a command that runs for minutes gets bounding options
appended (typer keeps an option's last value), is checked through ``--help``, or is
skipped, each with its reason. Everything else runs exactly as printed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AREAS = ("formulations", "solvers", "estimation", "runtime", "experiments")

#: command prefix -> ("help", reason) | ("skip", reason). Every other command runs exactly as
#: printed: the docs give short commands and name the long variants in prose, with their
#: durations.
LONG: dict[str, tuple[str, object]] = {
    "make run": ("skip", "creates .venv and pip-installs apportion (minutes); .ci/run does it"),
    "make test": ("skip", "runs this very test suite"),
    "apportion bench estimate": ("skip", ("fits and scores every estimator on the measured "
                                          "tables (~30 s); tests/test_estimation_* cover it")),
    "apportion profile": ("skip", ("times every layer of a torch model (~30 s on a loaded "
                                   "machine); tests/test_estimation_profilers.py and "
                                   "tests/test_estimation_measured_profiles.py cover it")),
    "apportion bench round --case 1000:1280:30": ("help", (
        "times a 1,000-job round against a second install the reader makes first "
        "(docs/evaluation.md says how); tests/test_bench_rounds.py runs --against")),
}
#: the pages, in the order a newcomer follows them (later pages use files earlier ones wrote)
PAGES = ("README.md", "docs/cli.md", "docs/formats.md", "docs/policies.md",
         "docs/operating.md", "docs/service.md", "docs/kubernetes-slurm.md",
         "docs/evaluation.md", "docs/library.md", "docs/objective.md", "docs/environment.md",
         "docs/design.md")


def pages_text(root: Path) -> str:
    """README and every page of docs/ (those not in :data:`PAGES` last, so none escapes)."""
    names = list(PAGES) + sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md")
                                 if str(p.relative_to(root)) not in PAGES)
    return "\n".join((root / n).read_text() for n in names if (root / n).exists())
NEEDS_DATA = ("apportion simulate", "apportion compare", "apportion bench sim",
              "apportion bench estimate", "apportion bench rates")


_FINDER = '''"""apportion and its areas come from a fresh clone (tests/test_readme_commands.py)."""
import importlib.machinery, importlib.util, os, sys

MAPPING = MAPPING_HERE


class _CloneFinder:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname in MAPPING:
            init = os.path.join(MAPPING[fullname], "__init__.py")
            return importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[MAPPING[fullname]])
        return None


sys.meta_path.insert(0, _CloneFinder)
'''


def readme_files(text: str) -> dict[str, str]:
    """The blocks marked ``<!-- file: NAME -->`` (the files a newcomer saves)."""
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- file: (\S+) -->\s*\n```\w*\n(.*?)```", text, re.DOTALL)}


def readme_commands(text: str) -> list[str]:
    """Every command line of every ``sh`` block (continuations joined, comments kept)."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [ln.strip() for ln in joined.splitlines() if ln.strip()]
    return out


def _prefix(argv: list[str]) -> str | None:
    line = " ".join(argv)
    return max((p for p in LONG if line == p or line.startswith(p + " ")), key=len, default=None)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "--git-dir"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("this checkout is not a git repository: nothing to clone")
    root = tmp_path_factory.mktemp("newcomer")
    dest = root / "apportion"
    r = subprocess.run(["git", "clone", "--quiet", str(REPO), str(dest)], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    shim = root / "shim"
    shim.mkdir()
    mapping = {"apportion": str(dest / "apportion"),
               **{f"apportion.{a}": str(dest / a) for a in AREAS}}
    (shim / "sitecustomize.py").write_text(_FINDER.replace("MAPPING_HERE", repr(mapping)))
    bin_dir = shim / "bin"
    bin_dir.mkdir()
    boot = "import sys; sys.argv[0] = 'apportion'; from apportion.cli import main; main()"
    for name, body in (("python", f'exec {sys.executable} "$@"\n'),
                       ("apportion", f'exec {sys.executable} -c "{boot}" "$@"\n')):
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return dest


def _env(clone: Path) -> dict[str, str]:
    from apportion.env import data_root

    shim = clone.parent / "shim"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(shim), PATH=f"{shim / 'bin'}:{env.get('PATH', '')}",
               APPORTION_DATA=str(data_root()), APPORTION_PROGRESS_S="30")
    return env


def test_the_clone_runs_its_own_code(clone: Path) -> None:
    code = ("import apportion, apportion.solvers, os; "
            "print(os.path.realpath(apportion.solvers.__file__))")
    r = subprocess.run(["python", "-c", code],
                       cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(clone)), r.stdout


def test_every_readme_command_runs_as_written(clone: Path) -> None:
    text = pages_text(clone)
    files = readme_files(text)
    assert {"cluster.yaml", "jobs.yaml", "units.json", "tasks.yaml"} <= set(files)
    for name, body in files.items():
        (clone / name).write_text(body)
    commands = readme_commands(text)
    assert len(commands) >= 20, commands
    env = _env(clone)
    have_data = Path(env["APPORTION_DATA"]).exists()
    ran, skipped = [], []
    for line in commands:
        argv = shlex.split(line, comments=True)
        if not argv:  # a comment continuing the line above
            continue
        extra = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):  # VAR=value command
            k, v = argv.pop(0).split("=", 1)
            extra[k] = f"{v}:{env[k]}" if k == "PYTHONPATH" else v  # the clone's shim stays
        prefix = _prefix(argv)
        how, what = LONG.get(prefix, ("as written", None)) if prefix else ("as written", None)
        if how == "skip" or (not have_data and any(" ".join(argv).startswith(p)
                                                   for p in NEEDS_DATA)):
            skipped.append(line)
            continue
        if how == "append":
            argv = argv + list(what)  # type: ignore[arg-type]
        elif how == "help":
            argv = argv + ["--help"]
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=clone, env={**env, **extra}, capture_output=True,
                           text=True, timeout=300, check=False)
        print(f"{time.monotonic() - t0:6.1f} s  {' '.join(argv)}")
        assert r.returncode == 0, f"{line}\n--- stdout\n{r.stdout[-1500:]}\n--- stderr\n" \
                                  f"{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, r.stderr
        ran.append(line)
    assert len(ran) >= 18, (ran, skipped)
    # what the commands were told to write is there, in the clone
    for out in ("decision.json", "problem.json", "apportion.db", "run.db", "schedule.json",
                "finetune.json", "bench-solve.json"):
        assert (clone / out).exists(), out


def test_readme_names_no_command_it_does_not_run() -> None:
    """Placeholders (``FILE``, ``a|b``, ``[--opt]``) would not run as written."""
    for line in readme_commands(pages_text(REPO)):
        code = line.split("#", 1)[0]
        assert not re.search(r"\[--|\bFILE\b|\bOUT\b|\bMODEL\b|\w\|\w|\.\.\.", code), line
