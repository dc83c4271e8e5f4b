"""What a configuration carries at its capacity: per GPU, per hour, per million tokens, each with its SLO.

The records are those of `fakes.capacity_study` (a throughput probe of batches 1-64 within itl_p95<=6ms on an A10G
profile, $1.01 per GPU-hour) and `fakes.serve_capacity_study` (a rate bracket, 95% of requests within the SLO).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune import study as studies
from autotune.analysis.capacity import at_capacity, count
from autotune.figures.capacity import SloTarget
from autotune.profiles import PROFILES
from autotune.study.opened import Terms
from tests import fakes

PRICE = PROFILES["a10g"].price_per_hour


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory):
    study, _ = fakes.capacity_study(tmp_path_factory.mktemp("capacity") / "c.db")
    terms = Terms.of(studies.stored_settings(study))
    return {record.number: record for record in studies.records(study)}, terms


def test_the_terms_of_a_study_are_its_slo_its_output_length_its_device_and_price(probed):
    _, terms = probed
    assert terms == Terms(SloTarget(fakes.CAPACITY_SLO), 64, "GPU", PRICE)
    assert terms.target.within == "within itl_p95<=6ms"  # a batch meets it by its own percentiles: no share


def test_the_figures_at_capacity_are_the_chosen_batchs_per_gpu_per_hour_per_million_tokens(probed):
    records, terms = probed
    compiled = at_capacity(records[2], terms)  # batches 1-32 met the SLO, 64 ran out of memory
    point = fakes.STACKS["compiled"].figures(32)
    assert compiled.size == 32 and compiled.devices == 1
    assert compiled.tokens_per_s == point["e2e_throughput_tok_s"] == compiled.tokens_per_s_per_device
    assert compiled.tokens_per_hour == pytest.approx(point["e2e_throughput_tok_s"] * 3600)
    assert compiled.requests_per_hour == pytest.approx(compiled.tokens_per_hour / 64)  # 64 tokens per request
    assert compiled.price_per_hour == pytest.approx(PRICE)
    assert compiled.cost_per_million_tokens == pytest.approx(records[2].metrics["cost_per_million_tokens_usd"])
    assert compiled.capacity_line() == (
        "capacity within itl_p95<=6ms: batch 32; batch 64 out of memory: "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"
    )
    per_gpu = f"{point['e2e_throughput_tok_s']:.4g}"
    assert compiled.figures_line().startswith(
        f"at batch 32 within itl_p95<=6ms: {per_gpu} generated tok/s end to end per GPU, "
    )
    assert f"per 1M generated tokens at ${PRICE:.2f} per GPU-hour" in compiled.figures_line()


def test_a_deployment_on_two_gpus_carries_its_tokens_on_both_and_pays_for_both(probed):
    records, terms = probed
    record = records[2]
    on_two = replace(record, metrics={**record.metrics, "tp_ranks": 2.0})
    one, two = at_capacity(record, terms), at_capacity(on_two, terms)
    assert two.devices == 2 and two.tokens_per_s_per_device == pytest.approx(one.tokens_per_s / 2)
    assert two.cost_per_million_tokens == pytest.approx(2 * one.cost_per_million_tokens)
    assert "generated tok/s end to end per GPU (2 GPUs," in two.figures_line()


def test_the_price_is_the_one_the_trials_cost_was_computed_with(probed):
    """`autotune search --price 2.5`: the trial's cost says so; the study stores only the profile's price."""
    records, terms = probed
    record = records[1]
    cost = 2.5 / 3600 / record.metrics["e2e_throughput_tok_s"] * 1e6  # the worker's, at $2.50 per hour
    priced = {**record.metrics, "cost_per_million_tokens_usd": cost}
    assert at_capacity(replace(record, metrics=priced), terms).price_per_hour == 2.5
    unpriced = {name: value for name, value in record.metrics.items() if name != "cost_per_million_tokens_usd"}
    assert at_capacity(replace(record, metrics=unpriced), terms).price_per_hour == PRICE  # the profile's


def test_a_configuration_that_meets_the_slo_nowhere_has_no_capacity_and_says_why(probed):
    records, terms = probed
    eager = at_capacity(records[4], terms)
    assert eager.size is None and eager.figures_line() == ""
    assert eager.capacity_line() == (
        "no capacity within itl_p95<=6ms: meets the SLO at no batch: batch 1 past the SLO: itl_p95 7 ms > 6 ms"
    )


def test_a_trial_without_a_probe_has_no_capacity(tmp_path):
    study, _ = fakes.known_study(tmp_path / "known.db")
    terms = Terms.of(studies.stored_settings(study))
    assert all(at_capacity(record, terms) is None for record in studies.records(study))


def test_under_load_the_figures_are_the_sustained_levels_and_the_slo_names_its_share(tmp_path):
    study, _ = fakes.serve_capacity_study(tmp_path / "serve.db")
    terms = Terms.of(studies.stored_settings(study))
    assert terms.target == SloTarget(fakes.SERVE_SLO, 0.95)
    served = at_capacity(studies.records(study)[0], terms)
    # 8 requests/s sustained; the trial's own figures are its best level's (16 requests/s offered, 640 tok/s)
    assert served.size == 8 and served.tokens_per_s == 8 * 64 and served.requests_per_hour == 8 * 3600
    assert served.where == "8 requests/s within ttft_p95<=300ms,itl_p95<=50ms for 95% of requests"
    assert served.capacity_line().endswith("rate 12 past the SLO: 81% of requests within the SLO < 95%")


def test_targets_that_differ_say_how():
    six, five = SloTarget({"itl_p95_s": 0.006}), SloTarget({"itl_p95_s": 0.005})
    assert six.differs(SloTarget({"itl_p95_s": 0.006})) is None
    assert six.differs(five) == "the earlier was searched within itl_p95<=6ms, the later within itl_p95<=5ms"
    assert SloTarget({}).differs(six) == "the earlier was searched with no SLO, the later within itl_p95<=6ms"


@pytest.mark.parametrize(
    ("value", "text"), [(None, "-"), (512, "512"), (4321, "4.32k"), (7_400_000, "7.4M"), (2.5e9, "2.5G")]
)
def test_counts_per_hour_read_at_a_glance(value, text):
    assert count(value) == text
