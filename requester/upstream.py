"""The bound inference server as an HTTP peer: one client session, shared by forwarding, tokenizing and discovery.

The session never adds `Accept-Encoding` (a forwarded response must arrive encoded as its client
asked) and never decompresses, so bytes pass through unchanged. Only connecting is timed out: a
generation may legitimately take minutes.
"""

import json

import aiohttp

from .proxy_target import ProxyTarget


class UpstreamError(RuntimeError):
    """The server could not be reached, or dropped the connection."""


class Upstream:
    def __init__(self, target: ProxyTarget, dial_timeout: float) -> None:
        self._target = target
        self._dial_timeout = dial_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Made at first use, inside the running event loop."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._dial_timeout),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def host_port(self) -> str:
        target = self._target.target
        assert target is not None, "no target yet"
        return target.host_port

    def url(self, path_qs: str) -> str:
        return f"http://{self.host_port}{path_qs}"

    async def call(self, method: str, path_qs: str, at_most_s: float, body: object = None) -> tuple[int, bytes]:
        """A short request of the proxy's own (discovery, tokenizing): the status and the whole body.

        Raises UpstreamError when there is no answer within `at_most_s` seconds.
        """
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self.session.request(
                method, self.url(path_qs), data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=at_most_s)
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise UpstreamError(f"{method} {path_qs} on {self.host_port}: {err!r}") from err
