"""Errors in OpenAI's shape, as vLLM sends them: `{"error": {"message", "type", "param", "code"}}`.

One envelope for every server that speaks the OpenAI API here: the transformers runtime, the
stand-in and the requester's proxy. The `openai` client raises the exception class of the status
and shows `message`, so every refusal says why in words.
"""

from http import HTTPStatus

from aiohttp import web
from pydantic import BaseModel


class ApiError(Exception):
    """Raised anywhere below a handler (or answered directly); the answer is `status` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        err_type: str | None = None,
        code: int | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        # vLLM names the type after the status (BadRequestError, NotFoundError) unless it says otherwise,
        # and its code is the status; OpenAI's own errors name both (`rate_limit_error`, `rate_limit_exceeded`).
        self.err_type = err_type or HTTPStatus(status).phrase.replace(" ", "") + "Error"
        self.code = status if code is None else code
        self.headers = headers or {}

    def payload(self) -> dict[str, dict[str, object]]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.payload(), status=self.status, headers=self.headers)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorBody(BaseModel):
    """The body of every `ApiError` (for OpenAPI documents)."""

    error: ErrorDetail
