"""`autotune best`: the pick under each constraint and goal, its formats, and exit status 3.

The study is `fakes.known_study`: #0 reference (100 tok/s, 4.0 GB, KL 0), #1 baseline (200, 2.0,
0.001), #2 4-bit (150, 1.0, 0.05, the only one with a cost), #3 compiled (400, 2.2, 0.001),
#4 fp16 eager (150, 2.1, 0.002; dominated by #1, but the lowest ttft), #5-#7 failed.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autotune import study as studies
from autotune.analysis.pick import DEFAULT_GOAL, goal_from_flags, pick
from autotune.errors import UserError
from autotune.figures.constraints import parse_constraints
from tests import fakes
from tests.conftest import run_cli, run_main


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("best") / "known.db"
    study, url = fakes.known_study(path)
    return studies.records(study), url


@pytest.mark.parametrize(
    ("constraints", "maximize", "minimize", "expected", "on_front"),
    [
        ([], None, None, 3, True),  # the fastest
        (["memory<=2.1GB"], None, None, 1, True),  # #3 needs 2.2 GB; #1 is faster than #2 and #4
        (["kl<=0.01"], None, None, 3, True),
        (["kl<=0.0005"], None, None, 0, True),  # only the reference is that exact
        (["throughput>=150", "memory<=1.5GB"], None, None, 2, True),
        ([], None, "memory", 2, True),
        ([], None, "kl", 0, True),
        (["kl<=0.01"], None, "memory", 1, True),
        ([], "top1", None, 0, True),
        ([], None, "ttft_ms", 4, False),  # a goal outside the objectives may pick a dominated trial
        (["cost<=1"], None, None, 2, True),  # only #2 measured its cost
        (["ttft_ms<=26"], None, None, 1, True),
        (["memory<2GB"], None, None, 2, True),  # strict: #1 at exactly 2.0 GB is out
    ],
)
def test_pick_under_each_constraint_and_goal(known, constraints, maximize, minimize, expected, on_front):
    records, _ = known
    chosen = pick(records, parse_constraints(constraints), goal_from_flags(maximize, minimize))
    assert chosen.chosen is not None and chosen.chosen.number == expected
    assert chosen.on_front == on_front
    assert chosen.considered == 5  # complete trials only: failures and skipped ones never count


def test_nothing_satisfies_says_what_was_asked(known):
    records, _ = known
    chosen = pick(records, parse_constraints(["throughput>=300", "memory<=2GB"]), DEFAULT_GOAL)
    assert chosen.chosen is None and chosen.feasible == []
    assert "none of the 5 complete trials satisfies" in chosen.why_none()
    assert "decode throughput >= 300 tok/s" in chosen.why_none()


def test_nothing_satisfies_names_the_constraint_that_cut_the_last_candidate_and_its_nearest_miss(known):
    records, _ = known
    chosen = pick(records, parse_constraints(["memory<=2.1GB", "throughput>=300"]), DEFAULT_GOAL)
    assert chosen.why_none().endswith(
        ": peak memory <= 2.1 GB leaves 3; decode throughput >= 300 tok/s cuts the last 3: the nearest, #1, has "
        "200 tok/s"
    )  # #3 (400 tok/s) needs 2.2 GB: the memory bound left #1 (200), #2 and #4 (150 each)


def test_a_task_bound_on_trials_never_evaluated_says_autotune_evaluate_evaluates_them(known):
    records, _ = known
    chosen = pick(records, parse_constraints(["kl<=0.01", "flips<=0.05"]), DEFAULT_GOAL)
    assert chosen.why_none().endswith(
        "KL divergence vs reference <= 0.01 leaves 4; answer flips vs reference <= 0.05 cuts the last 4: 4 were not "
        "evaluated on the task (autotune evaluate evaluates them)"
    )


def test_a_study_without_complete_trials_satisfies_nothing():
    chosen = pick([], [], DEFAULT_GOAL)
    assert chosen.chosen is None and "no trial of the study has completed" in chosen.why_none()


def test_goal_flags():
    assert goal_from_flags(None, None) == DEFAULT_GOAL
    assert str(goal_from_flags(None, "memory")) == "minimize peak_memory_gb"
    with pytest.raises(UserError, match="not both"):
        goal_from_flags("throughput", "memory")
    with pytest.raises(UserError, match="better when it is lower; use --minimize memory"):
        goal_from_flags("memory", None)
    with pytest.raises(UserError, match="unknown metric"):
        goal_from_flags("speed", None)


def test_study_constraints_apply_to_best_too(tmp_path):
    study, _ = fakes.known_study(tmp_path / "c.db", constraints=["kl_divergence<=0.01"])
    settings = studies.stored_settings(study)
    chosen = pick(studies.records(study), parse_constraints(settings.constraints), goal_from_flags(None, "memory"))
    assert chosen.chosen.number == 1  # #2 is leaner, but breaks the study's kl<=0.01


# ------------------------------------------------------------------------------ the command line


def best(known, cwd: Path, env, *args: str):
    _, url = known
    return run_cli(["best", "--study", "fake", "--storage", url, *args], cwd, env, timeout=120)


def test_best_json_for_nightly_jobs(known, tmp_path, cli_env):
    completed = best(known, tmp_path, cli_env, "--max-memory", "2.1GB", "--max-kl", "0.01", "--format", "json")
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert document["trial"] == 1 and document["on_front"] is True
    assert document["constraints"] == ["peak_memory_gb<=2.1", "kl_divergence<=0.01"]
    assert document["goal"] == "maximize throughput_tok_s"
    assert document["feasible_trials"] == 2 and document["complete_trials"] == 5
    assert document["config"] == fakes.BASELINE
    assert document["speedup_vs_baseline"] == 1.0
    assert document["deploy"]["from_pretrained"]["dtype"] == "torch.bfloat16"
    assert document["serve"].startswith("transformers serve org/model --dtype bfloat16")
    assert not list(tmp_path.iterdir()), "best wrote something"


def test_best_python_and_serve_print_the_snippets(known, tmp_path, cli_env):
    completed = best(known, tmp_path, cli_env, "--format", "python")
    assert completed.returncode == 0, completed.stderr
    ast.parse(completed.stdout)
    assert "cache_implementation='static'" in completed.stdout and "CompileConfig(mode='default')" in completed.stdout
    completed = best(known, tmp_path, cli_env, "--minimize", "memory", "--format", "serve")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == (
        "transformers serve org/model --dtype bfloat16 --attn-implementation sdpa --quantization bnb-4bit --device cuda"
    )


def test_best_table_shows_the_figures(known, tmp_path, cli_env):
    completed = best(known, tmp_path, cli_env, "--min-throughput", "150", "--constraint", "memory<=1.5GB")
    assert completed.returncode == 0, completed.stderr
    assert "trial #2" in completed.stdout
    assert "0.75× the baseline's throughput" in completed.stdout
    assert "50% less than the baseline's" in completed.stdout
    assert "42% of the profile's peak (the roofline)" in completed.stdout
    assert "$0.12 per 1M generated tokens" in completed.stdout


def test_best_exits_3_when_nothing_satisfies_the_constraints(known, tmp_path, cli_env):
    completed = best(known, tmp_path, cli_env, "--min-throughput", "300", "--max-memory", "2GB", "--format", "json")
    assert completed.returncode == 3, completed.stdout + completed.stderr
    assert completed.stdout == ""
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: nothing satisfies the constraints: ")
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--constraint", "memory=20"], "cannot read constraint 'memory=20'"),
        (["--max-memory", "20 parsecs"], "--max-memory '20 parsecs': peak_memory_gb is in GB"),
        (["--maximize", "memory"], "use --minimize memory"),
        (["--format", "yaml"], "--format"),
    ],
)
def test_best_bad_input_is_exit_2(known, tmp_path, cli_env, args, message):
    completed = best(known, tmp_path, cli_env, *args)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert message in completed.stderr and "Traceback" not in completed.stderr


def test_best_on_a_missing_study_is_exit_2(tmp_path, cli_env):
    completed = run_cli(["best", "--study", "nothing-here"], tmp_path, cli_env, timeout=120)
    assert completed.returncode == 2
    assert "no study named 'nothing-here'" in completed.stderr


def test_best_on_a_capacity_study_says_its_capacity_and_what_it_carries_beside_its_slo(tmp_path, cli_env):
    _, url = fakes.capacity_study(tmp_path / "capacity.db")
    args = ["best", "--study", "capacity", "--storage", url]
    table = run_main(args, tmp_path, cli_env)
    assert table.returncode == 0, table.stderr
    assert "trial #2 (maximize throughput_tok_s; a capacity within itl_p95<=6ms; 4 of 5 complete" in table.stdout
    assert "capacity within itl_p95<=6ms: batch 32; batch 64 out of memory" in table.stdout
    assert "tok/s at batch 32 within itl_p95<=6ms" in table.stdout
    assert "generated tok/s end to end per GPU" in table.stdout
    assert "per 1M generated tokens at $1.01 per GPU-hour" in table.stdout
    document = json.loads(run_main([*args, "--format", "json"], tmp_path, cli_env).stdout)
    assert document["capacity"]["capacity"] == 32 and document["capacity"]["within"] == "within itl_p95<=6ms"
    assert document["deploy"]["capacity"] == document["capacity"]
    python = run_main([*args, "--format", "python"], tmp_path, cli_env).stdout
    assert "batch_size = 32  #" in python
    ast.parse(python)
    largest = json.loads(run_main([*args, "--maximize", "capacity", "--format", "json"], tmp_path, cli_env).stdout)
    assert largest["trial"] == 2 and largest["metrics"]["capacity"] == 32  # tied with #3 at 32: the faster
    leanest = json.loads(run_main([*args, "--constraint", "capacity>=16", "--minimize", "memory", "--format", "json"],
                                  tmp_path, cli_env).stdout)  # fmt: skip
    assert leanest["capacity"]["capacity"] >= 16 and leanest["trial"] in (1, 3)
