"""The command line's exit codes (sysexits' 75 for "try again later")."""

EXIT_BUG = 1  # a failure no command handled (its traceback under -v)
EXIT_BAD_INPUT = 2  # the user's input: one line naming the file and the field
EXIT_BUSY = 75  # a busy store, a full disk: the same command may succeed later

__all__ = ["EXIT_BAD_INPUT", "EXIT_BUG", "EXIT_BUSY"]
