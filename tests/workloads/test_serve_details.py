"""A serve trial's own details (ServeDetails) as its card shows them: the command that ran, with the load it
sustained within the SLO and what the server held there, and the levels' table with each one's verdict."""

from __future__ import annotations

import shlex

from autotune.figures.capacity import Capacity, Probe
from autotune.report.html import details_table
from autotune.workloads.serve import ServeDetails

SLO = {"ttft_p95_s": 0.3}
ARGV = ["transformers", "serve", "demo", "--dtype", "bfloat16", "--device", "cpu", "--port", "8000"]


def level(load: float, within: float, in_flight: float) -> dict[str, float]:
    """A load level's figures as serving/latency.py gives them (16 requests, none failed)."""
    return {"load": load, "requests": 16.0, "errors": 0.0, "slo_share": within, "requests_per_s": load * 0.9,
            "goodput_req_s": load * 0.9 * within, "output_tok_s": load * 14.4, "ttft_p95_s": 0.1 * load / 4,
            "in_flight_peak": in_flight, "peak_memory_bytes": 4e8}  # fmt: skip


def deployed_command(serve: ServeDetails, capacity: Capacity | None) -> str:
    return serve.deployed_command(capacity)


def measured(argv: list[str]) -> tuple[ServeDetails, Capacity]:
    """A bracket of rates 4-16 whose level 12 is the highest sustained, as a serve trial finds it."""
    probe = Probe([4.0, 8.0, 16.0], SLO, refine=2, whole=False, share=0.95)
    for rate, within in ((4.0, 1.0), (8.0, 1.0), (16.0, 0.5), (12.0, 1.0), (14.0, 13 / 16)):
        probe.record(rate, level(rate, within, in_flight=rate / 2))
    capacity = probe.capacity("rate")
    levels = [{**p.figures, "verdict": p.verdict, "reason": p.reason} for p in capacity.points]
    stored = {"command": shlex.join(argv), "argv": argv, "mode": "rate", "slo": SLO, "levels": levels}
    return ServeDetails.from_json(stored), capacity


def test_the_command_says_the_load_it_sustained_within_the_slo_and_what_the_server_held():
    serve, capacity = measured(ARGV)
    lines = deployed_command(serve, capacity).splitlines()
    assert lines == [
        serve.command,
        "# capacity within ttft_p95<=300ms: rate 12 is the highest sustained (95% of requests within the SLO); "
        "rate 14 past the SLO: 13 of 16 requests within it (81.2%) < 95%",
        "# at rate 12: 10.80 req/s and 172.8 output tok/s, at most 6 requests in flight at once; "
        "no --continuous-batching: requests queue for one generate() at a time",
    ]


def test_under_continuous_batching_the_command_names_its_tokens_per_forward_pass():
    batched = [*ARGV, "--continuous-batching", "--cb-block-size", "16", "--cb-num-blocks", "18"]
    serve, capacity = measured(batched)
    assert deployed_command(serve, capacity).endswith(
        "continuous batching, transformers' default max_batch_tokens (no --cb-max-batch-tokens)"
    )
    serve, capacity = measured([*batched, "--cb-max-batch-tokens", "256"])
    assert deployed_command(serve, capacity).endswith("continuous batching, max_batch_tokens 256")


def test_a_trial_that_met_the_slo_nowhere_says_so_and_a_trial_without_an_slo_shows_the_command_alone():
    probe = Probe([4.0, 8.0], SLO, refine=2, whole=False, share=0.95)
    probe.record(4.0, level(4.0, 0.5, in_flight=3))
    serve, _ = measured(ARGV)
    lines = deployed_command(serve, probe.capacity("rate")).splitlines()
    assert lines[1:] == [
        "# capacity within ttft_p95<=300ms: meets the SLO at no rate: rate 4 past the SLO: "
        "8 of 16 requests within it (50.0%) < 95%"
    ]
    assert deployed_command(serve, None) == serve.command


def test_the_levels_table_gives_each_level_its_share_within_the_slo_and_its_verdict():
    serve, _ = measured(ARGV)
    table = details_table(serve.table())
    assert table.count("<tr>") == 1 + 5
    assert "<td>12</td>" in table and "<td>sustained</td>" in table and "<td>81.2%</td>" in table
    assert "<td>refused: 13 of 16 requests within it (81.2%) &lt; 95%</td>" in table
