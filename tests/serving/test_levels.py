"""A serve trial's levels driven against a real server process (tests/servers.py, no model): a bracket
climbs while its levels are sustained, a level with failed requests is refused with their reason, and a server that
falls over ends the bracket with the levels below kept."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from autotune.figures.capacity import Probe, doubling
from autotune.serving.levels import measure_levels
from autotune.serving.load import Endpoint, Requests
from autotune.serving.server import HOST, free_port
from tests.servers import start_trivial_server

LOOSE_SLO = {"ttft_p95_s": 60.0}  # a server that answers at once meets it at any load


class ProcessWatch:
    """The server as a serve trial watches it; the test kills it as level `kill_at` (1 = the first) starts."""

    def __init__(self, server: subprocess.Popen, kill_at: int | None = None) -> None:
        self.server, self.kill_at, self.started = server, kill_at, 0

    def begin(self) -> None:
        self.started += 1
        if self.started == self.kill_at:
            self.server.kill()
            self.server.wait()

    def figures(self) -> dict[str, float]:
        return {}

    def failure(self) -> str | None:
        code = self.server.poll()
        return None if code is None else f"the server exited ({code}) during the trial"


@pytest.fixture
def server_at(request):
    """Start a trivial server (every `fail_every`-th completion answered with HTTP 500); its URL and process."""
    started = []

    def start(fail_every: int = 0) -> tuple[Endpoint, subprocess.Popen]:
        port = free_port()
        process = start_trivial_server(port, [0], fail_every=fail_every)
        started.append(process)
        return Endpoint(f"http://{HOST}:{port}/v1/completions", "trivial"), process

    yield start
    for process in started:
        process.kill()
        process.wait()


def bracket(low: float, high: float) -> Probe:
    return Probe(doubling(low, high), LOOSE_SLO, refine=2, share=0.95)


def drive(target: Endpoint, probe: Probe, watch: ProcessWatch, per_level: int = 4, warmup: int = 0) -> list:
    requests_at = lambda level: per_level  # noqa: E731
    hello = Requests.alike(["hello"], 4)
    return asyncio.run(measure_levels(target, hello, "concurrency", probe, watch, requests_at, warmup))


def test_a_bracket_climbs_while_each_level_is_sustained_up_to_its_top(server_at):
    target, server = server_at()
    probe = bracket(1, 8)
    records = drive(target, probe, ProcessWatch(server), warmup=2)
    capacity = probe.capacity("concurrency")
    assert [(p.size, p.verdict) for p in capacity.points] == [(1, "met"), (2, "met"), (4, "met"), (8, "met")]
    assert len(records) == 2 + 4 * 4 and [r.level for r in records[:2]] == [None, None]
    assert capacity.why_stopped() == "every concurrency tried met the SLO (the largest: 8)"
    figures = capacity.chosen.figures
    assert figures["slo_share"] == 1.0 and figures["requests"] == 4 and 1 <= figures["in_flight_peak"] <= 8


def test_a_level_with_failed_requests_is_refused_with_their_reason(server_at):
    target, server = server_at(fail_every=5)  # the 5th request of the first level fails
    probe = bracket(1, 8)
    drive(target, probe, ProcessWatch(server), per_level=8)
    capacity = probe.capacity("concurrency")
    assert [(p.size, p.verdict) for p in capacity.points] == [(1, "slo")]  # no level below it: nothing to bisect
    assert capacity.why_none() == (
        "meets the SLO at no concurrency: concurrency 1 past the SLO: 7 of 8 requests within it (87.5%) < 95%; "
        '1 of 8 requests failed; the first failed: HTTP 500: {"error":"failing on purpose"}'
    )


def test_a_server_that_falls_over_ends_the_bracket_and_the_levels_below_are_kept(server_at):
    target, server = server_at()
    probe = bracket(1, 8)
    records = drive(target, probe, ProcessWatch(server, kill_at=3))
    capacity = probe.capacity("concurrency")
    assert [(p.size, p.verdict) for p in capacity.points] == [(1, "met"), (2, "met"), (4, "failed")]
    assert capacity.chosen.size == 2
    assert capacity.why_stopped().startswith("concurrency 4 the server failed: the server exited (-9)")
    assert len(records) == 3 * 4 and not any(r.ok for r in records if r.level == 4)


def test_a_server_that_falls_over_at_the_first_level_leaves_no_level_below(server_at):
    target, server = server_at()
    probe = bracket(1, 8)
    drive(target, probe, ProcessWatch(server, kill_at=1))  # the trial fails on it (worker/serve_trial.py)
    assert [(p.size, p.verdict) for p in probe.points] == [(1, "failed")] and probe.capacity().chosen is None
