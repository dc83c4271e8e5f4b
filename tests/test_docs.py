"""The docs say what is there: every relative link of README.md and docs/*.md leads to a file of the repository and
every #anchor to a heading; every path they write in backticks exists; docs/design.md's module map names every
module of the package."""

from __future__ import annotations

import re
import subprocess
from functools import cache
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


# ------------------------------------------------------------------------------------------ paths in backticks

TICKED = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^```.*?^```", re.S | re.M)
FILE_NAME = re.compile(r"^[\w.-]+\.(py|md|yaml|yml|sh|sbatch|toml|sha256)$")
PLACEHOLDER = re.compile(r"[<>*{}$|]")
# What the tool, make or a run writes: named in the docs as outputs, absent from a fresh clone.
OUTPUTS = re.compile(r"^(studies/|reports/[^/]+\.html|\.cache/|\.venv/|OUT/|\.gpukit/)")


@cache
def tracked() -> tuple[frozenset[str], frozenset[str]]:
    """The files of a fresh clone (git's index), and their folders."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {str(Path(file).parents[i]) for file in files for i in range(len(Path(file).parents) - 1)}
    return frozenset(files), frozenset(folders)


def _roots() -> set[str]:
    files, _ = tracked()
    return {file.split("/")[0] for file in files} | {p.name for p in (REPO / "autotune").iterdir() if p.is_dir()}


def repository_path(text: str) -> str | None:
    """The repository path a backticked text names, or None when it names none (a command, a value, a URL).

    A path starts at the repository's root or at the package (`space/knobs/base.py`), or is a source file's bare
    name; placeholders (`reports/<study>.html`) and paths outside the repository (`../shared/...`) name none.
    """
    text = text.strip().removeprefix("./")
    if " " in text or "://" in text or PLACEHOLDER.search(text) or text.startswith(("/", "..", "-", "~")):
        return None
    if "/" in text:
        return text if text.split("/")[0] in _roots() else None
    return text if FILE_NAME.match(text) else None


def missing_paths(page: Path, text: str | None = None) -> list[str]:
    """The backticked paths of `text` (the page's own by default, code blocks left out) that a fresh clone lacks."""
    files, folders = tracked()
    names = {Path(file).name for file in files}
    missing = []
    for ticked in TICKED.findall(FENCED.sub("", page.read_text() if text is None else text)):
        path = repository_path(ticked)
        if path is None or OUTPUTS.match(path):
            continue
        candidates = {path.rstrip("/"), f"autotune/{path.rstrip('/')}"}
        found = candidates & (files | folders) if "/" in path else {path} & names
        if not found:
            missing.append(path)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_path_in_backticks_exists(page: Path) -> None:
    assert missing_paths(page) == []


def test_a_stale_path_is_found_and_what_is_no_path_is_left_alone() -> None:
    text = (
        "`autotune/space/knobs.py` `worker/workload.py` `gone.py` "  # stale: each a missing file
        "`autotune/space/knobs/base.py` `space/rules.py` `rules.py` `deploy/slurm/` "  # there
        "`reports/<study>.html` `studies/demo-cpu.db` `/health` `n/a` `pip install .` `../shared/notes/x.md`"  # no path
    )
    assert missing_paths(REPO / "docs" / "page.md", text) == [
        "autotune/space/knobs.py",
        "worker/workload.py",
        "gone.py",
    ]


# ------------------------------------------------------------------------------------------- the module map

MODULE = re.compile(r"[\w/]+\.py")


def module_map(design: str) -> str:
    """The code block under "## The modules" of docs/design.md."""
    section = design.split("## The modules", 1)[1]
    return section.split("```", 2)[1]


def unmapped_modules(package: Path, design: str) -> list[str]:
    """The modules of the package (paths under it, __init__.py left out) the module map does not name."""
    named = set(MODULE.findall(module_map(design)))
    modules = sorted(str(path.relative_to(package)) for path in package.rglob("*.py") if path.name != "__init__.py")
    return [module for module in modules if module not in named]


def test_the_module_map_names_every_module_of_the_package() -> None:
    assert unmapped_modules(REPO / "autotune", (REPO / "docs" / "design.md").read_text()) == []


def test_a_module_missing_from_the_map_is_found(tmp_path: Path) -> None:
    for module in ("search/loop.py", "search/planted.py", "worker/measurement/speed.py", "__main__.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    (tmp_path / "search" / "__init__.py").write_text("")
    design = "## The modules\n\n```\n  search/loop.py  the loop\n  worker/measurement/speed.py\n  __main__.py\n```\n"
    assert unmapped_modules(tmp_path, design) == ["search/planted.py"]
