"""Four real nights of the demo model through deploy/nightly.sh (search with last night's front first,
compare --format markdown, history), the third slowed for real; then `autotune history` on them: its table, its
chart in Chromium, and the verdicts agreeing with compare's. The four are each kind of night once: the first, one
compared with a night like it (not regressed), the slowed one (regressed), and the one after it (compared with a slow
night: not regressed). A fifth night like the second (there was one) showed nothing the others do not.

The third night's trials run a model slowed by 50 ms a forward pass (a fault injected by configuration): a
step of the demo at batch 1 takes a few milliseconds, so that night measures a tenth of the others' throughput or
less, whatever else runs on the machine. Busy processes beside a night slowed it by their share of its core, and
what else ran on that core moved the other nights by as much (seen: 60% under three other engineers' jobs), so a
slowed night sometimes was not the one marked. The nights are compared with a 70% threshold, which no night moved
by the machine's noise alone has crossed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.worker.demo_model import ensure_demo_model
from tests.browser import open_page
from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

NIGHTS = ("2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04")
SLOW_NIGHT = "2026-11-03"
PREFIX = "demo-cpu"
SMALLEST = f"--batch-size 1 --input-len 8 --output-len 4 {' '.join(BRIEF)}"
NIGHTLY = REPO / "deploy" / "nightly.sh"
ROWS_JS = "[...document.querySelectorAll('#nights tbody tr')].map(r => r.className + ' ' + r.cells[0].innerText)"


@dataclass(frozen=True)
class Nights:
    workdir: Path
    env: dict[str, str]
    statuses: dict[str, int]  # nightly.sh's exit status per night: 3 when it regressed against the night before
    summary: str  # what it appended to $GITHUB_STEP_SUMMARY


TOLERANCE = "--threshold 70%"  # a regression is a loss of more than 70% of the throughput
SLOWED = json.dumps({"batching=generate": {"phase": "measure", "kind": "slow_forward", "seconds": 0.05}})


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Nights:
    ensure_demo_model(cache_dir)
    workdir = tmp_path_factory.mktemp("nights")
    summary = workdir / "step-summary.md"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AUTOTUNE_CACHE_DIR": str(cache_dir),
        "AUTOTUNE_NIGHTLY_PREFIX": PREFIX,
        "AUTOTUNE_SEARCH": f"--model demo --gpu cpu --seed 0 {SMALLEST}",
        "AUTOTUNE_TRIALS": "3",
        "AUTOTUNE_TOLERANCES": TOLERANCE,
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    statuses = {}
    for night in NIGHTS:
        tonight = {**env, "AUTOTUNE_NIGHT": night} | ({"AUTOTUNE_INJECT_FAULTS": SLOWED} if night == SLOW_NIGHT else {})
        done = subprocess.run(["bash", str(NIGHTLY)], cwd=workdir, env=tonight, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        assert done.returncode in (0, 3), f"night {night}:\n{done.stdout}\n{done.stderr}"
        statuses[night] = done.returncode
    return Nights(workdir, env, statuses, summary.read_text())


def test_history_marks_the_slowed_night_as_compare_does(nights):
    args = ["history", "--studies", f"{PREFIX}-2026-11-*", *TOLERANCE.split()]
    shown = run_cli(args, nights.workdir, nights.env, timeout=300)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    print(shown.stdout)
    rows = {night: line for line in shown.stdout.splitlines() for night in NIGHTS if line.startswith(f"│ {night}")}
    assert list(rows) == list(NIGHTS), shown.stdout
    assert "first night" in rows[NIGHTS[0]]
    assert "REGRESSED throughput" in rows[SLOW_NIGHT], rows[SLOW_NIGHT]
    for night in NIGHTS[1:]:  # each night's verdict is the one compare gave that night (nightly.sh's status)
        assert ("REGRESSED" in rows[night]) == (nights.statuses[night] == 3), (night, rows[night], nights.statuses)
    assert "chart: reports/history.html" in shown.stdout


def test_the_chart_opens_in_chromium_with_the_regression_marked(nights, chromium):
    page = open_page(
        chromium,
        nights.workdir / "reports" / "history.html",
        evaluate={
            "regressed": "JSON.stringify(document.getElementById('history').data"
            ".filter(t => t.name.startsWith('regressed')).map(t => t.x))",
            "rows": f"{ROWS_JS}.join(';')",
        },
    )
    assert not page.errors and not page.requests and not page.dialogs, (page.errors, page.requests)
    assert page.plot_divs == page.plots == 1
    assert SLOW_NIGHT in page.texts["regressed"]
    rows = page.texts["rows"].split(";")
    assert len(rows) == len(NIGHTS) and f"regressed {SLOW_NIGHT}" in rows


def test_nightly_writes_the_ci_job_summary(nights):
    assert nights.summary.count(f"### autotune history: {len(NIGHTS)} nights") == 1  # the last night's table of all
    assert nights.summary.count("### autotune compare: ") == len(NIGHTS) - 1  # one per night after the first
    assert f"### autotune compare: {PREFIX}-2026-11-02 → {PREFIX}-{SLOW_NIGHT}: **REGRESSED**" in nights.summary
    for night in NIGHTS:
        assert (nights.workdir / "reports" / f"{PREFIX}-{night}.html").is_file()
