"""Go's `sigs.k8s.io/yaml.Marshal` output, byte for byte, for a JSON object of strings, integers and booleans.

FMA's instance ID hashes the YAML that `sigs.k8s.io/yaml` (v1.6, over go-yaml v2.4) writes for an
InferenceServerConfig's `modelServerConfig`, so matching it takes go-yaml's emitter exactly. That library
writes the JSON through `encoding/json`, reads it back as YAML and writes that with go-yaml's defaults; this
module redoes the last step on the JSON value:

- mapping keys sorted by go-yaml's "natural" order (letters before other characters, runs of digits by value, so
  `A9` before `A10`);
- block style, two-space indent; a key longer than 128 bytes (or spanning lines) as a `? key` / `: value` pair;
- a string that would read back as something else (`"true"`, `"1"`, `"~"`, `"2024-01-02"`, `"1:20"`) double-quoted;
  one that plain style cannot carry (a leading `-` or `#`, `: `, ` #`, surrounding spaces, ...) single-quoted;
  one with a line break as a `|` literal block (with `-`/`+` chomping); one with a control character or one
  beyond U+FFFF double-quoted with escapes (`\\x01`, `\\U0001F600`); other Unicode raw (go-yaml's encoder turns
  the emitter's unicode mode on);
- lines folded at spaces once past column 80, continuation lines indented one step.

`sigs.k8s.io/yaml` reads its JSON back as YAML before writing it, and that is not always the identity: Go's JSON
leaves U+0085 (NEL) unescaped, and YAML reads it as a line break inside the quoted string, folding it (with the
spaces around it) into one space, or several into newlines; `marshal` applies that folding first. (A NEL in a
mapping key makes that read fail in Go, so FMA has no ID at all for such an InferenceServerConfig.)

Only what such objects need is here: no sequences, floats, anchors, tags or flow style except the empty mapping.
The rules are go-yaml's emitter (emitterc.go), its encoder (encode.go), resolver (resolve.go) and sorter
(sorter.go), read from their published sources.
"""

import datetime
import functools
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

BEST_WIDTH: Final = 80
BEST_INDENT: Final = 2
MAX_SIMPLE_KEY: Final = 128

PLAIN, SINGLE, DOUBLE, LITERAL = "plain", "single", "double", "literal"

_RESOLVED: Final = frozenset({
    "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
    "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
    "", "~", "null", "Null", "NULL",
    ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", "<<",
})  # fmt: skip
_HINTS: Final = frozenset("+-0123456789yYnNtTfFoO~.")
_YAML_FLOAT: Final = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_BASE60_FLOAT: Final = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_GO_INT: Final = re.compile(r"[+-]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_DATE: Final = r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})"
_TIME: Final = r"([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:[.,][0-9]+)?"
_TIMESTAMPS: Final = (
    re.compile(rf"{_DATE}[Tt]{_TIME}(Z|[+-][0-9]{{2}}:[0-9]{{2}})"),
    re.compile(rf"{_DATE} {_TIME}()"),
    re.compile(rf"{_DATE}()()()()"),
)


_LEADING_INDICATORS: Final = frozenset(bytes([c]) for c in b"#,[]{}&*!|>'\"%@`")
_NEL_RUN: Final = re.compile(r" *((?:\x85 *)+)")


class GoYAMLError(TypeError):
    """A value outside what this emitter writes (a list, a float, ...)."""


def _is_timestamp(text: str) -> bool:
    """go-yaml's parseTimestamp: a date, or a date and time, that Go's time.Parse accepts and validates."""
    for pattern in _TIMESTAMPS:
        if match := pattern.fullmatch(text):
            year, month, day, hour, minute, second, zone = match.groups()
            try:
                datetime.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0))
            except ValueError:
                return False
            return not zone or zone == "Z" or (int(zone[1:3]) < 24 and int(zone[4:6]) < 60)
    return False


def _go_float(text: str) -> bool:
    """Whether Go's strconv.ParseFloat reads `text` as a finite number in range (the decimal forms go-yaml tries)."""
    try:
        return abs(float(text)) != float("inf")
    except ValueError:
        return False


def resolves_to_string(text: str) -> bool:
    """Whether `text`, written plain, reads back as a string (go-yaml's resolve, and base-60 floats kept quoted)."""
    if not text or text[0] not in _HINTS:
        return text != ""
    if text in _RESOLVED:
        return False
    if text[0] == ".":
        return not (re.fullmatch(r"\.[0-9]+([eE][-+]?[0-9]+)?", text) and _go_float(text))
    if text[0] in "+-0123456789":
        if _is_timestamp(text):
            return False
        plain = text.replace("_", "")
        if _GO_INT.fullmatch(plain) and _int_in_range(plain):
            return False
        if _YAML_FLOAT.fullmatch(plain) and _go_float(plain):
            return False
        if (text[0] in "+-" or text[0].isdigit()) and ":" in text and _BASE60_FLOAT.fullmatch(text):
            return False
    return True


