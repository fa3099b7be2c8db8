"""Errors the launcher's core raises; the HTTP layer maps each to its status code and error reason."""

from typing import Any

from api.launcher import ErrorReason


class LauncherError(Exception):
    """A request the launcher refuses; `status` is the HTTP status the API answers with, `reason` the
    machine-readable cause that goes beside the message (a class default, or given per raise)."""

    status = 500
    reason = ErrorReason.INTERNAL
    headers: dict[str, str] | None = None  # sent with the error answer

    def __init__(self, message: str, reason: ErrorReason | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason

    @property
    def detail(self) -> str | list[dict[str, Any]]:
        """The error body's `detail`."""
        return self.message


class BadRequest(LauncherError):
    status = 400
    reason = ErrorReason.INVALID_BODY


class InvalidOptions(BadRequest):
    """The model-server options, refused before anything is forked."""

    reason = ErrorReason.INVALID_OPTIONS


class UnknownGpu(BadRequest):
    reason = ErrorReason.UNKNOWN_GPU


class NotFound(LauncherError):
    status = 404
    reason = ErrorReason.NOT_FOUND


class Conflict(LauncherError):
    """409; the reason says which conflict (AlreadyExists, PortInUse, NotRunning, NotReady)."""

    status = 409

    def __init__(self, message: str, reason: ErrorReason) -> None:
        super().__init__(message, reason)


class Gone(LauncherError):
    status = 410
    reason = ErrorReason.REVISION_GONE


class PayloadTooLarge(LauncherError):
    status = 413
    reason = ErrorReason.INVALID_BODY


class RangeNotSatisfiable(LauncherError):
    status = 416

    def __init__(self, message: str, total: int) -> None:
        super().__init__(message, ErrorReason.INVALID_BODY)
        self.total = total


class BackendError(LauncherError):
    """The instance's own server failed a request the launcher forwarded to it, or died meanwhile."""

    status = 502
    reason = ErrorReason.BACKEND_FAILED


class WakeCheckFailed(LauncherError):
    """Woken, the instance no longer answered its recorded probe; it was killed (`launcher.wake_check`)."""

    status = 502
    reason = ErrorReason.WAKE_CHECK_FAILED


class BackendTimeout(LauncherError):
    """The instance did not answer a forwarded request in time (it hung, or stopped answering /health)."""

    status = 504
    reason = ErrorReason.BACKEND_TIMEOUT


class Unauthorized(LauncherError):
    status = 401
    reason = ErrorReason.UNAUTHORIZED
    headers = {"WWW-Authenticate": "Bearer"}


class Unprocessable(LauncherError):
    """A request that failed validation; its `detail` is FastAPI's list of issues (`api.launcher.ValidationIssue`),
    as FMA's launcher answers."""

    status = 422
    reason = ErrorReason.INVALID_BODY

    def __init__(self, issues: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, i['loc']))}: {i['msg']}" for i in issues))
        self.issues = issues

    @property
    def detail(self) -> list[dict[str, Any]]:
        return self.issues
