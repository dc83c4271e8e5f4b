"""Studies written by main 3dfe771 (where issue 63 was read) and by main bc744e6 (where its redesign began), each in
tests/fixtures/studies_<commit> made by tests/fixtures/make_studies.sh, opened by today's code: `best` (table and
JSON), `report`, `compare` and `history` print what that commit's own commands printed of them, byte for byte (the
report without what changes from run to run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_main
from tests.fixtures.page_text import page_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MAINS = ("3dfe771", "bc744e6")
NIGHTS = ("demo-2026-11-25", "demo-2026-11-26")
STUDIES = (*NIGHTS, "capacity")


@pytest.fixture(params=MAINS)
def written(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """The fixture's folder, and its studies' storage: a copy, since opening a study may store things with it (a report
    as an artifact); the fixture stays as written."""
    folder = FIXTURES / f"studies_{request.param}"
    shutil.copy(folder / "studies.db", tmp_path / "studies.db")
    return folder, f"sqlite:///{tmp_path / 'studies.db'}"


@pytest.mark.parametrize("study", STUDIES)
def test_best_and_the_report_print_what_the_older_main_printed(study, written, tmp_path, bare_cli_env):
    folder, storage = written
    done = run_main(["best", "--study", study, "--storage", storage, "--format", "json"], tmp_path, bare_cli_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (folder / f"best-{study}.json").read_text()
    table = run_cli(["best", "--study", study, "--storage", storage], tmp_path, {**bare_cli_env, "COLUMNS": "160"})
    assert table.returncode == 0, table.stderr
    assert table.stdout == (folder / f"best-{study}.txt").read_text()
    page = tmp_path / "report.html"
    done = run_main(["report", "--study", study, "--storage", storage, "--report", str(page)], tmp_path, bare_cli_env)
    assert done.returncode == 0, done.stderr
    assert page_text(page.read_text()) + "\n" == (folder / f"report-{study}.txt").read_text()


def test_compare_and_history_print_what_the_older_main_printed(written, tmp_path, bare_cli_env):
    folder, storage = written
    done = run_main(["compare", *NIGHTS, "--storage", storage, "--format", "json"], tmp_path, bare_cli_env)
    then = (folder / "compare.json").read_text()
    assert done.returncode == (3 if json.loads(then)["regressed"] else 0), done.stderr
    assert done.stdout == then
    chart = tmp_path / "history.html"
    asked = ["history", "--studies", ",".join(NIGHTS), "--storage", storage, "--report", str(chart), "--format", "json"]
    done = run_main(asked, tmp_path, bare_cli_env)
    now, then = json.loads(done.stdout), json.loads((folder / "history.json").read_text())
    assert now["chart"] == str(chart)
    assert {**now, "chart": None} == {**then, "chart": None}
