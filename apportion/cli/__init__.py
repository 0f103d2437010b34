"""The command line, on top of everything: commands wired to the round, the store, the
replays and the runtime, and nothing more (the logic lives in the areas below).

Data goes to files and stdout; progress and logs go to stderr. ``apportion.cli:main`` is
the console script; ``python -m apportion.cli`` runs the same.
"""

from apportion.batch_gc import collector_paused

# the command line's front door (about 220 modules with the libraries'; a command's own
# module, and what it imports, load when it runs: apportion.cli.commands) loads with the
# collector off, and what it made is frozen after: it lives as long as the process
# (apportion.batch_gc). A command's module loads the same way.
with collector_paused(freeze_after=True):
    from apportion.cli.app import app, bench_app, cluster_app, export_app, main

__all__ = ["app", "bench_app", "cluster_app", "export_app", "main"]
