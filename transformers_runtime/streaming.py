"""Server-sent events the way OpenAI (and vLLM) stream: `data: <json>` per chunk, `data: [DONE]` last."""

import json

from aiohttp import web
from pydantic import BaseModel

from api.openai_errors import ApiError


class SseStream:
    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response

    @classmethod
    async def open(cls, request: web.Request) -> "SseStream":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        return cls(response)

    async def send(self, chunk: BaseModel) -> None:
        await self._write(chunk.model_dump_json())

    async def send_error(self, error: ApiError) -> None:
        """After the 200 went out, an error can only travel as an event (vLLM sends it the same way)."""
        await self._write(json.dumps(error.payload()))

    async def close(self) -> web.StreamResponse:
        await self._write("[DONE]")
        await self.response.write_eof()
        return self.response

    async def _write(self, data: str) -> None:
        await self.response.write(f"data: {data}\n\n".encode())
