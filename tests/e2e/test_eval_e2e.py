"""Tier 1 end to end: a real search of the demo model with --eval demo. The reference is evaluated before any trial,
each configuration on the front after the loop, through lm-evaluation-harness in a worker with its plan; accuracy,
recovery with its bound, and flips are figures of the terminal's summary and front, the report, and `best` (text and
JSON), which takes them as constraints. A task that cannot be loaded here is one line, before any study is created."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest

from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

SPACE = """
knobs:
  dtype: [float32, bfloat16]
  batching: [generate]
  cache_implementation:
    values: [dynamic, quantized]
  kv_cache_backend:
    values: [quanto]
    when: {cache_implementation: quantized}
"""
STUDY = "evaluated"
SHAPE = ["--input-len", "32", "--output-len", "16", *BRIEF]


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, str], str]:
    workdir = tmp_path_factory.mktemp("eval")
    (workdir / "space.yaml").write_text(SPACE)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--study", STUDY, "--trials", "4"]
    completed = run_cli([*args, "--eval", "demo", *SHAPE], workdir, env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return workdir, env, completed.stdout


def test_the_terminal_says_the_task_each_finalists_figures_and_shows_them_in_the_front(searched):
    _, _, printed = searched
    assert "task demo (573 items, exact_match): the reference answers" in printed
    assert "evaluating the task (tier 1) " in printed  # its time among the search's, beside the trials'
    finalists = [line for line in printed.splitlines() if line.startswith("#") and ": accuracy " in line]
    assert finalists and all("recovery" in line and "flips" in line and "forecast" in line for line in finalists)
    header = next(line for line in printed.splitlines() if "changes from the baseline" in line)
    assert all(column in header for column in ("degenerate", "accuracy", "recovery", "flips"))


def test_the_report_and_best_show_accuracy_recovery_and_flips_and_best_takes_them_as_constraints(searched):
    workdir, env, _ = searched
    page = html.unescape((workdir / "reports" / f"{STUDY}.html").read_text())
    assert "task evaluation (--eval)" in page and "the reference answers" in page
    assert "on the task: accuracy" in page and "flips" in page
    text = run_cli(["best", "--study", STUDY], workdir, env, timeout=120).stdout
    assert "on the task: accuracy" in text and "recovery" in text and "of 573" in text
    document = json.loads(run_cli(["best", "--study", STUDY, "--format", "json"], workdir, env, timeout=120).stdout)
    metrics = document["metrics"]
    assert metrics["task_items"] == 573 and 0 < metrics["task_accuracy"] < 1
    assert metrics["task_recovery_low"] <= metrics["task_recovery"] and 0 <= metrics["task_flips"] < 1
    constrained = run_cli(["best", "--study", STUDY, "--constraint", "flips<=0.05"], workdir, env, timeout=120)
    assert constrained.returncode == 0 and "answer flips vs reference <= 0.05" in constrained.stdout


def test_a_task_that_cannot_be_loaded_here_is_one_line_and_leaves_no_study(tmp_path: Path, cache_dir: Path):
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--trials", "1", "--study", "none", *SHAPE]
    completed = run_cli([*args, "--eval", "autotune_has_no_such_task"], tmp_path, env)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    error = completed.stderr.strip().splitlines()
    assert len(error) == 1 and "--eval autotune_has_no_such_task: lm-evaluation-harness could not load" in error[0]
    assert not (tmp_path / "studies" / "none.db").exists()
