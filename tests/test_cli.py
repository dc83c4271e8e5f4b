"""Bad input: one line on stderr that says what to fix, exit status 2, no traceback, nothing stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_cli


def assert_one_line_error(completed, contains: str) -> None:
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("autotune: error: ")
    assert contains in lines[0]
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "--model", "demo"], "give a budget"),
        (["search", "--model", "demo", "--trials", "1", "--gpu", "v100"], "unknown --gpu 'v100'"),
        (["search", "--model", "demo", "--budget", "5 parsecs"], "--budget '5 parsecs' is not a duration"),
        (["search", "--model", "demo", "--trials", "1", "--device", "tpu"], "--device 'tpu'"),
        (["search", "--model", "./no/such/model", "--trials", "1", "--gpu", "cpu"], "does not exist"),
        (["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--space", "nope.yaml"], "cannot read"),
        (["search", "--model", "demo", "--trials", "0"], "--trials"),
        (["search", "--model", "demo", "--trials", "1", "--bogus"], "No such option: --bogus"),
        (["report", "--study", "nothing-here"], "no study named 'nothing-here'"),
        (["search", "--model", "demo", "--trials", "1", "--constraint", "kl=0.01"], "cannot read constraint 'kl=0.01'"),
        (["search", "--model", "demo", "--trials", "1", "--constraint", "speed>=5"], "unknown metric 'speed'"),
    ],
)
def test_bad_input(tmp_path: Path, cli_env, args, message):
    completed = run_cli(args, tmp_path, cli_env, timeout=120)
    assert_one_line_error(completed, message)
    assert not (tmp_path / "studies").exists() or not any((tmp_path / "studies").glob("*.db"))


def test_bad_space_value_names_the_knob(tmp_path: Path, cli_env):
    (tmp_path / "space.yaml").write_text("knobs:\n  dtype: [float32, int3]\n")
    completed = run_cli(
        ["search", "--model", "demo", "--trials", "1", "--gpu", "cpu", "--space", "space.yaml"], tmp_path, cli_env
    )
    assert_one_line_error(completed, "knob 'dtype' does not take 'int3'")


def test_gpus_lists_the_profiles(tmp_path: Path, cli_env):
    completed = run_cli(["gpus"], tmp_path, cli_env, timeout=120)
    assert completed.returncode == 0
    for name in ("t4", "a10g", "l4", "a100-40gb", "a100-80gb", "h100", "h200", "cpu"):
        assert f" {name} " in completed.stdout
