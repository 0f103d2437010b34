"""The command line, on top of everything: commands wired to the round, the store, the
replays and the runtime, and nothing more (the logic lives in the areas below).

Data goes to files and stdout; progress and logs go to stderr. ``apportion.cli:main`` is
the console script; ``python -m apportion.cli`` runs the same.
"""

from apportion.batch_gc import for_batch_work

# before the command line's modules load: importing them (about 700 modules, the libraries'
# included) is batch work too, and under the default thresholds the collector scans the
# growing heap again and again (25 ms of a 1,000-job solve-round's 0.75 s)
for_batch_work()

from apportion.cli.app import app, bench_app, cluster_app, export_app, main  # noqa: E402

__all__ = ["app", "bench_app", "cluster_app", "export_app", "main"]
