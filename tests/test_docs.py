"""The user documentation: every relative link and anchor resolves, the adoption docs exist and the README links
them, and no page speaks in the design's extension codes (E1-E17) instead of saying what a feature does."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", REPO / "CHANGELOG.md", REPO / "charts" / "dualpods" / "README.md",
                *(REPO / "docs").glob("*.md")])  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists() or (anchor and destination.suffix == ".md" and anchor not in anchors(destination)):
            broken.append(target)
    assert not broken, broken


def test_the_adoption_docs_exist_and_the_readme_links_them() -> None:
    readme = (REPO / "README.md").read_text()
    for name in ("LICENSE", "CHANGELOG.md", "docs/install.md", "docs/upgrade.md", "docs/security.md",
                 "docs/operations.md", "docs/fma-compatibility.md", "config/examples"):  # fmt: skip
        assert (REPO / name).exists(), name
        assert f"]({name}" in readme, f"README does not link {name}"
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert "install.md#supported-versions" in readme


@pytest.mark.parametrize("page", [*PAGES, REPO / "charts" / "dualpods" / "values.yaml"], ids=lambda p: p.name)
def test_user_docs_name_features_not_design_codes(page: Path) -> None:
    codes = re.findall(r"\bE(?:1[0-7]|[1-9])\b", page.read_text())
    assert not codes or page.name == "CHANGELOG.md", codes
