"""The time bound of the requester's TokenReview: the API server's answer, not the client's own start-up.

e2e/test_requester_auth.py checks the answers against a real API server; here a `SlowReviews` API stands in
for it, because how long its parts take (making the client, answering) cannot be set on a real one.
"""

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from api.requester import SpiErrorReason
from requester import spi_auth
from requester.spi_auth import Refusal, TokenReviewAuth, TrustedControllers

# The event loop's clock is a fake one that jumps to the next timer when nothing is ready (looptime): the bound and
# the fake API server's delays below are exact loop seconds, whatever else the machine is doing.
pytestmark = pytest.mark.looptime

AUDIENCE = "dualpods-requester:ns:req"
BOUND_S = 0.2  # REVIEW_TIMEOUT_S here, so that each test takes a fraction of a second


class SlowReviews:
    """A fake ReviewApi (no API server): making its client takes `prepare_s`, each answer `answer_s`; it
    refuses every token, as the API server refuses a made-up one."""

    def __init__(self, prepare_s: float, answer_s: float) -> None:
        self.prepare_s, self.answer_s = prepare_s, answer_s
        self.prepared = asyncio.Event()
        self._making = asyncio.Lock()

    async def prepare(self) -> None:
        async with self._making:
            if not self.prepared.is_set():
                await asyncio.sleep(self.prepare_s)
                self.prepared.set()

    async def review(self, token: str, audience: str) -> dict[str, Any]:
        await self.prepare()
        await asyncio.sleep(self.answer_s)
        return {"authenticated": False, "error": "invalid bearer token"}

    async def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spi_auth, "REVIEW_TIMEOUT_S", BOUND_S)


def auth(api: SlowReviews) -> TokenReviewAuth:
    return TokenReviewAuth(AUDIENCE, TrustedControllers("fma-controllers", "ns"), api)


async def made_up_call(guard: TokenReviewAuth) -> Refusal | None:
    request = make_mocked_request("POST", "/v1/become-ready", headers={"Authorization": "Bearer made-up"})
    return await guard.check(request)


async def test_a_first_call_while_the_client_is_still_made_gets_the_api_servers_answer() -> None:
    api = SlowReviews(prepare_s=3 * BOUND_S, answer_s=0.0)
    guard = auth(api)
    warming = asyncio.create_task(guard.warm())  # as the server does once it listens
    refusal = await made_up_call(guard)
    await warming
    assert refusal is not None
    assert (refusal.status, refusal.reason) == (401, SpiErrorReason.UNAUTHENTICATED)
    assert "not valid for" in refusal.detail


async def test_an_api_server_slower_than_the_bound_is_cannot_verify() -> None:
    guard = auth(SlowReviews(prepare_s=0.0, answer_s=3 * BOUND_S))
    refusal = await made_up_call(guard)
    assert refusal is not None
    assert (refusal.status, refusal.reason) == (401, SpiErrorReason.CANNOT_VERIFY)
    assert f"did not answer a TokenReview within {BOUND_S:g} s" in refusal.detail
