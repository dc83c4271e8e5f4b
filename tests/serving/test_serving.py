"""The serve workload's parts that need no model: --load/--slo parsing, bad input at the command line,
and the load generator against a real trivial server (tests/servers.py) in its own process."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.figures.slo import describe_slo, parse_slo
from autotune.serving.latency import meets_slo, serve_figures
from autotune.serving.load import Endpoint, RequestRecord, Requests, run_load
from autotune.serving.server import HOST, free_port
from autotune.workloads.serve import parse_load
from tests.conftest import run_cli
from tests.servers import start_trivial_server


def test_load_is_a_mode_and_sorted_levels():
    assert parse_load("rate=8,2,4") == ("rate", [2.0, 4.0, 8.0])
    assert parse_load("concurrency=1,8,32") == ("concurrency", [1.0, 8.0, 32.0])


@pytest.mark.parametrize(
    "text", ["rate", "speed=1,2", "rate=fast", "rate=0", "rate=1,,2", "concurrency=1.5", "rate=-2"]
)
def test_a_malformed_load_is_bad_input(text):
    with pytest.raises(UserError, match="--load"):
        parse_load(text)


def test_slo_bounds_are_in_seconds_and_read_back():
    slo = parse_slo("ttft_p95<=300ms, itl_p95<=50ms,e2e_p99<=2s")
    assert slo == {"ttft_p95_s": 0.3, "itl_p95_s": 0.05, "e2e_p99_s": 2.0}
    assert describe_slo(slo) == "ttft_p95<=300ms,itl_p95<=50ms,e2e_p99<=2s"
    assert parse_slo(describe_slo(slo)) == slo and describe_slo({"itl_p95_s": 2e-4}) == "itl_p95<=200us"


@pytest.mark.parametrize(
    "text", ["ttft<=300ms", "ttft_p95>=300ms", "ttft_p95<=300", "tpot_p95<=1ms", "ttft_p97<=1s", ","]
)
def test_a_malformed_slo_is_bad_input(text):
    with pytest.raises(UserError, match="--slo"):
        parse_slo(text)


def _record(ttft: float, gaps: list[float]) -> RequestRecord:
    times = [ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(level=1.0, start=0.0, chunk_times=times, end=times[-1], tokens=len(times))


def test_a_request_meets_the_slo_by_its_own_ttft_and_gaps():
    slo = {"ttft_p95_s": 0.3, "itl_p95_s": 0.05}
    assert meets_slo(_record(0.2, [0.01] * 20), slo)
    assert not meets_slo(_record(0.4, [0.01] * 20), slo)  # first token too late
    assert not meets_slo(_record(0.2, [0.01] * 10 + [0.2] * 10), slo)  # half its gaps over the bound
    failed = RequestRecord(level=1.0, start=0.0, error="HTTP 500: boom")
    assert not meets_slo(failed, {})


# ------------------------------------------------------------------------------- command line


def _bad_input(args: list[str], tmp_path: Path, env: dict[str, str]) -> str:
    completed = run_cli(args, tmp_path, env, timeout=120)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), completed.stderr
    assert not (tmp_path / "studies").exists()  # nothing stored
    return lines[0]


SEARCH = ["search", "--model", "demo", "--workload", "serve", "--trials", "1"]


def test_bad_serve_input_is_one_line_and_exit_status_2(tmp_path, cli_env):
    assert "--load 'rate=fast'" in _bad_input([*SEARCH, "--load", "rate=fast"], tmp_path, cli_env)
    assert "--slo 'ttft<=300ms'" in _bad_input([*SEARCH, "--slo", "ttft<=300ms"], tmp_path, cli_env)
    message = _bad_input(["measure", "--model", "demo", "--load", "rate=2"], tmp_path, cli_env)
    assert "--load applies only to --workload serve" in message


def test_a_port_that_cannot_be_bound_is_bad_input(tmp_path, cli_env):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = _bad_input([*SEARCH, "--serve-port", str(port)], tmp_path, cli_env)
    assert f"--serve-port {port} cannot be bound" in message


# ------------------------------------------------------------------------- the load generator


@pytest.fixture
def trivial_server():
    """A real server process answering at once; every 5th completion request gets HTTP 500."""
    port = free_port()
    server = start_trivial_server(port, [0], fail_every=5)
    yield f"http://{HOST}:{port}/v1/completions"
    server.kill()
    server.wait()


def test_failed_requests_are_counted_apart_and_warm_up_is_excluded(trivial_server):
    target = Endpoint(trivial_server, "trivial")
    records = asyncio.run(run_load(target, Requests.alike(["hello"], 8), "concurrency", [1, 2], per_level=10, warmup=2))
    assert [record.level for record in records[:2]] == [None, None] and all(r.ok for r in records[:2])
    assert len(records) == 22
    metrics, stats, levels = serve_figures(records, {"ttft_p95_s": 60.0})
    # requests 5, 10, 15 and 20 of 22 (warm-up first) were refused by the server
    assert metrics["requests"] == 20 and metrics["errors"] == 4
    assert stats["ttft_s"]["n"] == 16 and stats["itl_s"]["n"] == 16 * 7
    assert sum(level["errors"] for level in levels) == 4
    assert all(r.error.startswith("HTTP 500") for r in records if not r.ok)
    # a bound every completed request meets: goodput is the completed rate; one none can meet: zero
    assert metrics["goodput_req_s"] == metrics["requests_per_s"] > 0
    assert serve_figures(records, {"ttft_p50_s": 0.0})[0]["goodput_req_s"] == 0.0


def test_poisson_load_sends_every_request_open_loop(trivial_server):
    target = Endpoint(trivial_server.replace("/v1/completions", "/nowhere"), "trivial")
    records = asyncio.run(run_load(target, Requests.alike(["hello"], 4), "rate", [50.0], per_level=12, warmup=0))
    assert len(records) == 12 and all(record.error == "HTTP 404: Not Found" for record in records)
    with pytest.raises(RuntimeError, match="every request to transformers serve failed"):
        serve_figures(records, {})


def test_a_request_to_a_closed_port_is_an_error_not_an_exception():
    target = Endpoint(f"http://{HOST}:{free_port()}/v1/completions", "none")
    records = asyncio.run(run_load(target, Requests.alike(["hello"], 4), "concurrency", [2], per_level=3, warmup=0))
    assert len(records) == 3 and all(record.error and "Connect" in record.error for record in records)


def test_each_request_of_a_trace_asks_for_its_own_tokens_and_arrives_as_the_trace_scaled(trivial_server):
    """A level replays the trace's requests in order (from the first again when it needs more), each asking for its
    own length, at its own arrival scaled to the level's rate (its bursts kept)."""
    trace = Requests(["a", "b", "c", "d"], [3, 9, 1, 5], [0.0, 0.1, 0.1, 3.0])
    records = asyncio.run(run_load(Endpoint(trivial_server, "trivial"), trace, "rate", [4.0], per_level=6, warmup=0))
    assert [record.wanted for record in records] == [3, 9, 1, 5, 3, 9]
    answered = [record for record in records if record.ok]  # every 5th request is refused: the server's test fault
    assert answered and all(record.tokens == record.wanted for record in answered)
    # 4 requests over 3 s is 1/s: at 4/s, 4x faster; once through, then again after one mean gap (1 s, scaled)
    arrivals = trace.arrivals(4.0, 6, random.Random(0))
    assert arrivals == pytest.approx([0.0, 0.025, 0.025, 0.75, 1.0, 1.025])
    starts = [record.start - records[0].start for record in records]
    assert all(start >= arrival - 0.005 for start, arrival in zip(starts, arrivals, strict=True))  # never early
    poisson = Requests.alike(["x"], 2).arrivals(4.0, 6, random.Random(0))
    assert poisson[0] == 0.0 and poisson == sorted(poisson) and len(set(poisson)) == 6


def test_goodput_and_energy_are_constraints():
    from autotune.figures.constraints import parse_constraint

    assert str(parse_constraint("goodput>=2")) == "goodput_req_s>=2"
    assert str(parse_constraint("energy<=500mJ")) == "energy_j_per_token<=0.5"
    assert str(parse_constraint("ttft_p95_s<=0.3")) == "ttft_p95_s<=0.3"


def test_energy_is_absent_without_a_counter():
    from autotune.worker.measurement.energy import EnergyCounter, energy_figures

    counter = EnergyCounter("cpu")
    counter.start()
    assert counter.joules() is None
    assert energy_figures(None, 100) == {}
    assert energy_figures(2.0, 100) == {"energy_j": 2.0, "energy_j_per_token": 0.02}