def _int_in_range(text: str) -> bool:
    """ParseInt(text, 0, 64), or ParseUint for an unsigned one: the value fits."""
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    base = {"x": 16, "o": 8, "b": 2}.get(body[1:2].lower(), 8) if len(body) > 1 and body[0] == "0" else 10
    digits = body[2:] if base in (16, 2) or body[1:2] in ("o", "O") else body
    value = sign * int(digits or "0", base)
    return -(2**63) <= value < 2**64 if text[0] not in "+-" else -(2**63) <= value < 2**63


def _natural_less(a: str, b: str) -> bool:
    """go-yaml's keyList.Less for two strings."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y:
            continue
        x_letter, y_letter = _letter(x), _letter(y)
        if x_letter and y_letter:
            return x < y
        if x_letter or y_letter:
            return y_letter
        a_number = b_number = 0
        if x == "0" or y == "0":
            j = i - 1
            while j >= 0 and _digit(a[j]):
                if a[j] != "0":
                    a_number = b_number = 1
                    break
                j -= 1
        a_end, a_number = _digits(a, i, a_number)
        b_end, b_number = _digits(b, i, b_number)
        if a_number != b_number:
            return a_number < b_number
        if a_end != b_end:
            return a_end < b_end
        return x < y
    return len(a) < len(b)


def _letter(char: str) -> bool:
    return unicodedata.category(char).startswith("L")


def _digit(char: str) -> bool:
    return unicodedata.category(char) == "Nd"


def _digits(text: str, start: int, number: int) -> tuple[int, int]:
    end = start
    while end < len(text) and _digit(text[end]):
        number = number * 10 + ord(text[end]) - ord("0")
        end += 1
    return end, number


def _compare(a: str, b: str) -> int:
    return -1 if _natural_less(a, b) else (1 if _natural_less(b, a) else 0)


class _Scalar:
    """go-yaml's analysis of one scalar (yaml_emitter_analyze_scalar): which styles may carry it."""

    def __init__(self, value: bytes) -> None:
        self.value = value
        self.multiline = False
        self.block_plain = self.single = True
        self.block = bool(value)
        if not value:
            return
        block_indicators = value[:3] in (b"---", b"...")
        special = leading_space = leading_break = trailing_space = trailing_break = False
        break_space = space_break = previous_space = previous_break = False
        preceded_by_whitespace = True
        i = 0
        while i < len(value):
            w = _width(value[i])
            followed_by_whitespace = i + w >= len(value) or value[i + w] in b" \t"
            c = value[i : i + 1]
            if i == 0:
                leading = c in _LEADING_INDICATORS or (c in b"?:-" and followed_by_whitespace)
                block_indicators = block_indicators or leading
            elif (c == b":" and followed_by_whitespace) or (c == b"#" and preceded_by_whitespace):
                block_indicators = True
            if not _printable(value, i):
                special = True
            if c == b" ":
                leading_space = leading_space or i == 0
                trailing_space = trailing_space or i + w == len(value)
                break_space = break_space or previous_break
                previous_space, previous_break = True, False
            elif _is_break(value, i):
                self.multiline = True
                leading_break = leading_break or i == 0
                trailing_break = trailing_break or i + w == len(value)
                space_break = space_break or previous_space
                previous_space, previous_break = False, True
            else:
                previous_space = previous_break = False
            preceded_by_whitespace = value[i] in b" \t\r\n\x00" or _is_break(value, i)
            i += w
        if leading_space or leading_break or trailing_space or trailing_break:
            self.block_plain = False
        if trailing_space:
            self.block = False
        if break_space:
            self.block_plain = self.single = False
        if space_break or special:
            self.block_plain = self.single = self.block = False
        if self.multiline or block_indicators:
            self.block_plain = False


def _width(byte: int) -> int:
    return 1 if byte < 0x80 else 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4


def _at(value: bytes, i: int) -> int:
    return value[i] if i < len(value) else 0


def _printable(value: bytes, i: int) -> bool:
    b, n1, n2 = value[i], _at(value, i + 1), _at(value, i + 2)
    return (
        b == 0x0A
        or 0x20 <= b <= 0x7E
        or (b == 0xC2 and n1 >= 0xA0)
        or 0xC2 < b < 0xED
        or (b == 0xED and n1 < 0xA0)
        or b == 0xEE
        or (b == 0xEF and not (n1 == 0xBB and n2 == 0xBF) and not (n1 == 0xBF and n2 in (0xBE, 0xBF)))
    )


