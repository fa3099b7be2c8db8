"""No test bounds wall-clock time below 1 s (issue 47): such a bound holds on a quiet machine and fails on a busy
one. A test about logic in time runs on a fake clock (`@pytest.mark.looptime`, for a test or its module); one that
needs real time bounds it at 1 s or more, with its margin beside it (docs/reliability.md).

What is looked for, in the source of tests/: an upper bound written as a literal below 1 s on
- a difference of clock readings (`time.monotonic()`, `time.time()`, `time.perf_counter()`, `loop.time()`), or a
  name assigned one in the same function: `time.monotonic() - started < 0.5`, `elapsed <= 0.2`;
- a wait: `asyncio.timeout(0.5)`, `asyncio.wait_for(x, 0.5)`, `wait_for(..., within=0.5)`.
A lower bound (`elapsed >= 0.2`) is left alone: a busy machine only makes it truer. A bound named by a constant
is not followed: this catches what is written inline, not every bound there is.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
CLOCKS = {("time", "monotonic"), ("time", "time"), ("time", "perf_counter")}
UPPER = (ast.Lt, ast.LtE)


def _is_clock(node: ast.expr) -> bool:
    """`time.monotonic()` and the like, or `<something>.time()` (an event loop's)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    owner = node.func.value
    return node.func.attr == "time" or (isinstance(owner, ast.Name) and (owner.id, node.func.attr) in CLOCKS)


def _is_interval(node: ast.expr, intervals: set[str]) -> bool:
    """A clock reading minus something, or a name assigned one."""
    if isinstance(node, ast.Name):
        return node.id in intervals
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_clock(node.left)


def _short(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and 0 < node.value < 1


def _is_looptime(decorators: list[ast.expr]) -> bool:
    return any("looptime" in ast.unparse(decorator) for decorator in decorators)


def _short_waits(call: ast.Call) -> bool:
    name = ast.unparse(call.func)
    if name == "asyncio.timeout":
        return _short(call.args[0] if call.args else None)
    if name == "asyncio.wait_for":
        return len(call.args) > 1 and _short(call.args[1])
    return any(keyword.arg == "within" and _short(keyword.value) for keyword in call.keywords)


def _function_bounds(function: ast.AsyncFunctionDef | ast.FunctionDef) -> Iterator[ast.AST]:
    intervals = {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and _is_interval(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(function):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
                if isinstance(op, UPPER) and _is_interval(left, intervals) and _short(right):
                    yield node
        elif isinstance(node, ast.Call) and _short_waits(node):
            yield node


def short_wall_clock_bounds(source: str) -> list[int]:
    """The lines of `source` that bound wall-clock time below 1 s outside a looptime test or module."""
    tree = ast.parse(source)
    marks = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Assign)]
    if any(mark.startswith("pytestmark =") and "looptime" in mark for mark in marks):
        return []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)]
    return sorted(
        {
            getattr(bound, "lineno", 0)
            for function in functions
            if not _is_looptime(function.decorator_list)
            for bound in _function_bounds(function)
        }
    )


def test_no_test_bounds_wall_clock_time_below_a_second() -> None:
    found = {
        path.name: lines for path in sorted(TESTS.glob("*.py")) if (lines := short_wall_clock_bounds(path.read_text()))
    }
    assert found == {}, "wall-clock bounds below 1 s (put the test on looptime, or bound it at 1 s or more)"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("def t():\n    started = time.monotonic()\n    assert time.monotonic() - started < 0.5\n", [3]),
        ("async def t():\n    took = loop.time() - s\n    assert 0 < took <= 0.2\n", [3]),
        ("async def t():\n    async with asyncio.timeout(0.3):\n        pass\n", [2]),
        ("async def t():\n    await asyncio.wait_for(x, 0.5)\n    await wait_for(f, within=0.1)\n", [2, 3]),
        # What is left alone: lower bounds, a second or more, a bound by a constant, looptime.
        ("def t():\n    assert time.monotonic() - started >= 0.2\n    assert time.time() - s < 1.0\n", []),
        ("async def t():\n    async with asyncio.timeout(BOUND_S):\n        pass\n", []),
        ("@pytest.mark.looptime\nasync def t():\n    await asyncio.wait_for(x, 0.5)\n", []),
        ("pytestmark = pytest.mark.looptime\nasync def t():\n    await asyncio.wait_for(x, 0.5)\n", []),
    ],
)
def test_the_scan_finds_short_upper_bounds_only(source: str, lines: list[int]) -> None:
    assert short_wall_clock_bounds(source) == lines
