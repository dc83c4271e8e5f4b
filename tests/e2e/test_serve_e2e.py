"""The serve workload end to end on the demo model, on this CPU: every trial a real `transformers serve`
process driven by the load generator, none left running afterwards, and the report's command the one
that ran."""

from __future__ import annotations

import json
import shlex
from html import escape
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.report.data import collect
from autotune.study import records
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

SHAPE = ["--input-len", "32", "--output-len", "16", "--load", "concurrency=1,2", "--slo", "ttft_p95<=2s,itl_p95<=500ms"]
STUDY = "serve-demo"


def _running_commands() -> list[list[str]]:
    commands = []
    for process in psutil.process_iter(["cmdline"]):
        commands.append(process.info["cmdline"] or [])
    return commands


def _left_running(argv: list[str]) -> bool:
    """A process still runs this exact server command (its port makes it unique to one trial)."""
    return any(command[-len(argv) + 1 :] == argv[1:] for command in _running_commands() if len(command) >= len(argv))


@pytest.fixture(scope="module")
def serve_search(tmp_path_factory, cache_dir):
    import os

    workdir = tmp_path_factory.mktemp("serve-search")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(Path(__file__).parents[2])}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--workload", "serve", "--trials", "4", "--study", STUDY]
    completed = run_cli([*args, *SHAPE], workdir, env, timeout=1200)
    assert completed.returncode == 0, completed.stderr[-3000:]
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    return workdir, completed, study


def test_every_trial_is_a_real_server_and_none_is_left_running(serve_search):
    _, completed, study = serve_search
    launched = [record for record in records(study) if record.launched]
    assert len(launched) == 4 and all(record.complete for record in launched), completed.stdout
    pids = set()
    for record in launched:
        serve = record.serve
        assert serve is not None and serve["argv"][:2] == ["transformers", "serve"]
        assert "--port" in serve["argv"] and serve["command"] == shlex.join(serve["argv"])
        assert serve["server_pid"] not in (record.pid, None)
        pids.add(serve["server_pid"])
        assert not _left_running(serve["argv"]), f"trial #{record.number}'s server still runs"
        assert [level["load"] for level in serve["levels"]] == [1.0, 2.0]
        assert record.metrics["requests"] == 32 and record.metrics["errors"] == 0
        for name in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_p95_s", "e2e_p99_s", "goodput_req_s"):
            assert name in record.metrics
        assert "energy_j_per_token" not in record.metrics  # no energy counter on a CPU: absent, not zero
    assert len(pids) == 4  # one server process per trial


def test_the_report_shows_the_serve_command_that_ran(serve_search):
    workdir, _, study = serve_search
    data = collect(study, f"sqlite:///{workdir}/studies/{STUDY}.db")
    assert data.cards
    for card in data.cards:
        assert card.record.serve is not None
        assert card.serve == card.record.serve["command"]
    html = (workdir / "reports" / f"{STUDY}.html").read_text()
    for card in data.cards:
        assert escape(card.serve) in html
    assert "latency against load" in html and "goodput" in html


def test_a_configuration_serve_cannot_express_is_refused(tmp_path, cli_env):
    args = ["measure", "--model", "demo", "--gpu", "cpu", "--workload", "serve", "--set", "cache_implementation=static"]
    completed = run_cli([*args, "--set", "compile=off"], tmp_path, cli_env, timeout=600)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "transformers serve has no flag for: a static cache without compilation" in completed.stderr


def test_measure_serve_json_prints_percentiles_goodput_and_errors(tmp_path, cli_env):
    completed = run_cli(["measure", "--model", "demo", "--gpu", "cpu", "--workload", "serve", *SHAPE, "--json"],
                        tmp_path, cli_env, timeout=900)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    document = json.loads(completed.stdout)
    metrics = document["metrics"]
    for figure in ("ttft", "itl", "e2e"):
        for q in (50, 95, 99):
            assert metrics[f"{figure}_p{q}_s"] > 0
    assert metrics["errors"] == 0 and metrics["goodput_req_s"] <= metrics["requests_per_s"]
    assert document["workload"]["slo"] == {"ttft_p95_s": 2.0, "itl_p95_s": 0.5}
    assert not _left_running(document["serve"]["argv"])


def test_a_server_that_dies_during_the_trial_fails_the_trial_with_its_reason(tmp_path, cli_env):
    env = {**cli_env, "AUTOTUNE_INJECT_FAULTS": json.dumps({"0": {"phase": "serve", "kind": "kill_server"}})}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--workload", "serve", "--trials", "1", "--study", "dies"]
    completed = run_cli([*args, *SHAPE], tmp_path, env, timeout=900)
    study = optuna.load_study(study_name="dies", storage=f"sqlite:///{tmp_path}/studies/dies.db")
    (trial,) = [record for record in records(study) if record.launched]
    assert trial.outcome == "error", completed.stdout + completed.stderr[-2000:]
    assert "transformers serve was killed by SIGKILL during the trial" in trial.message
    assert "transformers serve log" in trial.log_tail
    assert not any("serve" in command and "dies" in " ".join(command) for command in _running_commands())
