"""benchmarks/budget_replay.py: searches replayed on recorded trial durations, on a simulated clock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.budget_replay import RULES, Recording, simulate
from tests.search.test_strategy import synthetic_grid

REPO = Path(__file__).resolve().parents[2]
H200_STUDY = REPO / "reports" / "gpu" / "2026-11-26-h200" / "proof-llama-1b" / "study.db"
BEFORE, AFTER = RULES


def test_a_trial_still_running_at_the_deadline_is_cut_there_and_an_upper_estimate_passes_it_over(tmp_path):
    # Plain trials take 5 s, compiled ones 30 s: after the reference and the baseline, the compiled stack has 20 s.
    recording = Recording("synthetic", synthetic_grid(tmp_path / "grid.json"), 0.0, 0.0, complete=True)
    before, after = simulate(recording, BEFORE, 30.0), simulate(recording, AFTER, 30.0)
    assert before.cut_s == 20.0 and before.cut is not None and before.cut.startswith("recommended for throughput")
    assert len(before.launched) == 2  # the median of the trials ended (5 s) fit: the stack started, and was cut
    assert after.cut_s == 0.0 and len(after.launched) > 2  # the stack passed over: five-second trials instead
    assert not [key for key in after.launched if recording.grid.trials[key]["duration_s"] > 5.0]
    assert [why for why in after.passed_over if why.startswith("recommended for throughput")]


def test_the_replay_of_the_h200_run_prints_cut_shares_and_objectives_under_both_rules():
    command = [sys.executable, "benchmarks/budget_replay.py", str(H200_STUDY), "--budgets", "120,180",
               "--sweep", "100:161:30"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {tuple(line.split()[:2]): line for line in done.stdout.splitlines() if line.startswith(("before", "after"))}
    # 120 s: the median rule starts max-autotune (forecast as long as reduce-overhead) and it is cut at the deadline
    assert "cut: warm-up: compile=max-autotune" in rows["before", "120s"]
    assert float(rows["before", "120s"].split()[3].rstrip("%")) > 0
    assert (
        rows["after", "120s"].split()[3] == "0.0%"
        and "passed over: warm-up: compile=max-autotune" in rows["after", "120s"]
    )
    assert "recommended for memory" not in rows["after", "120s"]  # the 4-bit stack ran instead
    assert rows["after", "180s"].split()[2] == "6"  # every recorded trial
    assert "after   mean cut share 0.0%" in done.stdout and "duration over expected" in done.stdout


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_a_budget_that_fits_every_recorded_trial_replays_the_whole_run(rule):
    from benchmarks.budget_replay import load

    recording = load(H200_STUDY)
    run = simulate(recording, rule, 1e4)
    assert run.cut_s == 0 and sorted(run.launched) == sorted(recording.grid.trials)
