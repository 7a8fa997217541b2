"""User-facing errors: one message naming the culprit, exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input (config, flags, data, environment).

    The CLI prints the message on one line and exits with status 2; internal invariants use
    ``assert`` instead.
    """

    exit_status = 2
