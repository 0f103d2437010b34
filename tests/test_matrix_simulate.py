"""The matrix: every registered policy x every trace family the simulator loads x both
information modes, through the CLI door (``apportion simulate``), on a small slice of each.

Discovered, not listed: the policies from :func:`apportion.policies.registry.policy_names`
(plug-ins included), the traces from the catalogue (:data:`apportion.experiments.
trace_catalog.BUNDLED`, every bundled name grouped into its family, plus the generated
families). A new bundled trace must join a family here (the test says so); a new policy is
run everywhere without a line changed.

Each run replays a handful of jobs on a small cluster of the family's GPU types, with long
rounds (the slice ends in a few rounds) and ``--deterministic`` (apportion's solver budgets
in work). Nothing may end in an internal error: exit 0, every job finished or dropped
(refused as too large, or by a deadline policy's admission), or exit 2 naming why for a
combination unsupported by design (:data:`UNSUPPORTED`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.trace_catalog import BUNDLED
from typer.testing import CliRunner

from apportion.cli import app
from apportion.policies.registry import policy_names
from apportion.view import INFORMATION_MODES

pytestmark = pytest.mark.skipif(not tr.data_root().exists(), reason="shared data not present")
runner = CliRunner()

JOBS = 3
ROUND_S = "14400"  # four hours: a slice of long jobs (Gavel's, Philly's) ends in a few rounds

#: each family: how to recognise its bundled names, and a small cluster of its GPU types
#: (a YAML text, or a ``V:P:K`` / bundled cluster name)
FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "gavel": (("gavel-",), "4:4:4"),
    "elasticflow": (("elasticflow-",), ("name: a100\nnode_groups:\n  - {prefix: a, count: 1, "
                                        "gpu_type: A100-40GB, gpus_per_node: 8}\n")),
    "raw": (("philly", "itp"), "crius-testbed"),
    "crius": (("crius-",), "crius-testbed"),
    "morphling": (("morphling-",), ("name: a800\nnode_groups:\n  - {prefix: m, count: 2, "
                                    "gpu_type: A800-80GB, gpus_per_node: 8}\n")),
    "finetune": (("fm-",), "8:0:0"),
    "pollux": (("pollux-",), "pollux-64"),
}
#: the generated families (no file): their trace argument and cluster
GENERATED = {"synthetic": ("synthetic:3", "crius-testbed"),
             "fm-generated": ("fm-generated:3", "8:0:0")}
#: (policy, family) combinations refused by design with exit 2, and the words saying why:
#: YMIR's Task2Vec gains need each task's samples, which the shared data does not ship
UNSUPPORTED: dict[tuple[str, str], str] = {
    (p, fam): "task data" for p in ("ymir-task2vec", "apportion-task2vec")
    for fam in ("finetune", "fm-generated")}


def family_of(name: str) -> str:
    for fam, (prefixes, _) in FAMILIES.items():
        if name.startswith(prefixes):
            return fam
    raise AssertionError(f"bundled trace {name!r} belongs to no family of the matrix: add it")


def test_every_bundled_trace_has_a_family() -> None:
    for name in BUNDLED:
        family_of(name)
    assert set(map(family_of, BUNDLED)) == set(FAMILIES)


def representatives() -> dict[str, str]:
    """One bundled trace per family (its first name in sorted order): the slice replayed."""
    out: dict[str, str] = {}
    for name in sorted(BUNDLED):
        out.setdefault(family_of(name), name)
    return out


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """family -> (trace argument, cluster argument). Raw traces (Philly's 82,000 jobs) are
    cut to their first rows, so each run does not read and adapt the whole file."""
    root = tmp_path_factory.mktemp("matrix")
    out: dict[str, tuple[str, str]] = {}
    for fam, name in representatives().items():
        cluster = FAMILIES[fam][1]
        if "\n" in cluster:
            path = root / f"{fam}.yaml"
            path.write_text(cluster)
            cluster = str(path)
        trace = name
        if fam == "raw":
            src = tr.data_root() / BUNDLED[name]
            head = src.read_text().splitlines()[:400]
            trace = str(root / f"{name}-head{Path(BUNDLED[name]).suffix}")
            Path(trace).write_text("\n".join(head) + "\n")
        out[fam] = (trace, cluster)
    out.update(GENERATED)
    return out


CASES = [(p, f, m) for p in policy_names() for f in [*FAMILIES, *GENERATED]
         for m in INFORMATION_MODES]


@pytest.mark.parametrize("policy,family,information", CASES,
                         ids=[f"{p}-{f}-{m}" for p, f, m in CASES])
def test_policy_replays_trace_family(policy: str, family: str, information: str,
                                     slices: dict[str, tuple[str, str]], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # the shipped data's state, whatever the environment: no task samples
    monkeypatch.setenv("APPORTION_TASK_DATA", str(tmp_path / "no-task-data"))
    trace, cluster = slices[family]
    out = tmp_path / "s.json"
    args = ["simulate", "--trace", trace, "--cluster", cluster, "--policy", policy,
            "--max-jobs", str(JOBS), "--interval", ROUND_S, "--information", information,
            "--deterministic", "--json", str(out)]
    if family == "raw":
        args += ["--window-days", "1"]
    r = runner.invoke(app, args)
    why = UNSUPPORTED.get((policy, family))
    if why is not None:
        assert r.exit_code == 2 and why in r.output, r.output
        return
    assert r.exit_code == 0, f"{policy} on {trace} ({information}): {r.output[-2000:]}"
    s = json.loads(out.read_text())
    assert s["jobs"] == JOBS and s["finished"] + s["dropped"] == s["jobs"], s
    assert s["finished"] >= 1, s
