"""Every relative link of README.md and docs/*.md leads to a file of the repository, and every #anchor to a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings outside code blocks: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """The links of `text` (the page's own by default), read as written in `page`, that lead nowhere."""
    broken = []
    for target in LINK.findall(page.read_text() if text is None else text):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in linked.parents:
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_the_pages_are_found() -> None:
    assert {"README.md", "usage.md", "design.md"} <= {page.name for page in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found() -> None:
    text = "[gone](missing.md) [up](../../outside.md) [heading](usage.md#no-such-heading) [ok](usage.md#objectives)"
    assert broken_links(REPO / "docs" / "a-new-page.md", text) == [
        "missing.md: no such file in the repository",
        "../../outside.md: no such file in the repository",
        "usage.md#no-such-heading: no heading with that anchor",
    ]
