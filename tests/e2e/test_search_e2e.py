"""One real search on the demo model, on this CPU, through the command line; then a resume.

Every trial runs in its own worker process; the study is a real SQLite file; the report is opened in
a real headless browser.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from autotune.figures.constraints import parse_constraint
from autotune.study import TrialRecord, records, search_runs, stored_settings
from tests.conftest import DEMO_CONSTRAINT, DEMO_FAILING_TRIAL, DEMO_FAULT, DEMO_STUDY, DemoSearch, run_demo_search

pytestmark = pytest.mark.slow

STUDY = DEMO_STUDY


@pytest.fixture(scope="module")
def first_run(demo_search: DemoSearch):
    return demo_search.workdir, demo_search.completed, demo_search.records


@dataclass(frozen=True)
class Resumed:
    workdir: Path
    completed: subprocess.CompletedProcess
    before: list[TrialRecord]
    after: list[TrialRecord]
    study: optuna.Study


@pytest.fixture(scope="module")
def resumed(demo_search: DemoSearch, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """The same command run again, with no --constraint, on a copy of the first run's folder (study, trial files):
    the shared first run stays as it was, whatever order the tests run in."""
    workdir = tmp_path_factory.mktemp("resumed") / "search"
    shutil.copytree(demo_search.workdir, workdir)
    storage = f"sqlite:///{workdir}/studies/{STUDY}.db"
    before = records(optuna.load_study(study_name=STUDY, storage=storage))
    completed = run_demo_search(workdir, demo_search.env, "--trials", "2")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    study = optuna.load_study(study_name=STUDY, storage=storage)
    return Resumed(workdir, completed, before, records(study), study)


def launched(trial_records):
    return [record for record in trial_records if record.launched]


def test_search_prints_a_line_per_trial_the_front_and_the_report(first_run):
    _, completed, _ = first_run
    trial_lines = [line for line in completed.stdout.splitlines() if line.startswith("#")]
    assert len(trial_lines) == 8
    assert any("[reference" in line for line in trial_lines)
    assert "Pareto front of demo-cpu" in completed.stdout
    assert "report: reports/demo-cpu.html" in completed.stdout


def test_the_study_process_never_imports_torch(first_run):
    _, completed, _ = first_run
    assert "TORCH_IMPORTED_BY_STUDY_PROCESS False" in completed.stdout


def test_the_study_holds_eight_distinct_trials_each_in_its_own_process(first_run):
    _, _, trial_records = first_run
    runs = launched(trial_records)
    assert len(runs) == 8
    keys = [json.dumps(record.config, sort_keys=True) for record in runs]
    assert len(set(keys)) == len(keys), "a configuration was measured twice"
    pids = [record.pid for record in runs]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    complete = [record for record in runs if record.complete]
    assert len(complete) >= 4
    for record in complete:
        assert record.metrics["throughput_tok_s"] > 0
        assert record.metrics["peak_memory_gb"] > 0
        assert math.isfinite(record.metrics["kl_divergence"])
        if record.config["dtype"] != "float32":  # below the reference's precision: it diverges (a NaN is stored as 0)
            assert record.metrics["kl_divergence"] > 0, record.config
        assert 0 < record.metrics["top1_agreement"] <= 1
        # one batch size and no SLO: one shape measured, as before capacity probes existed
        assert record.capacity is None and "capacity" not in record.metrics and "meets_slo" not in record.metrics


def test_each_trial_stores_the_duration_the_budget_forecast_for_it_once_one_ended(demo_search: DemoSearch):
    """Beside what it took (duration_s): what the budget's check expected and allowed at most
    (strategy/durations.py)."""
    ran = [trial for trial in demo_search.study().trials if "duration_s" in trial.user_attrs]
    assert "forecast_s" not in ran[0].user_attrs  # nothing had ended: no scale
    for trial in ran[1:]:
        forecast = trial.user_attrs["forecast_s"]
        assert 0 < forecast["expected"] < forecast["at_most"]


def test_reference_and_baseline_come_first_and_the_reference_matches_itself(first_run):
    _, _, trial_records = first_run
    runs = launched(trial_records)
    assert "reference" in runs[0].roles and runs[0].config["dtype"] == "float32"
    assert "baseline" in runs[1].roles and runs[1].config["dtype"] == "bfloat16"  # the demo checkpoint's dtype
    assert runs[0].metrics["kl_divergence"] == pytest.approx(0, abs=1e-7)
    assert runs[0].metrics["top1_agreement"] == 1.0
    assert runs[1].metrics["kl_divergence"] > 0


def test_failed_trials_carry_a_reason_and_no_objective_values(first_run):
    workdir, _, trial_records = first_run
    database = sqlite3.connect(workdir / "studies" / f"{STUDY}.db")
    rows = database.execute(
        "SELECT t.number, COUNT(v.value) FROM trials t LEFT JOIN trial_values v ON v.trial_id = t.trial_id "
        "WHERE t.state = 'FAIL' GROUP BY t.number"
    ).fetchall()
    failed = [record for record in launched(trial_records) if record.state == "FAIL"]
    assert failed, "no trial failed, so nothing here would be checked"  # the fixture makes the last one fail
    assert sorted(number for number, _ in rows) == [record.number for record in failed]
    assert all(count == 0 for _, count in rows)
    for record in failed:
        assert record.outcome in {"oom", "timeout", "unsupported", "crashed", "error", "broken"}
        assert record.message and record.metrics == {}
    injected = launched(trial_records)[DEMO_FAILING_TRIAL]
    assert (injected.outcome, injected.phase) == (
        "error",
        DEMO_FAULT["phase"],
    ) and "injected failure" in injected.message


class _ExternalResources(HTMLParser):
    """Tags that would make the page fetch something: scripts, styles, images, frames with a URL."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith(("#", "data:", "javascript:")):
                self.found.append(f"<{tag} {name}={value}>")


