"""`search --objective/--objectives` bad input, through the CLI's entry point: one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_main

DEMO = ["search", "--model", "demo", "--gpu", "cpu", "--trials", "1"]

CASES = [
    (["--objective", "fast"], "--objective 'fast' is not a preset: use latency, throughput, balanced, memory"),
    (["--objectives", "speed,kl"], "--objectives: 'speed' is not an objective"),
    (["--objectives", "goodput,memory,kl"], "goodput_req_s is measured under --workload serve only"),
    (["--objective", "latency", "--objectives", "energy"], "needs NVML's GPU energy counter, and a CPU has none"),
    (["--objective", "memory", "--constraint", "speed<=3"], "unknown metric 'speed'"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(args) for args, _ in CASES])
def test_an_objective_that_cannot_be_used_is_refused_before_anything_is_written(tmp_path: Path, cli_env, args, message):
    completed = run_main([*DEMO, *args], tmp_path, cli_env)
    assert_one_line_error(completed, message)
    assert list(tmp_path.iterdir()) == [], "bad input wrote into the working folder"