def _is_break(value: bytes, i: int) -> bool:
    b, n1, n2 = value[i], _at(value, i + 1), _at(value, i + 2)
    return b in (0x0D, 0x0A) or (b == 0xC2 and n1 == 0x85) or (b == 0xE2 and n1 == 0x80 and n2 in (0xA8, 0xA9))


_DOUBLE_ESCAPES: Final = {
    0x00: "0", 0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r", 0x1B: "e",
    0x22: '"', 0x5C: "\\", 0x85: "N", 0xA0: "_", 0x2028: "L", 0x2029: "P",
}  # fmt: skip


class _Emitter:
    """The state of go-yaml's emitter that block mappings of scalars touch."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.column = 0
        self.indent = -1
        self.indents: list[int] = []
        self.whitespace = self.indention = True

    def put(self, text: str) -> None:
        self.out.append(text)
        self.column += len(text)

    def put_break(self) -> None:
        self.out.append("\n")
        self.column = 0

    def write_break(self, char: str) -> None:
        if char == "\n":
            self.put_break()
        else:
            self.out.append(char)
            self.column = 0

    def write_indent(self) -> None:
        indent = max(self.indent, 0)
        if not self.indention or self.column > indent or (self.column == indent and not self.whitespace):
            self.put_break()
        self.put(" " * (indent - self.column))
        self.whitespace = self.indention = True

    def write_indicator(self, indicator: str, need_whitespace: bool, is_whitespace: bool, is_indention: bool) -> None:
        if need_whitespace and not self.whitespace:
            self.put(" ")
        self.put(indicator)
        self.whitespace = is_whitespace
        self.indention = self.indention and is_indention

    def increase_indent(self, flow: bool) -> None:
        self.indents.append(self.indent)
        self.indent = (BEST_INDENT if flow else 0) if self.indent < 0 else self.indent + BEST_INDENT

    def mapping(self, value: Mapping[str, Any]) -> None:
        if not value:
            self.write_indicator("{", True, True, False)
            self.write_indicator("}", False, False, False)
            return
        self.increase_indent(flow=False)
        for key in sorted(value, key=functools.cmp_to_key(_compare)):
            if not isinstance(key, str):
                raise GoYAMLError(f"a mapping key is a string, not {key!r}")
            self.write_indent()
            text, style = _requested(key)
            analysis = _Scalar(text.encode())
            if not analysis.multiline and len(analysis.value) <= MAX_SIMPLE_KEY:
                self.scalar(text, style, analysis, simple_key=True)
                self.write_indicator(":", False, False, False)
            else:
                self.write_indicator("?", True, False, True)
                self.scalar(text, style, analysis, simple_key=False)
                self.write_indent()
                self.write_indicator(":", True, False, True)
            self.node(value[key])
        self.indent = self.indents.pop()

    def node(self, value: Any) -> None:
        if isinstance(value, Mapping):
            self.mapping(value)
            return
        text, style = _requested(value)
        self.scalar(text, style, _Scalar(text.encode()), simple_key=False)

    def scalar(self, text: str, style: str, analysis: _Scalar, simple_key: bool) -> None:
        """yaml_emitter_select_scalar_style and yaml_emitter_process_scalar."""
        if simple_key and analysis.multiline:
            style = DOUBLE
        if style == PLAIN and (not analysis.block_plain or (not text and simple_key)):
            style = SINGLE
        if style == SINGLE and not analysis.single:
            style = DOUBLE
        if style == LITERAL and (not analysis.block or simple_key):
            style = DOUBLE
        self.increase_indent(flow=True)
        value = analysis.value
        if style == PLAIN:
            self.plain(value, not simple_key)
        elif style == SINGLE:
            self.single_quoted(value, not simple_key)
        elif style == DOUBLE:
            self.double_quoted(value, not simple_key)
        else:
            self.literal(value)
        self.indent = self.indents.pop()

    def _chars(self, value: bytes) -> list[tuple[int, bytes]]:
        chars, i = [], 0
        while i < len(value):
            w = _width(value[i])
            chars.append((i, value[i : i + w]))
            i += w
        return chars

    def plain(self, value: bytes, allow_breaks: bool) -> None:
        if not self.whitespace:
            self.put(" ")
        self._folded(value, allow_breaks, quote=None)
        self.whitespace = self.indention = False

    def single_quoted(self, value: bytes, allow_breaks: bool) -> None:
        self.write_indicator("'", True, False, False)
        self._folded(value, allow_breaks, quote="'")
        self.write_indicator("'", False, False, False)
        self.whitespace = self.indention = False

    def _folded(self, value: bytes, allow_breaks: bool, quote: str | None) -> None:
        """The body of a plain or single-quoted scalar: folded at spaces past the width, breaks doubled."""
        spaces = breaks = False
        for i, char in self._chars(value):
            text = char.decode()
            if char == b" ":
                inner = quote is None or 0 < i < len(value) - 1
                if allow_breaks and not spaces and self.column > BEST_WIDTH and inner and _at(value, i + 1) != 0x20:
                    self.write_indent()
                else:
                    self.put(text)
                spaces = True
            elif _is_break(value, i):
                if not breaks and char == b"\n":
                    self.put_break()
                self.write_break(text)
                self.indention = breaks = True
            else:
                if breaks:
                    self.write_indent()
                if quote is not None and text == quote:
                    self.put(quote)
                self.put(text)
                self.indention = spaces = breaks = False

    def double_quoted(self, value: bytes, allow_breaks: bool) -> None:
        self.write_indicator('"', True, False, False)
        spaces = False
        bom = value[:3] == b"\xef\xbb\xbf"  # go-yaml tests for a BOM at the start, for every character
        for i, char in self._chars(value):
            code = ord(char.decode())
            if not _printable(value, i) or bom or _is_break(value, i) or char in (b'"', b"\\"):
                if code in _DOUBLE_ESCAPES:
                    self.put("\\" + _DOUBLE_ESCAPES[code])
                elif code <= 0xFF:
                    self.put(f"\\x{code:02X}")
                elif code <= 0xFFFF:
                    self.put(f"\\u{code:04X}")
                else:
                    self.put(f"\\U{code:08X}")
                spaces = False
            elif char == b" ":
                if allow_breaks and not spaces and self.column > BEST_WIDTH and 0 < i < len(value) - 1:
                    self.write_indent()
                    if _at(value, i + 1) == 0x20:
                        self.put("\\")
                else:
                    self.put(" ")
                spaces = True
            else:
                self.put(char.decode())
                spaces = False
        self.write_indicator('"', False, False, False)
        self.whitespace = self.indention = False

    def literal(self, value: bytes) -> None:
        self.write_indicator("|", True, False, False)
        if value[:1] == b" " or _is_break(value, 0):
            self.write_indicator(str(BEST_INDENT), False, False, False)
        last = len(value) - 1
        while value[last] & 0xC0 == 0x80:
            last -= 1
        chomp = ""
        if not _is_break(value, last):
            chomp = "-"
        elif last == 0:
            chomp = "+"
        else:
            before = last - 1
            while value[before] & 0xC0 == 0x80:
                before -= 1
            if _is_break(value, before):
                chomp = "+"
        if chomp:
            self.write_indicator(chomp, False, False, False)
        self.put_break()
        self.indention = self.whitespace = True
        breaks = True
        for i, char in self._chars(value):
            if _is_break(value, i):
                self.write_break(char.decode())
                self.indention = breaks = True
            else:
                if breaks:
                    self.write_indent()
                self.put(char.decode())
                self.indention = breaks = False


def _requested(value: Any) -> tuple[str, str]:
    """The text of a scalar and the style go-yaml's encoder asks for (encode.go's stringv, intv, boolv, nilv)."""
    if value is None:
        return "null", PLAIN
    if isinstance(value, bool):
        return ("true" if value else "false"), PLAIN
    if isinstance(value, int):
        return str(value), PLAIN
    if isinstance(value, str):
        if "\n" in value:
            return value, LITERAL
        return value, PLAIN if resolves_to_string(value) else DOUBLE
    raise GoYAMLError(f"goyaml writes mappings of strings, integers and booleans, not {type(value).__name__}")


def _fold_line_breaks(text: str) -> str:
    """How YAML reads a double-quoted JSON string with raw NELs: a run of them with the spaces around it becomes
    one space for one NEL, else a newline for each NEL but the first."""
    return _NEL_RUN.sub(lambda m: " " if m.group(1).count("\x85") == 1 else "\n" * (m.group(1).count("\x85") - 1), text)


def _as_read_back(value: Any) -> Any:
    if isinstance(value, str):
        return _fold_line_breaks(value)
    if isinstance(value, Mapping):
        return {_as_read_back(k): _as_read_back(v) for k, v in value.items()}
    return value


def marshal(value: Mapping[str, Any]) -> str:
    """`value` as `sigs.k8s.io/yaml.Marshal` writes the JSON object it stands for."""
    emitter = _Emitter()
    emitter.node(_as_read_back(value))
    emitter.write_indent()  # the document's end (go-yaml never writes "..." here: it clears open_ended first)
    return "".join(emitter.out)
