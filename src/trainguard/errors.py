"""Errors a user can cause. The CLI prints them as one line and exits non-zero, never a traceback."""


class UserError(Exception):
    """Bad input: an unknown run, a missing file, a malformed config. The message is the whole story."""

    exit_code = 2
