"""One error hierarchy for the whole product.

Every error carries the HTTP status the REST layer answers with and the exit code the CLI
ends with, so a handled failure becomes one clear line (CLI) or one JSON body (HTTP) without a
traceback. Build the message first and name the field or object and the fix in it.
"""

from __future__ import annotations

EXIT_RUNTIME_FAILURE = 1
"""Exit code for a failure while doing the work (the command was well formed)."""

EXIT_USAGE = 2
"""Exit code for a malformed command line or invalid operator input (same as Click)."""


class GridError(Exception):
    """Root of every error Grid raises on purpose.

    Attributes:
        http_status: status code for the REST layer.
        exit_code: process exit code for the CLI.
    """

    http_status: int = 500
    exit_code: int = EXIT_RUNTIME_FAILURE


class ValidationError(GridError, ValueError):
    """Input (a profile, a wire document, a flag) is invalid; the message names the field."""

    http_status = 400
    exit_code = EXIT_USAGE


class NotFoundError(GridError, LookupError):
    """A named object (model, host, plugin, file) does not exist."""

    http_status = 404


class ConflictError(GridError):
    """The request conflicts with existing state (different settings, another owner)."""

    http_status = 409


class SettingsConflictError(ConflictError):
    """The command asks for settings that differ from what already runs (for example a second
    ``grid test start`` with other capacities). The operator's input is what must change, so
    the CLI exits 2 (docs/operations.md, "Exit codes"); the message names the differing
    fields and how to stop what runs."""

    exit_code = EXIT_USAGE


class VersionConflictError(ConflictError):
    """A write named the version it read, and the stored object has changed since.

    Attributes:
        details: both sides of the conflict as plain data (the version the writer read and
            the current version with its content), so the operator can merge and retry.
    """

    def __init__(self, message: str, details: dict[str, object]) -> None:
        super().__init__(message)
        self.details = details


class AuthError(GridError):
    """A credential is missing, wrong, expired or scoped to another host."""

    http_status = 401


class ForbiddenError(GridError):
    """The credential is valid but does not authorize this action."""

    http_status = 403


class UnavailableError(GridError):
    """The service cannot do this right now; retrying later may succeed."""

    http_status = 503


class StateError(GridError):
    """Durable state could not be read or written safely."""

    http_status = 500


class PluginError(GridError):
    """A plugin is broken: it failed to import, or registered something invalid."""
