"""How long a trial is expected to take, and at most, from the trials that ended; and the strategy passing over what
the budget left may not finish."""

from __future__ import annotations

import pytest

from autotune.figures.metrics import OBJECTIVES
from autotune.paths import PACKAGED_SPACE
from autotune.space import KNOBS, load_space
from autotune.specs import WorkloadSpec
from autotune.strategy.durations import ALIKE_MARGIN, EXTRAPOLATED_MARGIN, Durations
from autotune.strategy.queue import Situation, next_queued, recommended_stacks, warm_up_set
from autotune.workloads import KINDS
from autotune.workloads.serve import MIN_LEVEL_S, ServeSpec, level_requests, level_seconds, sending_seconds

PLAIN = {"dtype": "bfloat16", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate",
         "cache_implementation": "dynamic", "compile": "off"}  # fmt: skip
FLOAT32 = {**PLAIN, "dtype": "float32"}
REDUCE_OVERHEAD = {**PLAIN, "cache_implementation": "static", "compile": "reduce-overhead"}
MAX_AUTOTUNE = {**REDUCE_OVERHEAD, "compile": "max-autotune"}


def time(name: str, value: str, device: str = "cuda") -> float:
    return KNOBS[name].expect(value, device).time  # type: ignore[arg-type]


def test_nothing_is_known_to_overrun_before_a_trial_ended():
    durations = Durations(baseline=PLAIN, device="cuda")
    assert durations.of(PLAIN).at_most is None and durations.of(MAX_AUTOTUNE).at_most is None
    # the ranking still needs an order: in plain trials, the priors' factors
    assert durations.of(MAX_AUTOTUNE).expected == time("compile", "max-autotune") > durations.of(PLAIN).expected == 1.0


def test_trials_alike_give_their_median_and_at_most_a_margin_above_it():
    durations = Durations([(PLAIN, 10.0), (FLOAT32, 12.0), (PLAIN, 11.0)], PLAIN, "cuda")
    duration = durations.of({**PLAIN, "attn_implementation": "eager"})  # attention has no duration group
    assert duration.alike and duration.expected == 11.0
    assert duration.at_most == pytest.approx(11.0 * ALIKE_MARGIN)


def test_a_compile_mode_not_run_yet_scales_the_compile_the_study_measured_by_the_priors_ratio():
    plain, compiled = 11.6, 26.75  # the H200 run: a plain trial, and reduce-overhead's
    durations = Durations([(PLAIN, plain), (REDUCE_OVERHEAD, compiled)], PLAIN, "cuda")
    ratio = (time("compile", "max-autotune") - 1) / (time("compile", "reduce-overhead") - 1)
    duration = durations.of(MAX_AUTOTUNE)
    assert not duration.alike and ratio == 3.5  # the H200 run's compile times: 74 s against 21 s
    assert duration.expected == pytest.approx(plain + (compiled - plain) * ratio)
    assert duration.at_most == pytest.approx(duration.expected * EXTRAPOLATED_MARGIN)
    # before any compile ran: a plain trial times the priors' factor
    before = Durations([(PLAIN, plain)], PLAIN, "cuda").of(MAX_AUTOTUNE)
    assert before.expected == pytest.approx(plain * time("compile", "max-autotune"))


def test_a_knob_outside_the_duration_groups_still_scales_its_trial():
    flex = {**PLAIN, "attn_implementation": "flex_attention"}  # compiles its kernel on a CPU's first call
    durations = Durations([(PLAIN, 4.0)], PLAIN, "cpu")
    assert durations.of(flex).alike
    assert durations.of(flex).expected == pytest.approx(4.0 * time("attn_implementation", "flex_attention", "cpu"))


def test_without_a_plain_trial_the_scale_comes_from_any_trial_ended():
    durations = Durations([(REDUCE_OVERHEAD, 30.0)], PLAIN, "cuda")
    assert durations.of(PLAIN).expected == pytest.approx(30.0 / time("compile", "reduce-overhead"))


# ------------------------------------------------------------------------------------------- the strategy

GPU_SPACE = load_space(PACKAGED_SPACE)
BASELINE_FULL = {"dtype": "bfloat16", "attn_implementation": "sdpa", "sdpa_backend": "auto", "quantization": "none",
                 "use_kernels": "off", "tp_size": 1, "batching": "generate", "cache_implementation": "dynamic",
                 "execution_mode": "no_grad", "speculative": "none"}  # fmt: skip


