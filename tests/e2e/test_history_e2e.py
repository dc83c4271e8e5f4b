"""Five real nights of the demo model through deploy/nightly.sh (search with last night's front first,
compare --format markdown, history), the fourth slowed for real by CPU-bound processes beside it; then
`autotune history` on them: its table, its chart in Chromium, and the verdicts agreeing with compare's.

Every night runs on one core, and the slowed night's busy processes on that same core: the slowdown is then the
busy processes' share of that core. Other processes may share that core too (the suite runs in two processes, and
a busy machine runs more): a night slowed by them alone, even to a third of its speed, stays under the tolerance
the nights are compared with (70%), and the slowed night, with eleven busy processes beside it, is down to a
twelfth of its core's share, beyond it whatever ran beside the night before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.worker.demo_model import ensure_demo_model
from tests.browser import open_page
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

NIGHTS = ("2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04", "2026-11-05")
SLOW_NIGHT = "2026-11-04"
PREFIX = "demo-cpu"
SMALLEST = "--batch-size 1 --input-len 8 --output-len 4"
BUSY_LOOP = "while True: pass"
NIGHTLY = REPO / "deploy" / "nightly.sh"
ROWS_JS = "[...document.querySelectorAll('#nights tbody tr')].map(r => r.className + ' ' + r.cells[0].innerText)"


@dataclass(frozen=True)
class Nights:
    workdir: Path
    env: dict[str, str]
    statuses: dict[str, int]  # nightly.sh's exit status per night: 3 when it regressed against the night before
    summary: str  # what it appended to $GITHUB_STEP_SUMMARY


BUSY_PROCESSES = 11
TOLERANCE = "--threshold 70%"  # a regression is a loss of more than 70% of the throughput
CORE = min(os.sched_getaffinity(0))  # where every night and the busy processes run


def on_one_core() -> None:
    os.sched_setaffinity(0, {CORE})  # inherited by nightly.sh's search, its fork server and trial workers


@contextmanager
def busy_core() -> Iterator[None]:
    """CPU-bound processes on the nights' core: noisy neighbours that leave a trial a twelfth of its core."""
    # Each in a session of its own: with the kernel's autogroup scheduling a session shares a core as one, and the
    # trial workers each run in a session of their own (seen: eleven busy processes of one session slowed a night by
    # 40%, not to a twelfth).
    hogs = [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP], preexec_fn=on_one_core, start_new_session=True)
        for _ in range(BUSY_PROCESSES)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


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
        with busy_core() if night == SLOW_NIGHT else nullcontext():
            done = subprocess.run(["bash", str(NIGHTLY)], cwd=workdir, env={**env, "AUTOTUNE_NIGHT": night},
                                  capture_output=True, text=True, timeout=900, preexec_fn=on_one_core)  # fmt: skip
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
    assert nights.summary.count("### autotune history: 5 nights") == 1  # the last night's table of all five
    assert nights.summary.count("### autotune compare: ") == len(NIGHTS) - 1  # one per night after the first
    assert f"### autotune compare: {PREFIX}-2026-11-03 → {PREFIX}-{SLOW_NIGHT}: **REGRESSED**" in nights.summary
    for night in NIGHTS:
        assert (nights.workdir / "reports" / f"{PREFIX}-{night}.html").is_file()
