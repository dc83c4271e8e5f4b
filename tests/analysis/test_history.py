"""Nights side by side from stored studies with known figures: order, fronts, regressions (as compare), the
CLI's table, Markdown and JSON, and the study lookup by pattern."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from autotune import study as studies
from autotune.analysis.compare import DEFAULT_TOLERANCES, compare
from autotune.analysis.history import Night, history, in_night_order
from autotune.analysis.tolerances import GivenTolerances
from autotune.errors import UserError
from autotune.study import front_numbers
from tests import fakes
from tests.analysis.test_compare import nightly
from tests.conftest import run_cli, run_main

# night -> (speed, memory) against the first; the 4th is 30% slower (GPU tolerance 5%), the 5th 1.5x leaner-worse
NIGHTS = {"2026-11-01": (1.0, 1.0), "2026-11-02": (1.02, 1.0), "2026-11-03": (0.98, 1.0),
          "2026-11-04": (0.7, 1.0), "2026-11-05": (1.0, 1.5)}  # fmt: skip


@pytest.fixture
def series(tmp_path: Path) -> str:
    """Five nights in one SQLite storage (given out of order), plus an unrelated study."""
    url = ""
    for night in ("2026-11-03", "2026-11-01", "2026-11-05", "2026-11-02", "2026-11-04"):
        speed, memory = NIGHTS[night]
        _, url = nightly(tmp_path / "nights.db", f"demo-{night}", speed=speed, memory=memory)
    nightly(tmp_path / "nights.db", "other-study")
    return url


def nights_of(url: str, names: list[str]) -> list[Night]:
    stored = [studies.load_stored_study(url, name) for name in in_night_order(names)]
    return [Night(s.study_name, studies.records(s), front_numbers(s), "cuda") for s in stored]


def test_each_night_is_compared_with_the_one_before_as_compare_does(series):
    names = [name for name, _ in studies.studies_named(["demo-2026-11-*"], series)]
    nights = nights_of(series, names)
    found = history(nights)
    assert [night.label for night in found.nights] == sorted(NIGHTS)
    assert [night.regressed for night in found.nights] == [[], [], [], ["throughput"], ["memory"]]
    assert found.nights[0].verdict() == "first night"
    assert found.nights[3].verdict() == "REGRESSED throughput (-28.6% at worst)"  # 0.70 / 0.98
    assert found.nights[4].verdict() == "REGRESSED memory"
    for before, night in itertools.pairwise(nights):  # the same verdict as compare's
        expected = compare(before.records, before.front, night.records, night.front, DEFAULT_TOLERANCES["cuda"])
        summary = next(s for s in found.nights if s.study == night.study)
        assert summary.regressed == expected.regressed_figures()
    first = found.nights[0]
    assert first.best_throughput == 400 and first.lowest_memory_gb == 1.0 and first.lowest_kl == 0.0
    assert len(first.points) == 4 and first.points[0].throughput == 400  # fastest first
    assert found.nights[3].best_change(found.nights[2]) == pytest.approx(0.7 / 0.98 - 1)


def test_given_tolerances_replace_the_device_defaults(series):
    nights = nights_of(series, [f"demo-{night}" for night in NIGHTS])
    lenient = history(nights, GivenTolerances(throughput=0.5, memory=0.6))
    assert not lenient.regressed


def test_nights_are_ordered_by_the_date_in_their_names_else_as_given():
    assert in_night_order(["a-2026-11-03", "b-2026-11-01", "a-2026-10-30"]) == [
        "a-2026-10-30",
        "b-2026-11-01",
        "a-2026-11-03",
    ]
    assert in_night_order(["tuesday", "monday"]) == ["tuesday", "monday"]


def test_studies_named_by_pattern_list_or_default_storage(series, tmp_path: Path):
    found = studies.studies_named(["demo-2026-11-0[12]", "other-study"], series)
    assert found == [("demo-2026-11-01", series), ("demo-2026-11-02", series), ("other-study", series)]
    with pytest.raises(UserError, match="no study matches 'nothing-\\*'"):
        studies.studies_named(["nothing-*"], series)
    folder = tmp_path / "studies"
    folder.mkdir()
    fakes.new_study(folder / "solo-2026-11-01.db", name="solo-2026-11-01")
    assert studies.studies_named(["solo-*"], None, folder) == [
        ("solo-2026-11-01", f"sqlite:///{folder}/solo-2026-11-01.db")
    ]


def test_history_command_prints_the_table_markdown_and_json_and_writes_the_chart(series, tmp_path, cli_env):
    args = ["history", "--studies", "demo-2026-11-*", "--storage", series, "--report", str(tmp_path / "h.html")]
    table = run_cli(args, tmp_path, cli_env, timeout=120)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "2026-11-04" in table.stdout and "REGRESSED throughput" in table.stdout
    assert f"chart: {tmp_path / 'h.html'}" in table.stdout
    page = (tmp_path / "h.html").read_text()
    assert "regressed since the night before: 2026-11-04, 2026-11-05" in page and "Plotly.newPlot" in page

    markdown = run_cli([*args, "--format", "markdown"], tmp_path, cli_env, timeout=120)
    lines = markdown.stdout.splitlines()
    assert lines[0] == "### autotune history: 5 nights, regressed: 2026-11-04, 2026-11-05"
    assert lines[2].startswith("| night | study | trials |")
    assert len([line for line in lines if line.startswith("| 2026")]) == 5

    document = json.loads(run_cli([*args, "--format", "json"], tmp_path, cli_env, timeout=120).stdout)
    assert [night["study"] for night in document["nights"]] == [f"demo-{night}" for night in sorted(NIGHTS)]
    assert document["nights"][3]["regressed"] == ["throughput"]


def test_history_bad_input_is_one_line_and_exit_2(series, tmp_path, cli_env):
    missing = run_cli(["history", "--studies", "nope-*", "--storage", series], tmp_path, cli_env, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no study matches 'nope-*'" in missing.stderr
    bad = run_cli(["history", "--studies", "demo-*", "--storage", series, "--threshold", "x"], tmp_path, cli_env)
    assert bad.returncode == 2 and "--threshold 'x' is not a share" in bad.stderr
    assert not (tmp_path / "reports").exists()


def test_compare_as_markdown_for_a_ci_job_summary(series, tmp_path, cli_env):
    regressed = run_cli(["compare", "demo-2026-11-03", "demo-2026-11-04", "--storage", series, "--format", "markdown"],
                        tmp_path, cli_env, timeout=120)  # fmt: skip
    assert regressed.returncode == 3, regressed.stdout + regressed.stderr
    lines = regressed.stdout.splitlines()
    assert lines[0] == "### autotune compare: demo-2026-11-03 → demo-2026-11-04: **REGRESSED**: throughput"
    assert "| configuration | front | tok/s | ttft | memory | KL | tokens |" in lines
    assert any(line.startswith("- REGRESSED throughput: at ") for line in lines)
    fine = run_cli(["compare", "demo-2026-11-01", "demo-2026-11-02", "--storage", series, "--format", "markdown"],
                   tmp_path, cli_env, timeout=120)  # fmt: skip
    assert fine.returncode == 0
    assert fine.stdout.startswith("### autotune compare: demo-2026-11-01 → demo-2026-11-02: no regression")


def test_the_chart_page_escapes_what_a_study_holds(tmp_path: Path):
    from autotune.report.history import render_history

    name = f"odd-2026-11-01{fakes.SCRIPT}"
    study, url = fakes.new_study(tmp_path / "odd.db", name=name)
    fakes.add_complete(study, fakes.BASELINE, fakes.metrics(100, 1.0, 0.0, 1.0, 10.0))
    page = render_history(history(nights_of(url, [name])), fakes.SCRIPT)
    assert fakes.SCRIPT not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_nights_that_probed_capacities_show_it_and_a_night_with_another_slo_is_not_compared(tmp_path, cli_env):
    """Three capacity nights (tests/analysis/test_compare.py: capacity_nights): the second 20% slower at the same
    batches, the third searched within another SLO."""
    from autotune.report.history import history_figure
    from autotune.report.history_table import history_headings, night_cells
    from autotune.study.opened import Terms
    from tests.analysis.test_compare import capacity_nights

    url = capacity_nights(tmp_path / "nights.db")
    stored = [studies.load_stored_study(url, name) for name in ("night-1", "night-2", "night-3")]
    nights = [Night(s.study_name, studies.records(s), front_numbers(s), "cuda", Terms.of(studies.stored_settings(s)))
              for s in stored]  # fmt: skip
    found = history(nights)
    first, slower, other = found.nights
    assert [night.verdict() for night in found.nights] == [
        "first night",
        "REGRESSED throughput (-20.0% at worst)",
        "not compared: the earlier was searched within itl_p95<=6ms, the later within itl_p95<=4ms: "
        "figures at capacity do not compare",
    ]
    assert first.fastest_capacity.size == slower.fastest_capacity.size == 32  # the compiled stack's batch
    assert other.fastest_capacity.size < 32 and other.regressed == []
    assert history_headings(found)[-3:] == ("SLO", "capacity of the fastest", "vs the night before")
    per_gpu = first.fastest_capacity.tokens_per_s_per_device
    cost = first.fastest_capacity.cost_per_million_tokens
    assert night_cells(found, first)[-3:-1] == [
        "itl_p95<=6ms",
        f"batch 32: {per_gpu:.4g} generated tok/s end to end per GPU, ${cost:.4g} per 1M tokens",
    ]
    titles = [annotation.text for annotation in history_figure(found).layout.annotations]
    assert titles[-1] == "capacity (batch or load within the SLO)"
    args = ["history", "--studies", "night-*", "--storage", url, "--report", str(tmp_path / "h.html")]
    document = json.loads(run_main([*args, "--format", "json"], tmp_path, cli_env).stdout)
    assert [night["slo"] for night in document["nights"]] == [{"itl_p95_s": 0.006}] * 2 + [{"itl_p95_s": 0.004}]
    assert document["nights"][0]["fastest_at_capacity"]["capacity"] == 32
    assert document["nights"][0]["front"][0]["capacity"]["within"] == "within itl_p95<=6ms"


def test_nights_without_capacities_keep_their_columns(series):
    from autotune.report.history import history_figure
    from autotune.report.history_table import HEADINGS, history_headings

    found = history(nights_of(series, [f"demo-{night}" for night in NIGHTS]))
    assert history_headings(found) == HEADINGS and len(history_figure(found).layout.annotations) == 3
