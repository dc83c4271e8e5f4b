"""Tier 1 end to end: a real search of the demo model with --eval demo. The reference is evaluated before any trial,
each configuration on the front after the loop, through lm-evaluation-harness in a worker with its plan; accuracy,
recovery with its bound, and flips are figures of the terminal's summary and front, the report, and `best` (text and
JSON), which takes them as constraints. A task that cannot be loaded here is one line, before any study is created.

Then two more nights of the same space, searched without --eval (their reference and baseline), whose trials
`autotune evaluate` evaluates later: `best --constraint flips<=...` exits 3 before, naming the constraint that cut the
last candidate, and picks one after; the second night like the first (compare: exit 0), the third with a
decoding-path fault planted in its baseline configuration, its trials and its evaluation (compare: exit 3, the task
figures named); `history` shows accuracy, flips and the degenerate share of each night, in its table and its chart.
Last, one night of deploy/nightly.sh gated on the task (AUTOTUNE_GATE), which no configuration passes."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
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


# ------------------------------------------------------------------ later nights, evaluated on demand

NIGHTS = ("night-2", "night-3")
BASELINE = "dtype=bfloat16,cache_implementation=dynamic"  # the demo's baseline on a CPU: trial #1 of each night
DRIFT = json.dumps({BASELINE: {"phase": "load", "kind": "decode_drift"}})  # its decoding path wrong, its prefill exact


@pytest.fixture(scope="module")
def nights(searched) -> dict[str, list]:
    """Each later night: its search (two trials), `best --constraint flips<=0.05` before its trials are evaluated,
    `autotune evaluate` of both, and the same `best` after. The third night's baseline decodes wrong (planted)."""
    workdir, env, _ = searched
    done: dict[str, list] = {}
    for name in NIGHTS:
        tonight = {**env, "AUTOTUNE_INJECT_FAULTS": DRIFT} if name == "night-3" else env
        args = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--study", name, "--trials", "2"]
        searched_tonight = run_cli([*args, *SHAPE], workdir, tonight)
        assert searched_tonight.returncode == 0, searched_tonight.stdout + searched_tonight.stderr
        gate = ["best", "--study", name, "--constraint", "flips<=0.05", "--format", "json"]
        before = run_cli(gate, workdir, env, timeout=120)
        evaluated = run_cli(["evaluate", "--study", name, "--eval", "demo", "--trial", "0", "--trial", "1"], workdir,
                            tonight)  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
        done[name] = [before, evaluated, run_cli(gate, workdir, env, timeout=120)]
    return done


def test_best_exits_3_naming_the_cut_until_autotune_evaluate_evaluates_what_the_search_left_out(nights):
    before, evaluated, after = nights["night-2"]
    assert before.returncode == 3 and before.stdout == ""
    assert before.stderr.strip().endswith(
        "answer flips vs reference <= 0.05 cuts the last 2: 2 were not evaluated on the task (autotune evaluate "
        "evaluates them)"
    )
    printed = evaluated.stdout
    assert "study night-2: trial #0, trial #1, in " in printed and "evaluating the task (tier 1) " in printed
    assert "task demo (573 items, exact_match): the reference answers" in printed
    assert all(any(line.startswith(f"#{number}: accuracy ") for line in printed.splitlines()) for number in (0, 1))
    assert after.returncode == 0, after.stderr
    picked = json.loads(after.stdout)
    assert picked["trial"] in (0, 1) and picked["metrics"]["task_flips"] <= 0.05 and picked["feasible_trials"] >= 1


def test_two_nights_of_the_same_configurations_compare_without_a_regression(searched, nights):
    workdir, env, _ = searched
    compared = run_cli(["compare", STUDY, "night-2", "--format", "markdown"], workdir, env, timeout=120)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "no regression" in compared.stdout.splitlines()[0]
    task_rows = [line for line in compared.stdout.splitlines() if line.startswith("| dtype=")]
    assert len(task_rows) == 2 and all("573 | " in row and row.endswith("| ok |") for row in task_rows)


