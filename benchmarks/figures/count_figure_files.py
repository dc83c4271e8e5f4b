"""How many files of the package a figure is named in by hand, outside the worker that measures it: the files a new
figure like it must be added to so that it is shown (trial lines, the front's table, the report, `best`), compared
(`compare`, `history`), constrained (`--constraint`) and forecast.

A figure counts as named in a file when the file holds its constant (GREEDY_AGREEMENT) or its name (greedy_agreement,
also inside a longer name such as best_greedy_agreement). The worker's modules measure figures, which a new figure
needs anyway, so they are left out; so is nothing else.

    python benchmarks/figures/count_figure_files.py            # the working tree's HEAD
    python benchmarks/figures/count_figure_files.py 3dfe771    # any commit
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The figures of issue 46 (agreements, added in 6e6dbf4 by editing 10 files of the package), and older ones.
FIGURES = ("greedy_agreement", "token_agreement", "top1_agreement", "ttft_s", "perplexity")
MEASURING = "autotune/worker/"


def constant_of(name: str) -> str:
    """The constant figures/metrics/ names a figure by: ttft_s -> TTFT, top1_agreement -> TOP1_AGREEMENT."""
    return re.sub(r"_S$", "", name.upper())


def files_naming(name: str, rev: str) -> list[str]:
    pattern = rf"\b{constant_of(name)}\b|{name}"
    found = subprocess.run(
        ["git", "grep", "-l", "-E", pattern, rev, "--", "autotune"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    paths = [line.split(":", 1)[1] for line in found]
    return sorted(path for path in paths if not path.startswith(MEASURING))


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True).stdout
    print(f"at {commit.strip()}: files of autotune/ (the worker left out) that name each figure by hand")
    for name in FIGURES:
        paths = files_naming(name, rev)
        print(f"{name}: {len(paths)} files: {', '.join(path.removeprefix('autotune/') for path in paths)}")


if __name__ == "__main__":
    main()
