"""The conformance checks (``apportion.testing``) fail one way, as docs/library.md promises:
an :class:`AssertionError` naming what failed, whatever went wrong (a policy's invalid
decision, an estimator that raises), and under ``python -O`` too (no bare ``assert``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
    from apportion.estimation.models.analytic import AnalyticEstimator
    from apportion.plans import ExecutionPlan
    from apportion.testing import check_estimator, check_policy

    REPORT = SolveReport("t", "feasible", None, None, None, 0.0, False)

    class Overbooks:
        """Places the first job on 64 GPUs of a 4-GPU node: the validator refuses it."""
        name = "overbooks"

        def decide(self, view):
            j = view.jobs[0].id
            return Decision([Allocation(j, "A40", 64, 1, ExecutionPlan(dp=64), {"a40-0": 64},
                                        1.0, Action.START)], [], REPORT)

    class Idles:
        """A valid decision that places nothing: every job waits."""
        name = "idles"

        def decide(self, view):
            return Decision([], [Pending(js.id, Reason.NO_CAPACITY) for js in view.jobs],
                            REPORT)

    class Raises(AnalyticEstimator):
        def fit(self, samples):
            raise ValueError("no samples I like")

    for name, run in (("overbooks", lambda: check_policy(Overbooks())),
                      ("idles", lambda: check_policy(Idles())),
                      ("raises", lambda: check_estimator(Raises()))):
        try:
            run()
        except AssertionError as exc:
            print(name, "AssertionError", exc)
        except BaseException as exc:
            print(name, "ESCAPED", type(exc).__name__, exc)
        else:
            print(name, "PASSED")
''')


def _run(tmp_path: Path, *flags: str) -> dict[str, str]:
    script = tmp_path / "checks.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, *flags, str(script)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines()}


def test_a_failed_check_is_an_assertion_error_naming_it(tmp_path: Path) -> None:
    for flags in ((), ("-O",)):  # -O strips bare asserts: a check must fail all the same
        out = _run(tmp_path, *flags)
        assert out["overbooks"].startswith("AssertionError"), (flags, out)
        assert "overbooks" in out["overbooks"] and "invalid decision" in out["overbooks"]
        assert out["idles"] == "AssertionError idles placed nothing on an empty cluster", out
        assert out["raises"] == ("AssertionError check_estimator(Raises): ValueError: no "
                                 "samples I like"), out
