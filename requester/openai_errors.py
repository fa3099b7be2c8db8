"""The proxy's own answers, in the shape OpenAI clients parse: `{"error": {"message", "type", "param", "code"}}`.

The `openai` client raises the exception class of the status code and shows `message`, so every refusal
the proxy makes itself says why in words, and `code` says it for programs.
"""

import json

from aiohttp import web


def error_response(
    status: int, message: str, type_: str, code: str, param: str | None = None, retry_after_s: int | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=headers)