def test_a_planned_trial_that_may_not_finish_is_passed_over_for_the_next_that_fits():
    speed, _ = recommended_stacks(GPU_SPACE, BASELINE_FULL, OBJECTIVES, "throughput", "cuda")
    situation = Situation(GPU_SPACE, BASELINE_FULL, "cuda")
    durations = Durations([(BASELINE_FULL, 10.0)], BASELINE_FULL, "cuda")
    warm_up = warm_up_set(GPU_SPACE, BASELINE_FULL)
    stack_at_most = durations.of(speed.config).at_most
    assert stack_at_most is not None
    passed: list[tuple[str, float]] = []
    hear = lambda planned, at_most: passed.append((planned.why, at_most))  # noqa: E731
    fits = next_queued(situation, warm_up, {}, set(), lambda c: None, durations, stack_at_most, hear)
    assert fits == speed and passed == []  # the recommended stack first, when it fits
    instead = next_queued(situation, warm_up, {}, set(), lambda c: None, durations, stack_at_most - 1, hear)
    assert instead is not None and instead != speed
    assert passed[0] == (speed.why, stack_at_most)  # the summary names it, with the longest it may take
    at_most = durations.of(instead.config).at_most
    assert at_most is not None and at_most <= stack_at_most - 1
    nothing = next_queued(situation, warm_up, {}, set(), lambda c: None, durations, 1.0)
    assert nothing is None  # not even a plain trial fits: the sampler's turn, and the loop stops on it


def test_a_serve_bracket_of_rates_allows_its_longest_course_over_its_shortest_in_every_at_most():
    serve = KINDS["serve"]
    bracket = WorkloadSpec("serve", serve=ServeSpec("rate", [], bracket=[1.0, 8.0]), slo={"ttft_p95_s": 0.3})
    assert [level_requests(bracket, rate) for rate in (1.0, 2.0, 4.0, 8.0)] == [16] * 4  # 2 s of arrivals: under 16
    # shortest: refused at rate 1; longest: 1 sustained, 2 refused, then 1.5 and 1.25 refused (the slowest to send)
    longest = sum(sending_seconds(bracket, rate) for rate in (1.0, 2.0, 1.5, 1.25))
    allowance = serve.probe_allowance_s(bracket)
    assert allowance == pytest.approx(longest - sending_seconds(bracket, 1.0)) and allowance == pytest.approx(29.5)
    durations = Durations([(PLAIN, 10.0), (PLAIN, 11.0), (PLAIN, 12.0)], PLAIN, "cuda", allowance)
    assert durations.of(PLAIN).at_most == pytest.approx(11.0 * ALIKE_MARGIN + allowance)
    assert Durations(baseline=PLAIN, device="cuda", allowance_s=allowance).of(PLAIN).at_most is None
    # a closed loop's levels last what the server makes them; listed levels all run: nothing to allow for
    closed_loop = ServeSpec("concurrency", [], bracket=[1.0, 32.0])
    clients = WorkloadSpec("serve", serve=closed_loop, slo={"ttft_p95_s": 0.3})
    listed = WorkloadSpec("serve", serve=ServeSpec("rate", [2.0, 4.0]), slo={"ttft_p95_s": 0.3})
    assert serve.probe_allowance_s(clients) == serve.probe_allowance_s(listed) == 0.0
    assert KINDS["throughput"].probe_allowance_s(WorkloadSpec(batch_sizes=[1, 2, 4])) == 0.0


def test_a_rate_level_sends_long_enough_for_a_queue_as_long_as_the_slo_bound_and_a_client_sends_four():
    def spec(mode: str, slo: dict[str, float]) -> WorkloadSpec:
        return WorkloadSpec("serve", serve=ServeSpec(mode, [], bracket=[1.0, 128.0]), slo=slo)  # type: ignore[arg-type]

    tight, loose = spec("rate", {"ttft_p95_s": 0.3, "itl_p95_s": 5.0}), spec("rate", {"e2e_p99_s": 2.0})
    assert level_seconds(tight) == MIN_LEVEL_S and level_seconds(loose) == 4 * 2.0  # 2 bisections: a 25% step
    assert [level_requests(tight, rate) for rate in (4.0, 128.0)] == [16, 128 * MIN_LEVEL_S]
    assert level_requests(loose, 4.0) == 4 * 8
    assert [level_requests(spec("concurrency", {}), clients) for clients in (2.0, 32.0)] == [16, 32 * 4]
