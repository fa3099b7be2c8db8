"""Client errors in vLLM's OpenAI shape: `{"error": {"message", "type", "param", "code"}}`."""

from http import HTTPStatus

from aiohttp import web


class ApiError(Exception):
    """Raised by a handler; the app answers it with the status and body vLLM would send."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> web.Response:
        err_type = HTTPStatus(self.status).phrase.replace(" ", "") + "Error"  # e.g. NotFoundError
        error = {"message": self.message, "type": err_type, "param": self.param, "code": self.status}
        return web.json_response({"error": error}, status=self.status)
