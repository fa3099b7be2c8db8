"""pydantic's complaints in words for a 400: where the first problem is, what is wrong, and the value given."""

from pydantic import ValidationError


def first_problem(error: ValidationError) -> tuple[str, str]:
    """(`where`, message): `where` is the dotted location (empty for the body itself); the message names the
    value unless it already does or the value is a whole object."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    given = first.get("input")
    shown = "" if isinstance(given, dict) or f"{given!r}" in message else f" (got {given!r:.80})"
    return where, message + shown


def validation_message(error: ValidationError) -> str:
    where, message = first_problem(error)
    return f"{where}: {message}" if where else message
