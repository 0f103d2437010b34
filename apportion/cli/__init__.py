"""The command line, on top of everything: commands wired to the round, the store, the
replays and the runtime, and nothing more (the logic lives in the areas below).

Data goes to files and stdout; progress and logs go to stderr. ``apportion.cli:main`` is
the console script; ``python -m apportion.cli`` runs the same.
"""

from apportion.batch_gc import collector_paused

# the command line's modules (about 700 with the libraries') load with the collector off,
# and what they made is frozen after: it lives as long as the process (apportion.batch_gc)
with collector_paused(freeze_after=True):
    from apportion.cli.app import app, bench_app, cluster_app, export_app, main

__all__ = ["app", "bench_app", "cluster_app", "export_app", "main"]