def test_report_is_self_contained(first_run):
    workdir, _, _ = first_run
    html = (workdir / "reports" / f"{STUDY}.html").read_text()
    parser = _ExternalResources()
    parser.feed(html)
    assert parser.found == []
    assert "Plotly" in html  # the library is inlined
    assert 'id="fig-front"' in html and "Configurations to deploy" in html and "from_pretrained(" in html


def test_complete_trials_carry_the_constraint_and_the_front_keeps_to_it(first_run, demo_search: DemoSearch):
    _, completed, trial_records = first_run
    constraint = parse_constraint(DEMO_CONSTRAINT)
    assert f"note: constraints: {constraint}" in completed.stdout
    for record in trial_records:
        if record.complete:
            assert record.constraints == {str(constraint): pytest.approx(constraint.violation(record.metrics))}
            assert record.feasible == constraint.holds(record.metrics)
    front = {trial.number for trial in demo_search.study().best_trials}
    assert front and all(constraint.holds(r.metrics) for r in trial_records if r.number in front)
    assert stored_settings(demo_search.study()).constraints == [str(constraint)]
    assert demo_search.study().user_attrs["constraints"] == str(constraint)  # the summary `optuna studies` shows
    runs = search_runs(demo_search.study())
    assert runs[0]["launched"] == 8 and runs[0]["max_trials"] == 8 and runs[0]["stop_reason"].startswith("8 trials")


def test_resuming_with_another_constraint_is_refused_and_writes_nothing(demo_search: DemoSearch):
    before = records(demo_search.study())
    completed = run_demo_search(demo_search.workdir, demo_search.env, "--trials", "1", "--constraint", "kl<=0.5")
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert f"was searched with {parse_constraint(DEMO_CONSTRAINT)}, not kl_divergence<=0.5" in completed.stderr
    assert records(demo_search.study()) == before


def test_the_same_command_resumes_the_study_and_keeps_its_constraint(resumed: Resumed):
    # No --constraint: the study's own is kept (repeating it is the same; another is refused, above).
    assert f"note: constraints: {parse_constraint(DEMO_CONSTRAINT)}" in resumed.completed.stdout
    before, after = launched(resumed.before), launched(resumed.after)
    assert len(after) == len(before) + 2
    by_number = {record.number: record for record in after}
    for record in before:
        assert by_number[record.number].metrics == record.metrics
        assert by_number[record.number].config == record.config
    keys = [json.dumps(record.config, sort_keys=True) for record in after]
    assert len(set(keys)) == len(keys)
    new = after[len(before) :]
    assert not any("reference" in record.roles for record in new), "the reference was measured again"
    assert all(record.constraints for record in new if record.complete)
    assert len(search_runs(resumed.study)) == 2


def test_report_command_renders_from_storage(resumed: Resumed, demo_search: DemoSearch, tmp_path):
    out = tmp_path / "again.html"
    completed = subprocess.run(
        [sys.executable, "-m", "autotune", "report", "--study", STUDY, "--report", str(out)],
        cwd=resumed.workdir,
        env=demo_search.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    html = out.read_text()
    assert 'id="fig-front"' in html and "search runs</th><td>2," in html
