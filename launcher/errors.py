"""Errors the launcher's core raises; the HTTP layer maps each to one status code."""


class LauncherError(Exception):
    """A request the launcher refuses; `status` is the HTTP status the API answers with."""

    status = 500
    headers: dict[str, str] | None = None  # sent with the error answer

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(LauncherError):
    status = 400


class NotFound(LauncherError):
    status = 404


class Conflict(LauncherError):
    status = 409


class Gone(LauncherError):
    status = 410


class RangeNotSatisfiable(LauncherError):
    status = 416

    def __init__(self, message: str, total: int) -> None:
        super().__init__(message)
        self.total = total


class BackendError(LauncherError):
    """The instance's own server failed a request the launcher forwarded to it."""

    status = 502


class Unauthorized(LauncherError):
    status = 401
    headers = {"WWW-Authenticate": "Bearer"}


class Unprocessable(LauncherError):
    status = 422
