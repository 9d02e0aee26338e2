"""The one user-facing error type.

Expected failures raise :class:`SoError` with a message that says what to do next;
the top-level handler in :mod:`sono.cli.main` prints it on one line and exits with
``exit_code``.
"""

from __future__ import annotations


class SoError(Exception):
    """A failure the user can act on. ``str(err)`` is the one line we print."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(SoError):
    """A config file, env var or flag is invalid."""
