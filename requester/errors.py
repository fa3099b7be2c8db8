"""Error answers of the SPI and probes servers: JSON `SpiError`s, `detail` in words and a `reason` to switch on."""

from aiohttp import web

from api.requester import SpiError, SpiErrorReason

_REASONS = {404: SpiErrorReason.NOT_FOUND, 405: SpiErrorReason.METHOD_NOT_ALLOWED, 413: SpiErrorReason.BODY_TOO_LARGE}


def spi_error(
    status: int, detail: str, headers: dict[str, str] | None = None, reason: SpiErrorReason | None = None
) -> web.Response:
    """An `SpiError` answer; the reason follows from the status unless given."""
    if reason is None:
        reason = _REASONS.get(status) or (SpiErrorReason.INTERNAL if status >= 500 else SpiErrorReason.INVALID_BODY)
    body = SpiError(detail=detail, reason=reason).model_dump_json()
    return web.Response(text=body, status=status, content_type="application/json", headers=headers)
