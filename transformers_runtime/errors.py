"""Client-visible errors in OpenAI's shape, as vLLM sends them: `{"error": {"message", "type", "param", "code"}}`."""

from http import HTTPStatus

from aiohttp import web


class ApiError(Exception):
    """Raised anywhere below a handler; the app answers with `status` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        err_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        # vLLM names the type after the status (BadRequestError, NotFoundError) unless it says otherwise.
        self.err_type = err_type or HTTPStatus(status).phrase.replace(" ", "") + "Error"
        self.headers = headers or {}

    def payload(self) -> dict[str, dict[str, object]]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}

    def response(self) -> web.Response:
        return web.json_response(self.payload(), status=self.status, headers=self.headers)
