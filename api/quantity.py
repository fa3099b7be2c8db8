"""Kubernetes resource quantities (`resource.Quantity`: "1Gi", "500m", "2", "1e3") as an exact, ordered type.

No maintained Python library parses quantities on its own (the official `kubernetes` client carries a
parser, but it is a second full client just for one function), so the grammar of apimachinery's
`ParseQuantity` is implemented here, exactly: the value is a `Fraction`, never a float.
"""

import math
import re
from fractions import Fraction
from functools import total_ordering
from typing import Annotated, Any, Final

from pydantic import AfterValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

_NUMBER: Final = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# Exponents are integers: apimachinery parses them with strconv.ParseInt.
_SUFFIX: Final = r"([KMGTPE]i|[eE][+-]?[0-9]+|[numkMGTPE])?"
_SIGNED: Final = re.compile(rf"([+-]?){_NUMBER}{_SUFFIX}")
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_NAMES: Final = {0: "", **{power: name for name, power in _BINARY.items()}}
_DECIMAL_NAMES: Final = {power: name for name, power in _DECIMAL.items()}


def _pattern(signs: str) -> str:
    """The quantity grammar as an RE2/ECMA-compatible pattern (for CRD schemas), with the allowed signs."""
    return rf"^[{signs}]?{_NUMBER}{_SUFFIX}$".replace("(?:", "(")


def _int_or_string(pattern: str) -> dict[str, Any]:
    """How Kubernetes schemas spell a quantity: an integer or a string, the string matching the grammar."""
    return {"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": pattern, "x-kubernetes-int-or-string": True}


QUANTITY_SCHEMA: Final = _int_or_string(_pattern("+-"))
# Integers are checked by `minimum`, strings by a pattern without a minus sign.
NON_NEGATIVE_QUANTITY_SCHEMA: Final = {**_int_or_string(_pattern("+")), "minimum": 0}
# No resource is that large or small; the bound keeps "1e999999999" from costing seconds of arithmetic.
_MAX_EXPONENT: Final = 1000


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; ValueError names the bad input."""
    match = _SIGNED.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (examples: 2, 500m, 1.5Gi, 1e3)")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    value = Fraction(number)
    if suffix in _BINARY:
        value *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{text!r}: exponent beyond ±{_MAX_EXPONENT}")
        value *= Fraction(10) ** exponent
    return -value if sign == "-" else value


def _strip(value: int, base: int) -> tuple[int, int]:
    """`value` without its factors of `base`, and how many there were (0 stays 0)."""
    times = 0
    while value and value % base == 0:
        value //= base
        times += 1
    return value, times


def _kept_as_written(text: str) -> bool:
    """Whether `ParseQuantity` keeps `text` itself for writing back: when it parses on its int64 fast path and is
    already in a canonical shape (so "+5", "007" and "1E6" stay as written, where "1.000" becomes "1")."""
    if text == "0":
        return True
    match = _SIGNED.fullmatch(text)
    if match is None:
        return False
    whole, _, fraction = match.group(2).partition(".")
    digits, suffix = (whole.lstrip("0") or "0") + fraction, match.group(3) or ""
    if suffix in _BINARY:
        exponent = _BINARY[suffix]
        fits = not fraction and 15 - len(digits) - exponent * 3 // 10 - 1 >= 0
        return fits and int(digits) & 0x07 != 0
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    scale = exponent - len(fraction)
    fits = 18 - len(digits) >= 0 and scale >= -9
    return fits and scale % 3 == 0 and not digits.endswith("000") and digits[0] != "0"


def canonical_quantity(text: str) -> str:
    """The quantity as apimachinery writes it back (`Quantity.MarshalJSON`): "1000m" is "1", "1024Mi" "1Gi", "0.5"
    "500m". The value is rounded away from zero to a whole nano, as `ParseQuantity` rounds it; the format of the
    suffix is kept (binary, decimal or exponent), but a binary one falls back to decimal below 1Ki or for a fraction.
    """
    value = parse_quantity(text)
    if _kept_as_written(text):
        return text
    if value == 0:
        return "0"
    suffix = _SIGNED.fullmatch(text).group(3) or ""  # type: ignore[union-attr]  # parse_quantity matched it
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    nanos = math.ceil(magnitude * 10**9)
    if suffix in _BINARY and magnitude >= 1024 and nanos % 10**9 == 0:
        number, times = _strip(nanos // 10**9, 1024)
        return f"{sign}{number}{_BINARY_NAMES.get(times * 10, '')}"
    number, exponent = _strip(nanos, 10)
    exponent -= 9
    number *= 10 ** (exponent % 3)
    exponent -= exponent % 3
    if suffix[:1] in ("e", "E"):
        return f"{sign}{number}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{number}{_DECIMAL_NAMES.get(exponent, '')}"


@total_ordering
class Quantity:
    """A quantity compared by value ("1Ki" == 1024) that serializes back as it was written.

    Accepts what a Kubernetes JSON object holds: an integer or a quantity string (not floats, which the
    CRD schemas reject too).
    """

    __slots__ = ("_raw", "_value")

    def __init__(self, raw: "str | int | Quantity") -> None:
        if isinstance(raw, Quantity):
            raw = raw.raw
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise TypeError(f"a quantity is an integer or a string, not {raw!r}")
        self._raw: str | int = raw
        self._value = Fraction(raw) if isinstance(raw, int) else parse_quantity(raw)

    @property
    def raw(self) -> str | int:
        return self._raw

    @property
    def value(self) -> Fraction:
        return self._value

    def __int__(self) -> int:
        """Rounded up, as apimachinery's Quantity.Value() does (so "1.5" bytes is 2)."""
        return math.ceil(self._value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self._value == other._value
        if isinstance(other, int | Fraction) and not isinstance(other, bool):
            return self._value == other
        return NotImplemented

    def __lt__(self, other: "Quantity | int | Fraction") -> bool:
        return self._value < (other._value if isinstance(other, Quantity) else other)

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"Quantity({self._raw!r})"

    def __str__(self) -> str:
        return str(self._raw)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[Any], handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(value: Any) -> Quantity:
            try:
                return cls(value)
            except TypeError as error:
                raise ValueError(str(error)) from None

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(lambda q: q.raw)
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(QUANTITY_SCHEMA)


def _non_negative(quantity: Quantity) -> Quantity:
    if quantity.value < 0:
        raise ValueError(f"{quantity.raw!r} is negative")
    return quantity


NonNegativeQuantity = Annotated[Quantity, AfterValidator(_non_negative), WithJsonSchema(NON_NEGATIVE_QUANTITY_SCHEMA)]