def test_a_night_whose_decoding_path_broke_regresses_on_the_task_named_in_the_table_and_the_markdown(searched, nights):
    workdir, env, _ = searched
    compared = run_cli(["compare", "night-2", "night-3", "--format", "markdown"], workdir, env, timeout=120)
    assert compared.returncode == 3, compared.stdout + compared.stderr
    headline = compared.stdout.splitlines()[0]
    assert headline.startswith("### autotune compare: night-2 → night-3: **REGRESSED**: ")
    assert "task accuracy" in headline
    broken = next(line for line in compared.stdout.splitlines() if line.startswith("| dtype=bfloat16"))
    assert "REGRESSED task accuracy" in broken
    table = run_cli(["compare", "night-2", "night-3"], workdir, {**env, "COLUMNS": "250"}, timeout=120)
    assert table.returncode == 3 and "REGRESSED task accuracy" in table.stdout
    document = json.loads(run_cli(["compare", "night-2", "night-3", "--format", "json"], workdir, env).stdout)
    assert document["regressed"] and "task accuracy" in document["task"]["regressed"]
    (change,) = [c for c in document["task"]["configurations"] if c["config"]["dtype"] == "bfloat16"]
    assert change["lost"] > change["gained"] and change["accuracy_p"] < 0.05


def test_history_shows_accuracy_flips_and_the_degenerate_share_per_night_in_its_table_and_chart(searched, nights):
    workdir, env, _ = searched
    names = ",".join((STUDY, *NIGHTS))
    shown = run_cli(["history", "--studies", names, "--report", "nights.html"], workdir, {**env, "COLUMNS": "250"})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "best accuracy" in line)
    assert "lowest flips" in header and "lowest degenerate" in header
    last = next(line for line in shown.stdout.splitlines() if "night-3" in line and "REGRESSED" in line)
    assert "task accuracy" in last
    page = (workdir / "nights.html").read_text()
    for title in ("best task accuracy", "lowest answer flips vs reference", "lowest degenerate generations"):
        assert title in page


# ------------------------------------------------------------------ the nightly job's gate

NIGHTLY = REPO / "deploy" / "nightly.sh"


def test_a_nightly_job_gated_on_the_task_exits_3_naming_the_constraint_and_writes_no_pick(searched):
    """The demo answers a fifth of the items right, so accuracy>=0.99 cuts every configuration that flips<=0.05
    leaves; a pick.json left by an earlier night in the same folder is not taken for tonight's."""
    workdir, env, _ = searched
    out = workdir / "gated-reports"
    out.mkdir()
    (out / "pick.json").write_text('{"trial": 0}')
    night = {
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AUTOTUNE_NIGHTLY_PREFIX": "gated",
        "AUTOTUNE_NIGHT": "2026-11-28",
        "AUTOTUNE_SEARCH": f"--model demo --gpu cpu --space space.yaml --eval demo {' '.join(SHAPE)}",
        "AUTOTUNE_TRIALS": "2",
        "AUTOTUNE_GATE": "flips<=0.05 accuracy>=0.99",
        "AUTOTUNE_OUT": str(out),
    }
    done = subprocess.run(["bash", str(NIGHTLY)], cwd=workdir, env=night, capture_output=True, text=True, timeout=900)
    assert done.returncode == 3, done.stdout + done.stderr
    (cut,) = [line for line in done.stderr.splitlines() if "cuts the last" in line]
    assert "answer flips vs reference <= 0.05 leaves " in cut and "task accuracy >= 0.99 cuts the last" in cut, cut
    assert "not evaluated" not in cut  # the search evaluated its front, and autotune evaluate the rest
    assert not (out / "pick.json").exists() and not (out / "pick.json.partial").exists()
    assert (out / "gated-2026-11-28.html").is_file() and (out / "history.md").is_file()
