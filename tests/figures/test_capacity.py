"""The capacity probe's decisions: which size next, when to stop, what a memory forecast skips, what is chosen."""

from __future__ import annotations

import pytest

from autotune.errors import UserError
from autotune.figures.capacity import (
    Capacity,
    Extent,
    Probe,
    bisections,
    capacity_unit,
    doubling,
    extent,
    parse_batch_sizes,
)

MB = 1e6


@pytest.mark.parametrize(
    ("text", "sizes"),
    [("8", [8]), ("1-128", [1, 2, 4, 8, 16, 32, 64, 128]), ("3-20", [3, 6, 12, 20]), ("32,1,8,8", [1, 8, 32])],
)
def test_batch_sizes_are_a_number_a_doubling_range_or_a_list(text, sizes):
    assert parse_batch_sizes(text) == sizes


@pytest.mark.parametrize("text", ["", "x", "0-8", "8-2", "1,-4", "1-99999"])
def test_a_batch_size_that_is_none_of_those_is_bad_input(text):
    with pytest.raises(UserError, match="--batch-size"):
        parse_batch_sizes(text)


def run(probe: Probe, measure) -> Capacity:
    """Drive a probe as the worker does: skip what is predicted not to fit, stop at the first refusal."""
    while (size := probe.next_size()) is not None:
        if (skipped := probe.too_big(size)) is not None:
            probe.add(skipped)
            continue
        figures = measure(size)
        if figures is None:
            probe.record_oom(size, "CUDA out of memory. Tried to allocate 2.00 GiB")
        else:
            probe.record(size, figures)
    return probe.capacity()


def step_time(size: float) -> dict[str, float]:
    return {"itl_p95_s": 0.002 + 0.0001 * size, "peak_memory_bytes": 100 * MB + 10 * MB * size}


def test_a_ladder_climbs_until_the_slo_refuses_a_batch_and_chooses_the_one_below():
    probe = Probe(doubling(1, 128), {"itl_p95_s": 0.005})
    capacity = run(probe, step_time)
    assert [p.size for p in capacity.points] == [1, 2, 4, 8, 16, 32]  # 64 and 128 never measured
    assert capacity.chosen.size == 16
    assert capacity.why_stopped() == "batch 32 past the SLO: itl_p95 5.2 ms > 5 ms"


def test_a_batch_predicted_not_to_fit_is_skipped_with_its_reason_and_ends_the_probe():
    probe = Probe(doubling(1, 128), {"itl_p95_s": 1.0}, memory_limit=500 * MB)
    capacity = run(probe, step_time)
    verdicts = [(p.size, p.verdict) for p in capacity.points]
    assert verdicts == [(1, "met"), (2, "met"), (4, "met"), (8, "met"), (16, "met"), (32, "met"), (64, "memory")]
    assert capacity.points[-1].figures == {}  # never run
    assert capacity.why_stopped() == "batch 64 over the memory: predicted peak 740.00 MB > 500.00 MB, not run"


def test_a_measured_batch_over_the_memory_limit_is_refused_for_memory():
    probe = Probe([1, 2, 4], {"itl_p95_s": 1.0}, memory_limit=115 * MB)  # batch 2 measures 120 MB: too few to predict
    capacity = run(probe, step_time)
    assert [(p.size, p.verdict) for p in capacity.points] == [(1, "met"), (2, "memory")]
    assert capacity.why_stopped() == "batch 2 over the memory: peak 120.00 MB > 115.00 MB"


def test_an_oom_ends_the_bracket_and_the_lower_points_are_kept():
    probe = Probe(doubling(1, 64), {"itl_p95_s": 1.0})
    capacity = run(probe, lambda size: None if size >= 8 else step_time(size))
    assert [(p.size, p.verdict) for p in capacity.points] == [(1, "met"), (2, "met"), (4, "met"), (8, "oom")]
    assert capacity.chosen.size == 4 and capacity.chosen.figures == step_time(4)
    assert capacity.why_stopped() == "batch 8 out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_a_configuration_that_meets_the_slo_nowhere_says_so():
    capacity = run(Probe(doubling(1, 8), {"itl_p95_s": 0.001}), step_time)
    assert capacity.chosen is None
    assert capacity.why_none() == "meets the SLO at no batch: batch 1 past the SLO: itl_p95 2.1 ms > 1 ms"


def test_a_rate_bracket_is_narrowed_by_bisection_between_the_last_met_and_the_first_refused():
    met_below = 11.0
    probe = Probe([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], {"e2e_p95_s": 1.0}, refine=3, whole=False)
    capacity = run(probe, lambda rate: {"e2e_p95_s": 0.5 if rate <= met_below else 2.0})
    assert [p.size for p in capacity.points] == [1.0, 2.0, 4.0, 8.0, 10.0, 11.0, 12.0, 16.0]
    assert capacity.chosen.size == 11.0


def test_a_capacity_survives_json():
    capacity = run(Probe(doubling(1, 8), {"itl_p95_s": 0.0025}), step_time)
    assert Capacity.from_json(capacity.to_json()) == capacity


