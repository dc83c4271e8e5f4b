"""The serve workload end to end on the demo model, on this CPU: every trial a real `transformers serve`
process driven by the load generator, none left running afterwards, each bracketing the highest rate it
sustains within the SLO, and the report's command the one that ran, with the load it held."""

from __future__ import annotations

import json
import shlex
from html import escape
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.figures.capacity import doubling
from autotune.report.data import collect
from autotune.specs import WorkloadSpec
from autotune.study import front_numbers, records
from autotune.workloads.serve import ServeDetails, ServeSpec, level_requests
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

SLO = "ttft_p95<=2s,itl_p95<=500ms"
SHAPE = ["--input-len", "32", "--output-len", "16", "--load", "concurrency=1,2", "--slo", SLO]
# The search brackets rates from 8/s, a load the demo model sustains within the SLO on a 2-core machine (one
# generate() at a time sustained 24/s there, continuous batching 96/s), up to 32/s, doubling, then
# bisecting between the highest rate sustained and the lowest refused; whether and where a rate is refused depends on
# the machine, not what the tests check. A TTFT bound of 500 ms makes each level 2 s of arrivals (16 requests at least).
SEARCH_SLO = "ttft_p95<=500ms,itl_p95<=500ms"  # as the lines that depend on it print it, too
LADDER = doubling(8.0, 32.0)
SEARCH_SHAPE = ["--input-len", "32", "--output-len", "16", "--load", "rate=8-32", "--slo", SEARCH_SLO]
SEARCHED = WorkloadSpec("serve", input_len=32, output_len=16,
                        serve=ServeSpec("rate", [], bracket=[8.0, 32.0]),
                        slo={"ttft_p95_s": 0.5, "itl_p95_s": 0.5})  # fmt: skip
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
    completed = run_cli([*args, *SEARCH_SHAPE], workdir, env, timeout=1200)
    assert completed.returncode == 0, completed.stderr[-3000:]
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    return workdir, completed, study


def test_every_trial_is_a_real_server_and_none_is_left_running(serve_search):
    _, completed, study = serve_search
    launched = [record for record in records(study) if record.launched]
    assert len(launched) == 4 and all(record.complete for record in launched), completed.stdout
    pids = set()
    for record in launched:
        serve = record.details
        assert isinstance(serve, ServeDetails) and serve.argv[:2] == ["transformers", "serve"]
        assert "--port" in serve.argv and serve.command == shlex.join(serve.argv)
        assert serve.server_pid not in (record.pid, None)
        pids.add(serve.server_pid)
        assert not _left_running(serve.argv), f"trial #{record.number}'s server still runs"
        assert [level["load"] for level in serve.levels] == [point.size for point in record.capacity.points]
        sent = [level["requests"] for level in serve.levels]
        assert sent == [level_requests(SEARCHED, level["load"]) for level in serve.levels]
        assert record.metrics["requests"] == sum(sent)
        for name in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_p95_s", "e2e_p99_s", "goodput_req_s"):
            assert name in record.metrics
        assert "energy_j_per_token" not in record.metrics  # no energy counter on a CPU: absent, not zero
    assert len(pids) == 4  # one server process per trial


def test_each_trial_brackets_the_highest_rate_it_sustains_within_the_slo(serve_search):
    _, completed, study = serve_search
    front = front_numbers(study)
    for record in (record for record in records(study) if record.complete):
        capacity, metrics, said = record.capacity.to_json(), record.metrics, record.capacity.found()
        assert capacity["unit"] == "rate" and capacity["share"] == 0.95
        assert capacity["slo"] == {"ttft_p95_s": 0.5, "itl_p95_s": 0.5}
        points = capacity["points"]
        sizes = [point["size"] for point in points]
        climbed = [size for size in sizes if size in LADDER]
        assert climbed == LADDER[: len(climbed)] and sizes == sorted(sizes)  # doubling from the lowest, no gap
        for point in points:
            assert (point["verdict"] == "met") == (point["figures"]["slo_share"] >= 0.95), point
        met = [point for point in points if point["verdict"] == "met"]
        refused_on_ladder = [size for size in climbed if size not in {point["size"] for point in met}]
        assert len(refused_on_ladder) <= 1  # the climb stops at the first level refused
        bisected = [size for size in sizes if size not in LADDER]
        assert len(bisected) <= 2 and (not bisected or refused_on_ladder)  # bisections only inside a bracket
        if refused_on_ladder and met:
            assert all(max(climbed[:-1]) < size < refused_on_ladder[0] for size in bisected)
        assert f"capacity within {SEARCH_SLO}: {said}" in completed.stdout
        if not met:  # meets the SLO at no rate: off the front, and it says so
            assert metrics["meets_slo"] == metrics["capacity"] == 0 and record.number not in front
            assert said.startswith("meets the SLO at no rate: rate 8 ")
            continue
        chosen = max(met, key=lambda point: point["size"])
        assert metrics["meets_slo"] == 1 and metrics["capacity"] == chosen["size"]
        assert said.startswith(f"rate {chosen['size']:g} is the highest sustained")
        figures = chosen["figures"]  # the trial's figures are those at its capacity
        assert metrics["requests_per_s"] == figures["requests_per_s"] and metrics["ttft_p95_s"] == figures["ttft_p95_s"]
        assert metrics["throughput_tok_s"] == figures["output_tok_s"]
        assert metrics["peak_memory_bytes"] == figures["peak_memory_bytes"] > 0


