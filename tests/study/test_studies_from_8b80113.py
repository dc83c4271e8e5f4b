"""Studies written by main 8b80113 (tests/fixtures/studies-8b80113, made by its make.sh) opened by today's code:
`report`, `best`, `compare` and `history` show the figures 8b80113's own commands showed of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_main
from tests.fixtures.studies_8b80113.report_rows import table

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "studies_8b80113"
NIGHTS = ("demo-2026-11-25", "demo-2026-11-26")
STUDIES = (*NIGHTS, "capacity")
# The report's table columns that hold figures (today's table has more: the agreements, on the decoding path only).
FIGURE_COLUMNS = ("#", "outcome", "configuration", "tok/s", "ttft", "ms/token", "memory", "KL", "top-1", "ppl")


@pytest.fixture
def storage(tmp_path: Path) -> str:
    """A copy: opening a study may store things with it (a report as an artifact), the fixture stays as written."""
    shutil.copy(FIXTURE / "studies.db", tmp_path / "studies.db")
    return f"sqlite:///{tmp_path / 'studies.db'}"


def expected(name: str) -> dict:
    return json.loads((FIXTURE / name).read_text())


@pytest.mark.parametrize("study", STUDIES)
def test_best_picks_the_same_configuration_with_the_same_figures(study, storage, tmp_path, cli_env):
    done = run_main(["best", "--study", study, "--storage", storage, "--format", "json"], tmp_path, cli_env)
    assert done.returncode == 0, done.stderr
    now, then = json.loads(done.stdout), expected(f"best-{study}.json")
    assert now["config"] == then["config"] and now["trial"] == then["trial"]
    assert {name: now["metrics"][name] for name in then["metrics"]} == then["metrics"]


@pytest.mark.parametrize("study", STUDIES)
def test_the_report_shows_the_same_figures_and_says_they_came_from_the_prefill_path(study, storage, tmp_path, cli_env):
    page = tmp_path / "report.html"
    done = run_main(["report", "--study", study, "--storage", storage, "--report", str(page)], tmp_path, cli_env)
    assert done.returncode == 0, done.stderr
    now, then = table(page), expected(f"report-{study}.json")
    columns = [name for name in then["header"] if name in FIGURE_COLUMNS or name.startswith("capacity")]
    assert _cells(now, columns) == _cells(then, columns)
    assert "quality measured on the prefill path" in page.read_text()


def _cells(found: dict, columns: list[str]) -> list[list[str]]:
    at = [found["header"].index(name) for name in columns]
    return [[row[i] for i in at] for row in found["rows"]]


def test_compare_and_history_show_the_same_movements_levels_and_verdicts(storage, tmp_path, cli_env):
    done = run_main(["compare", *NIGHTS, "--storage", storage, "--format", "json"], tmp_path, cli_env)
    now, then = json.loads(done.stdout), expected("compare.json")
    assert done.returncode == (3 if then["regressed"] else 0), done.stderr
    assert now["regressed"] == then["regressed"] and now["quality_apart"] is None  # both of the prefill path
    for mine, theirs in zip(now["configurations"], then["configurations"], strict=True):
        assert (mine["config"], mine["before"], mine["after"]) == (theirs["config"], theirs["before"], theirs["after"])
        assert {name: mine["change"][name] for name in theirs["change"]} == theirs["change"]
    assert [_level(level) for level in now["levels"]] == [_level(level) for level in then["levels"]]
    report = tmp_path / "history.html"
    done = run_main(
        ["history", "--studies", ",".join(NIGHTS), "--storage", storage, "--report", str(report), "--format", "json"],
        tmp_path,
        cli_env,
    )
    nights, then_nights = json.loads(done.stdout)["nights"], expected("history.json")["nights"]
    shown = ("study", "best_throughput_tok_s", "lowest_peak_memory_gb", "lowest_kl", "regressed", "verdict")
    assert [{key: night[key] for key in shown} for night in nights] == [
        {key: night[key] for key in shown} for night in then_nights
    ]


def _level(level: dict) -> tuple:
    return level["config"], level["throughput_before"], level["best_after"], level["regressed_figure"]