@pytest.mark.parametrize(
    ("unit", "size", "said", "carried"),
    [
        ("batch", 16, "batch 16", "throughput_tok_s"),
        (None, 16, "batch 16", "throughput_tok_s"),  # a capacity stored before it named its unit
        ("rate", 4.5, "4.5 requests/s", "goodput_req_s"),
        ("concurrency", 8, "8 concurrent clients", "goodput_req_s"),
        ("tokens", 512, "tokens 512", "throughput_tok_s"),  # a unit of a later version: its name
    ],
)
def test_a_unit_says_its_sizes_and_the_figure_carried_at_each(unit, size, said, carried):
    assert capacity_unit(unit).size_text(size) == said
    assert capacity_unit(unit).carried == carried
    assert capacity_unit(unit).prompts_at_once == (said.startswith("batch"))  # generate()'s batch: the snippet's
    assert capacity_unit(unit).by_share == (carried == "goodput_req_s")  # a load level: its share of requests


# ------------------------------------------------------------------------------- load levels (serve)


def level(share: float, requests: int = 16, errors: int = 0) -> dict[str, float]:
    return {"slo_share": share, "requests": float(requests), "errors": float(errors), "ttft_p95_s": 9.0}


def test_a_load_level_is_judged_by_the_share_of_its_requests_within_the_slo_not_its_percentiles():
    probe = Probe(doubling(2.0, 16.0), {"ttft_p95_s": 0.3}, refine=2, whole=False, share=0.95)
    assert probe.record(2.0, level(1.0)).verdict == "met"  # its p95 (9 s) is past the bound: the share decides
    refused = probe.record(4.0, level(13 / 16, errors=2), detail="the first failed: HTTP 500: boom")
    assert refused.verdict == "slo"
    assert refused.reason == (
        "13 of 16 requests within it (81.2%) < 95%; 2 of 16 requests failed; the first failed: HTTP 500: boom"
    )
    assert probe.capacity("rate").why_stopped() == f"rate 4 past the SLO: {refused.reason}"


def test_a_rate_bracket_doubles_then_bisects_twice_at_16_requests_a_level():
    sustained_up_to = 11.0
    probe = Probe(doubling(2.0, 64.0), {"ttft_p95_s": 0.3}, refine=bisections(16), whole=False, share=0.95)
    capacity = run(probe, lambda rate: level(1.0 if rate <= sustained_up_to else 0.5))
    assert [p.size for p in capacity.points] == [2.0, 4.0, 8.0, 10.0, 12.0, 16.0]  # 12, then 10: two bisections
    assert capacity.chosen.size == 10.0 and capacity.refused.size == 12.0


def test_bisections_stop_where_a_level_of_n_requests_cannot_tell_rates_apart():
    assert [bisections(n) for n in (1, 4, 16, 64, 256)] == [0, 1, 2, 3, 4]


def test_listed_levels_are_each_measured_whatever_their_verdicts():
    probe = Probe([1.0, 2.0, 4.0], {"ttft_p95_s": 0.3}, share=0.95, every=True)
    capacity = run(probe, lambda load: level(0.5 if load == 2.0 else 1.0))
    assert [(p.size, p.verdict) for p in capacity.points] == [(1.0, "met"), (2.0, "slo"), (4.0, "met")]
    assert capacity.chosen.size == 4.0  # the highest level sustained


def test_a_server_that_fell_over_ends_the_bracket_and_keeps_the_levels_below():
    probe = Probe(doubling(1.0, 16.0), {"ttft_p95_s": 0.3}, refine=2, whole=False, share=0.95)
    probe.record(1.0, level(1.0))
    probe.record(2.0, level(1.0))
    probe.record_failure(4.0, level(0.25, errors=12), "transformers serve was killed by SIGKILL during the trial")
    assert probe.next_size() is None  # no bisection: the server is gone
    capacity = probe.capacity("rate")
    assert capacity.chosen.size == 2.0
    assert capacity.why_stopped() == (
        "rate 4 the server failed: transformers serve was killed by SIGKILL during the trial"
    )


def test_a_probe_says_what_it_may_cost_before_it_runs():
    def sending(rate: float) -> float:
        return 15 / rate  # 16 Poisson arrivals: the last one 15 / rate seconds after the first

    cost = extent(Probe(doubling(1.0, 64.0), {}, refine=2, whole=False, share=0.95), sending)
    assert cost.most_points == 7 + 2  # 1, 2, 4, ..., 64, then two bisections
    assert cost.least_cost == sending(1.0)  # refused at the first level
    # the longest course: 1 sustained, 2 refused, then 1.5 and 1.25 both refused
    assert cost.most_cost == sending(1.0) + sending(2.0) + sending(1.5) + sending(1.25)
    listed = extent(Probe([1.0, 4.0], {}, share=0.95, every=True), sending)
    assert listed == Extent(2, sending(1.0) + sending(4.0), sending(1.0) + sending(4.0))  # every listed level runs