def test_the_report_shows_the_serve_command_that_ran(serve_search):
    workdir, _, study = serve_search
    data = collect(study, f"sqlite:///{workdir}/studies/{STUDY}.db")
    assert data.cards
    for card in data.cards:
        assert isinstance(card.record.details, ServeDetails)
        command, capacity, held = card.serve.splitlines()  # the command that ran, then the load it sustained
        assert command == card.record.details.command
        assert capacity == f"# capacity within {SEARCH_SLO}: {card.record.capacity.found()}"
        assert held.startswith(f"# at rate {card.record.metrics['capacity']:g}: ")
    html = (workdir / "reports" / f"{STUDY}.html").read_text()
    for card in data.cards:
        assert escape(card.serve) in html
    assert "latency against load" in html and "goodput" in html


def test_a_configuration_serve_cannot_express_is_refused(tmp_path, cli_env):
    args = ["measure", "--model", "demo", "--gpu", "cpu", "--workload", "serve", "--set", "cache_implementation=static"]
    completed = run_cli([*args, "--set", "compile=off"], tmp_path, cli_env, timeout=600)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "transformers serve has no flag for: a static cache without compilation" in completed.stderr


TRACE_LENGTHS = [3, 9, 5, 12, 2, 7]


def test_measure_serve_json_measures_every_listed_level_and_says_when_none_meets_the_slo(tmp_path, cli_env):
    """On a trace of six requests, each asking for its own output length (a request answered with any other length
    is an error): every request of each level, the trace's requests again from the first, got exactly its own."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"input_tokens": 20 + 3 * n, "output_tokens": length}) + "\n"
                             for n, length in enumerate(TRACE_LENGTHS)))  # fmt: skip
    unreachable = ["--traffic", str(trace), "--load", "concurrency=1,2", "--slo", "ttft_p95<=1us"]  # no first token
    completed = run_cli(["measure", "--model", "demo", "--gpu", "cpu", "--workload", "serve", *unreachable, "--json"],
                        tmp_path, cli_env, timeout=900)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    document = json.loads(completed.stdout)
    metrics = document["metrics"]
    assert document["workload"]["traffic"]["requests"] == len(TRACE_LENGTHS)
    levels = document["serve"]["levels"]
    assert all(level["errors"] == 0 for level in levels)  # every request received exactly its own length
    sent = [level["requests"] for level in levels]
    assert [level["output_tok_s"] * level["duration_s"] for level in levels] == pytest.approx(
        [sum(TRACE_LENGTHS[i % len(TRACE_LENGTHS)] for i in range(count)) for count in sent]
    )
    assert metrics["goodput_tok_s"] == 0  # no request met the SLO
    for figure in ("ttft", "itl", "e2e"):
        for q in (50, 95, 99):
            assert metrics[f"{figure}_p{q}_s"] > 0
    assert metrics["errors"] == 0 and metrics["goodput_req_s"] == 0 < metrics["requests_per_s"]
    assert document["workload"]["slo"] == {"ttft_p95_s": 1e-6}
    assert [level["load"] for level in document["serve"]["levels"]] == [1.0, 2.0]  # each listed level, refused or not
    assert metrics["meets_slo"] == metrics["capacity"] == 0
    assert document["capacity"]["said"] == (
        "meets the SLO at no concurrency: concurrency 1 past the SLO: 0 of 16 requests within it (0.0%) < 95%"
    )
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
