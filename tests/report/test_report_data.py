"""The data behind the report's plots and cards, from a study with known figures (no browser here).

The study is `fakes.known_study`: #0 reference (100 tok/s, 4.0 GB, KL 0), #1 baseline (200, 2.0,
0.001), #2 4-bit (150, 1.0, 0.05, with roofline and cost), #3 compiled (400, 2.2, 0.001),
#4 fp16 eager (150, 2.1, 0.002; dominated by #1), #5 oom, #6 error with <script> in its message,
#7 broken, #8 skipped by a rule.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from html import escape
from html.parser import HTMLParser

import pytest

from autotune.profiles import PROFILES
from autotune.report.capacity_chart import capacity_chart
from autotune.report.cards import card_facts
from autotune.report.data import card, collect
from autotune.report.exploration import NOT_APPLICABLE, progress
from autotune.report.html import render
from tests import fakes


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    study, url = fakes.known_study(tmp_path_factory.mktemp("report") / "known.db")
    return collect(study, url)


def test_pareto_front_is_optunas_best_trials_fastest_first(data):
    assert data.pareto == [3, 1, 2, 0]
    assert data.baseline.number == 1 and data.reference.number == 0
    assert [record.number for record in data.trials] == list(range(8))
    assert [record.number for record in data.skipped] == [8]
    assert data.outcomes == {"ok": 5, "oom": 1, "error": 1, "broken": 1}


def test_cards_compare_with_the_baseline_and_the_reference(data):
    cards = {card.record.number: card for card in data.cards}
    compiled, four_bit, reference = cards[3], cards[2], cards[0]
    assert compiled.speedup == pytest.approx(2.0)  # 400 / 200 tok/s
    assert compiled.memory_saving == pytest.approx(-0.1)  # 2.2 GB vs 2.0: uses 10% more
    assert four_bit.speedup == pytest.approx(0.75)
    assert four_bit.memory_saving == pytest.approx(0.5)
    assert four_bit.kl == 0.05 and four_bit.top1_loss == pytest.approx(0.1)
    assert four_bit.perplexity_change == pytest.approx(0.1)  # 11.0 vs the reference's 10.0
    assert reference.kl == 0 and reference.top1_loss == 0 and reference.perplexity_change == 0
    # Roofline and cost appear only where the trial measured them.
    assert (four_bit.roofline_fraction, four_bit.achieved_bandwidth_gb_s) == (0.42, 252.0)
    assert four_bit.cost_per_million_tokens_usd == 0.12
    assert compiled.roofline_fraction is None and compiled.cost_per_million_tokens_usd is None
    facts = " | ".join(card_facts(four_bit))
    assert "0.75× the baseline's throughput" in facts and "peak memory 1.00 GB: 50% less than the baseline's" in facts
    assert "KL 5.00e-02 nats/token, top-1 disagreement 10.0%, perplexity +10.00%" in facts
    assert "252 GB/s of memory bandwidth achieved in decode, 42% of the profile's peak (the roofline)" in facts
    assert "$0.12 per 1M generated tokens" in facts
    assert not any("roofline" in fact or "per 1M" in fact for fact in card_facts(compiled))
    more = [fact for fact in card_facts(replace(four_bit, memory_saving=-0.54)) if fact.startswith("peak memory")]
    assert more == ["peak memory 1.00 GB: 54% more than the baseline's"]  # the sign matches the words


def test_a_cpu_study_shows_no_share_of_a_nominal_roofline(data):
    settings = replace(fakes.settings(), profile=PROFILES["cpu"])
    four_bit = next(c for c in data.cards if c.record.config == fakes.FOUR_BIT)
    on_cpu = card(four_bit.record, settings, None, data.capacities)
    assert on_cpu.roofline_fraction is None and on_cpu.achieved_bandwidth_gb_s == 252.0
    assert "252 GB/s of memory bandwidth achieved in decode" in card_facts(on_cpu)


def test_cards_carry_snippets_of_their_own_plan(data):
    compiled = next(card for card in data.cards if card.record.number == 3)
    assert "model_id = 'org/model'" in compiled.python
    assert "cache_implementation='static'" in compiled.python and "CompileConfig(mode='default')" in compiled.python
    assert "device_map='cuda'" in compiled.python and "max_new_tokens=64" in compiled.python
    assert compiled.serve.startswith("transformers serve org/model --dtype bfloat16 --attn-implementation sdpa")
    assert "--compile" in compiled.serve
    document = json.loads(compiled.json)
    assert document["config"] == fakes.COMPILED
    # No capacity probed (one batch size, no SLO): one prompt, no capacity anywhere, as before capacities existed.
    assert "prompts = ['In the beginning God created the heaven and the earth.']\n" in compiled.python
    assert compiled.at_capacity is None and compiled.curve is None and "capacity" not in document
    assert data.capacities == {} and "capacity" not in render(data).split("<table class='trials'>")[1]
    assert document["generate"]["compile_config"] == {"class": "transformers.CompileConfig", "mode": "default"}


def test_importances_per_objective(data):
    importances = data.importances
    assert set(importances.by_objective) == {"throughput_tok_s", "peak_memory_gb", "kl_divergence"}
    assert importances.trials == 5 and "hints" in importances.note
    for shares in importances.by_objective.values():
        assert sum(shares.values()) == pytest.approx(1.0)
        assert all(value >= 0 for value in shares.values())
        # Conditional knobs are assessed where they apply; a knob that never varied is left out.
        assert "compile" in shares and "cache_implementation" in shares and "batching" not in shares


def test_importances_need_a_few_complete_trials(tmp_path):
    study, url = fakes.new_study(tmp_path / "two.db")
    fakes.add_complete(study, fakes.REFERENCE, fakes.metrics(100, 4.0, 0.0, 1.0, 10.0), roles=("reference",))
    fakes.add_complete(study, fakes.BASELINE, fakes.metrics(200, 2.0, 0.001, 0.99, 10.05), roles=("baseline",))
    importances = collect(study, url).importances
    assert importances.by_objective == {} and "not computed: 2 complete trials" in importances.note


def test_parallel_coordinates_have_every_knob_and_objective(data):
    parallel = data.parallel
    assert parallel.numbers == [0, 1, 2, 3, 4]
    labels = [axis.label for axis in parallel.axes]
    complete = [fakes.REFERENCE, fakes.BASELINE, fakes.FOUR_BIT, fakes.COMPILED, fakes.EAGER_FP16]
    knobs_set = [knob.name for knob in fakes.SPACE.knobs if any(knob.name in config for config in complete)]
    assert "compile" in knobs_set and "max_batch_tokens" not in knobs_set  # the failed trial #6 sets it
    assert labels == [*knobs_set, "tokens/s", "peak memory (GB)", "log10 KL"]  # knobs in the space's order
    axes = {axis.label: axis for axis in parallel.axes}
    assert axes["dtype"].ticks == ["float32", "bfloat16", "float16"]  # the space's order
    dtypes = [axes["dtype"].ticks[i] for i in axes["dtype"].values]
    assert dtypes == ["float32", "bfloat16", "bfloat16", "bfloat16", "float16"]
    assert axes["compile"].ticks == ["default", NOT_APPLICABLE]  # compile applies to the static cache only
    assert [axes["compile"].ticks[i] for i in axes["compile"].values].count("default") == 1
    assert axes["tokens/s"].values == [100, 200, 150, 400, 150]
    assert axes["log10 KL"].values[0] == -6  # KL 0 shown at the floor, 1e-6


def test_progress_hypervolume_and_best_so_far(data):
    progress_data = data.progress
    assert progress_data.numbers == list(range(8))
    assert progress_data.trial_time_s[-1] == pytest.approx(5 * 10.0 + 3 * 5.0)
    volumes = progress_data.hypervolume
    assert all(later >= earlier for earlier, later in itertools.pairwise(volumes))
    assert volumes[-1] == 1.0 and volumes[3] == 1.0 > volumes[2]  # #3 completes the front
    assert volumes[4:] == [1.0] * 4  # a dominated trial and failures add nothing
    assert progress_data.best_throughput == [100, 200, 200, 400, 400, 400, 400, 400]
    assert progress_data.best_memory == [4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert progress_data.last_improvement == 3
    assert "the budget left 1 planned trial unstarted" in progress_data.verdict  # the fake run passed one over
    assert "budget looks sufficient" in progress(data.trials).verdict  # with nothing planned left unstarted


def test_a_front_that_stopped_growing_says_nothing_of_the_budget_when_planned_trials_were_left_unstarted(data):
    """The H100's 8B search: 6 trials, the front last grew at the 3rd, 40 warm-up values not started for lack of
    budget; its report said the budget looked sufficient."""
    verdict = progress(data.trials, unstarted=40).verdict
    assert "budget left 40 planned trials unstarted: a larger budget would try them" in verdict
    assert "sufficient" not in verdict


def test_progress_says_when_the_front_was_still_growing(data):
    still_growing = progress(data.trials[:4])
    assert still_growing.last_improvement == 3 and "still growing" in still_growing.verdict


def test_progress_ignores_infeasible_trials(tmp_path):
    study, url = fakes.new_study(tmp_path / "c.db", constraints=["kl_divergence<=0.01"])
    fakes.add_complete(study, fakes.REFERENCE, fakes.metrics(100, 4.0, 0.0, 1.0, 10.0), constraints={"k": -1.0})
    fakes.add_complete(study, fakes.FOUR_BIT, fakes.metrics(300, 1.0, 0.05, 0.9, 11.0), constraints={"k": 4.0})
    report = collect(study, url)
    assert report.pareto == [0]  # the 4-bit trial is faster and leaner, but breaks kl<=0.01
    assert report.infeasible == [1]
    assert report.progress.hypervolume == [1.0, 1.0] and report.progress.best_throughput == [100, 100]
    assert [str(c) for c in report.constraints] == ["kl_divergence<=0.01"]


def test_an_empty_front_says_why_in_the_report(tmp_path):
    study, url = fakes.new_study(tmp_path / "e.db", constraints=["kl_divergence<=0.01"])
    assert collect(study, url).empty_front_reason() == "no trial has completed yet"
    fakes.add_complete(study, fakes.FOUR_BIT, fakes.metrics(300, 1.0, 0.05, 0.9, 11.0), constraints={"k": 4.0})
    report = collect(study, url)
    assert report.cards == []
    reason = "none of the 1 complete trials satisfies KL divergence vs reference <= 0.01"
    assert report.empty_front_reason() == reason
    assert f"No configuration is on the front: {escape(reason)}." in render(report)


def test_failures_are_grouped_by_reason_with_their_text(data):
    groups = {group.outcome: group for group in data.failures}
    assert list(groups) == ["oom", "broken", "error"]  # the report's fixed order of reasons
    assert [record.number for record in groups["oom"].trials] == [5]
    assert groups["oom"].meaning == "ran out of memory"
    assert groups["error"].trials[0].message == f"ValueError: {fakes.SCRIPT}"
    assert groups["broken"].trials[0].phase == "quality"


def test_environment_shows_versions_constraints_and_budget_used(data):
    environment = data.environment
    assert environment["device"] == "cuda" and environment["torch"] == "2.13.0"
    assert environment["constraints"] == "none"
    assert environment["time in trials"] == "1m05s (15.0s of it in failed trials)"
    assert environment["search runs"] == "1, 1m35s in all"
    assert environment["run 1"] == (
        "8 trials in 1m35s (--budget 30m00s); stopped: budget used up; "
        f"not started, the budget left could not finish them: {fakes.PASSED_OVER}"
    )


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts = 0
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"

    def handle_data(self, data):
        self.texts.append(data)


def test_an_error_text_with_markup_is_escaped_in_the_page(data):
    page = render(data)
    assert fakes.SCRIPT not in page
    assert "ValueError: &lt;script&gt;alert(1)&lt;/script&gt;" in page
    parser = _Elements()
    parser.feed(page)
    assert parser.scripts == 2 + page.count('class="plotly-graph-div"')  # plotly.js, copyText, one per figure
    assert any(fakes.SCRIPT in text for text in parser.texts)  # shown as text


def test_every_figure_has_a_div(data):
    page = render(data)
    for div in ("fig-front", "fig-front-3d", "fig-importance", "fig-parallel", "fig-progress"):
        assert f'id="{div}"' in page
    assert not math.isnan(data.progress.hypervolume[0])


def test_the_failures_say_which_values_are_excluded_and_which_only_suspected(tmp_path):
    from autotune import study as studies

    study, url = fakes.known_study(tmp_path / "blamed.db")
    reason = "quantization=torchao-int8 cannot run here: no torchao"
    studies.add_exclusion(study, "quantization", "torchao-int8", reason)
    studies.add_suspicion(study, "compile", "default", 6, "{}", "RuntimeError: inductor is not supported here")
    page = render(collect(study, url))
    assert "<b>excluded</b>: quantization=torchao-int8 cannot run here: no torchao" in page
    assert "<b>suspected</b>: compile=default (trial #6: RuntimeError: inductor is not supported here)" in page


# ------------------------------------------------------------------------------------------------ capacity
# fakes.capacity_study: batches 1-64 within itl_p95<=6ms. #0 reference: batch 8 predicted not to fit; #1 baseline:
# batch 32 past the SLO; #2 compiled: batch 64 out of memory; #3 continuous batching: batch 64 past the SLO; #4 eager
# fp16 meets the SLO at no batch.


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory):
    study, url = fakes.capacity_study(tmp_path_factory.mktemp("capacity") / "capacity.db")
    return collect(study, url)


def test_a_configuration_that_meets_the_slo_nowhere_is_off_the_front_with_its_reason(probed):
    assert 4 not in probed.pareto and probed.infeasible == [4]
    assert probed.infeasible_reason(probed.trials[4]) == (
        "infeasible: no capacity within itl_p95<=6ms: meets the SLO at no batch: batch 1 past the SLO: "
        "itl_p95 7 ms > 6 ms"
    )
    assert all(probed.infeasible_reason(record) == "" for record in probed.trials[:4])
    page = render(probed)
    assert "<th>capacity within itl_p95&lt;=6ms</th>" in page and "<td>none</td>" in page
    titled = "at each one's capacity within itl_p95&lt;=6ms (trials with none: figures past the SLO)"
    assert page.count(titled) == 2, page  # the front's titles, 2-D and 3-D: #4 meets the SLO at no batch
    assert "Searched under <code>a capacity within itl_p95&lt;=6ms</code>" in page


@pytest.mark.parametrize(
    ("number", "chosen", "refused", "verdict", "measured"),
    [(0, 4, 8, "memory", False), (1, 16, 32, "slo", True), (2, 32, 64, "oom", False), (3, 32, 64, "slo", True)],
)
def test_each_front_card_has_its_curve_with_the_size_chosen_and_why_the_next_was_refused(
    probed, number, chosen, refused, verdict, measured
):
    curve = next(card.curve for card in probed.cards if card.record.number == number)
    stack = fakes.STACKS[("reference", "baseline", "compiled", "continuous")[number]]
    assert curve.unit.name == "batch" and curve.latency_figures == ["itl_p95_s"]
    assert [point.size for point in curve.points][-1] == refused
    assert curve.chosen.size == chosen and curve.chosen.verdict == "met"
    assert curve.chosen.carried == stack.figures(chosen)["throughput_tok_s"]
    assert curve.chosen.latency == {"itl_p95_s": stack.figures(chosen)["itl_p95_s"]}
    assert (curve.refused.size, curve.refused.verdict) == (refused, verdict)
    assert (curve.refused.carried is not None) == measured  # past the SLO: measured; out of memory or skipped: not
    assert curve.unmeasured == ([] if measured else [curve.refused])
    assert [(line.figure, line.bound_s, line.label) for line in curve.slo_lines] == [
        ("itl_p95_s", 0.006, "SLO itl_p95<=6ms")
    ]
    assert curve.said.startswith(f"capacity within itl_p95<=6ms: batch {chosen}; batch {refused} ")


def test_a_serve_curve_is_goodput_against_the_rate_with_each_bound_of_the_slo(tmp_path):
    study, url = fakes.serve_capacity_study(tmp_path / "serve.db")
    curve = collect(study, url).cards[0].curve
    assert curve.unit.name == "rate" and curve.latency_figures == ["ttft_p95_s", "itl_p95_s"]
    assert [point.size for point in curve.points] == [1, 2, 4, 8, 12, 16]
    assert [point.carried for point in curve.points] == pytest.approx([1, 2, 4, 8 * 0.97, 10 * 0.81, 10 * 0.4])
    assert curve.chosen.size == 8 and curve.chosen.share == 0.97 and curve.refused.size == 12
    assert [line.label for line in curve.slo_lines] == ["SLO ttft_p95<=300ms", "SLO itl_p95<=50ms"]
    # Drawn as the throughput curves are (tests/report/test_report_browser.py opens those in Chromium).
    assert [trace.name for trace in capacity_chart(curve).data] == [
        "goodput (requests/s within the SLO)",
        "ttft_p95 (ms)",
        "itl_p95 (ms)",
        "SLO ttft_p95<=300ms",
        "SLO itl_p95<=50ms",
        "capacity: 8 requests/s",
    ]


def test_every_figure_a_capacity_card_states_is_said_at_its_batch_and_slo(probed):
    for front_card in probed.cards:
        facts = card_facts(front_card)
        chosen = front_card.at_capacity.size
        assert facts[0] == front_card.at_capacity.capacity_line()
        for fact in facts[1:]:
            if "quality loss" not in fact:  # KL and top-1 are teacher-forced: no batch, no SLO
                assert f"at batch {chosen:g} within itl_p95<=6ms" in fact, fact
        deployed = [fact for fact in facts if "generated tok/s end to end per GPU" in fact]
        assert len(deployed) == 1 and "per 1M generated tokens at $1.01 per GPU-hour" in deployed[0]


def test_the_snippets_carry_the_batch_chosen_and_a_paged_cache_sized_for_it(probed):
    cards = {card.record.number: card for card in probed.cards}
    baseline, continuous = cards[1], cards[3]
    measured = "# capacity within itl_p95<=6ms: batch 16; batch 32 past the SLO: itl_p95 7.65 ms > 6 ms"
    assert f"{measured}\nbatch_size = 16  #" in baseline.python
    assert "prompts = ['In the beginning God created the heaven and the earth.'] * batch_size" in baseline.python
    assert baseline.serve.endswith(f"--device cuda\n{measured}")
    # Built for batch 64, the largest tried: 6 pages of 32 tokens per request (192 tokens), 2 spare.
    assert "--cb-num-blocks 194 " in continuous.serve and "batch_size = 32" in continuous.python
    assert "num_blocks=194, max_requests_per_batch=32" in continuous.python
    document = json.loads(continuous.json)
    assert document["continuous_batching"]["num_blocks"] == 194 and document["capacity"]["capacity"] == 32
    assert document["capacity"]["within"] == "within itl_p95<=6ms"
    stored = continuous.record.plan.continuous  # as the trial ran it: sized for batch 64
    assert (stored["num_blocks"], stored["max_requests_per_batch"]) == (64 * 6 + 2, 64)


def test_a_baseline_that_meets_the_slo_nowhere_is_named_so_beside_the_ratios_with_it(probed):
    compiled, eager = probed.trials[2], probed.trials[4]  # eager fp16 meets the SLO at no batch
    facts = card_facts(card(compiled, probed.settings, eager, probed.capacities))
    missed = ", which meets the SLO at no batch (its figures are past the SLO)"
    assert f"× the baseline's throughput{missed}" in facts[1] and facts[2].endswith(f"than the baseline's{missed}")
    own = card_facts(next(c for c in probed.cards if c.record.number == 2))
    assert "× the baseline's throughput at its own capacity (batch 16)" in own[1]
