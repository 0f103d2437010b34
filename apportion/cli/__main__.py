"""``python -m apportion.cli``: the same command line as the ``apportion`` script."""

from apportion.cli.app import main

main()
