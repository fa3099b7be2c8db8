"""What the repository's modules import, read from their source with `ast` (function-level imports included).

The packaging tests follow these imports into the wheel; the layering tests check which of the repository's
top-level packages may import which.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_file(module: str) -> Path | None:
    """The source of the repository's `module` (a module file or a package's `__init__.py`); None if it has none."""
    path = REPO / module.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def modules_under(package: str) -> Iterator[tuple[str, Path]]:
    """(module name, source) of every module of the repository's top-level `package`."""
    for source in sorted((REPO / package).rglob("*.py")):
        yield ".".join(source.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"), source


def imported(module: str, source: Path) -> set[str]:
    """The modules `module` imports anywhere in its code (function-level imports too), absolute."""
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if module_file(f"{base}.{alias.name}")}
    return found
