"""The conformance checks apportion runs on everything it registers, for a plug-in's author
to run too (scikit-learn's ``check_estimator`` is the model).

``check_policy(name_or_policy)`` runs a policy on an operator's queue through the round
pipeline; ``check_formulation(name)`` solves a registered formulation with the solver
chain and with its heuristic alone and checks every answer against the model's own rows;
``check_executor(name)`` a registered executor's declaration and an empty round of it built
by the registry (``check_executor(executor)``: an object's protocol alone);
``check_executor_behaviour`` what one does with real jobs; ``check_estimator(estimator)`` the
estimator protocol; ``check_trace_format(name)`` a trace format's detection, loading and
replay on its example. Each raises :class:`AssertionError` naming what failed, whatever
went wrong (a policy's invalid decision, a loader's error) and under ``python -O`` too
(:mod:`.failures`), and returns what it ran on, so a test may look further::

    from apportion.testing import check_policy
    check_policy("my-policy")          # a name registered through the entry point

The checks sit on the top floor beside the command line (they run policies, formulations,
replays and executors, so they import every area); each kind has a module of its own.
"""

from apportion.testing.estimators import check_estimator
from apportion.testing.executors import check_executor, check_executor_behaviour
from apportion.testing.fixtures import CLUSTER, queue
from apportion.testing.plugins import registered
from apportion.testing.policies import check_formulation, check_policy
from apportion.testing.traces import check_trace_format

__all__ = ["CLUSTER", "check_estimator", "check_executor", "check_executor_behaviour",
           "check_formulation", "check_policy", "check_trace_format", "queue", "registered"]
