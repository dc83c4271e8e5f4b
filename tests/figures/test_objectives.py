"""`--objective` presets and `--objectives` lists: what each preset sets, what the user's flags override,
which objectives a device or workload cannot produce, and the strategy's trade-offs over any objectives."""

from __future__ import annotations

import pytest

from autotune.errors import StudyMismatchError, UserError
from autotune.figures.metrics import METRICS, OBJECTIVES, objectives_named
from autotune.figures.objectives import PRESETS, check_available, parse_objectives, search_goal
from autotune.profiles import PROFILES
from autotune.specs import QualitySpec, WorkloadSpec
from autotune.strategy.queue import trade_offs
from autotune.study import StudySettings
from autotune.workloads import metrics_of_one_kind


def test_each_preset_sets_its_objectives_workload_and_constraints():
    assert search_goal("latency", None, False, []) == search_goal("LATENCY", None, False, [])
    latency = search_goal("latency", None, False, [])
    assert (latency.objectives, latency.workload, latency.constraints) == (
        ("tpot_s", "ttft_s"),
        "latency",
        ("kl<=0.01", "tokens>=0.95", "degenerate<=0.25"),  # the decoding path's, and its own generations' (tier 0)
    )
    throughput = search_goal("throughput", None, False, [])
    assert throughput.objectives == ("throughput_tok_s", "peak_memory_gb") and throughput.workload == "throughput"
    assert throughput.constraints == latency.constraints
    balanced = search_goal("balanced", None, False, [])
    assert balanced.objectives == tuple(metric.name for metric in OBJECTIVES) and balanced.constraints == ()
    memory = search_goal("memory", None, False, [])
    assert memory.objectives[0] == "peak_memory_gb" and "kl_divergence" in memory.objectives
    for preset in PRESETS.values():  # every objective of a preset is a metric with a direction
        assert all(METRICS[name].direction for name in preset.objectives)


def test_the_users_flags_override_the_presets_choices():
    goal = search_goal("latency", "ttft,energy", True, ["top1>=99%"])
    assert goal.objectives == ("ttft_s", "energy_j_per_token")  # --objectives
    assert goal.workload is None  # --workload given: the preset leaves it alone
    assert goal.constraints == ("top1>=99%",)  # --constraint replaces the preset's
    assert search_goal(None, None, False, []) == search_goal(None, None, True, [])
    assert search_goal(None, None, False, []).objectives == ()  # no preset: the study's own or the default


def test_objectives_are_named_as_constraints_name_metrics():
    assert parse_objectives("goodput, memory ,kl") == ("goodput_req_s", "peak_memory_gb", "kl_divergence")
    assert parse_objectives("ttft_p95_s,itl_p95_s") == ("ttft_p95_s", "itl_p95_s")


@pytest.mark.parametrize(
    ("text", "message"),
    [("speed", "'speed' is not an objective"), ("kl,kl", "names kl_divergence twice"), ("", "'' is not an objective")],
)
def test_an_unknown_or_repeated_objective_is_bad_input(text, message):
    with pytest.raises(UserError, match=message):
        parse_objectives(text)


def test_an_unknown_preset_is_bad_input():
    with pytest.raises(UserError, match="'fast' is not a preset: use latency, throughput, balanced, memory"):
        search_goal("fast", None, False, [])


def test_an_objective_the_device_or_workload_cannot_produce_is_refused():
    check_available(
        ("goodput_req_s", "energy_j_per_token"), "serve", metrics_of_one_kind(), "cuda", has_energy_counter=True
    )
    with pytest.raises(UserError, match="goodput_req_s is measured under --workload serve only"):
        check_available(("goodput_req_s",), "throughput", metrics_of_one_kind(), "cpu", has_energy_counter=False)
    with pytest.raises(UserError, match="energy counter, and a CPU has none"):
        check_available(("energy_j_per_token",), "throughput", metrics_of_one_kind(), "cpu", has_energy_counter=False)
    with pytest.raises(UserError, match="this GPU \\(NVML reports no energy counter\\)"):
        check_available(("energy_j_per_token",), "serve", metrics_of_one_kind(), "cuda", has_energy_counter=False)


def test_a_study_resumed_with_other_objectives_is_refused_with_both_lists():
    def settings(objectives: list[str]) -> StudySettings:
        latency = WorkloadSpec("latency")
        return StudySettings("demo", None, PROFILES["cpu"], "f", {}, latency, QualitySpec(), objectives=objectives)

    with pytest.raises(StudyMismatchError, match="optimises tpot_s, ttft_s, not throughput_tok_s, peak_memory_gb"):
        settings(["throughput_tok_s", "peak_memory_gb"]).check_resumable(settings(["tpot_s", "ttft_s"]), "s")
    settings(["tpot_s", "ttft_s"]).check_resumable(settings(["tpot_s", "ttft_s"]), "s")


def test_the_strategy_composes_a_trade_off_for_every_subset_of_the_objectives():
    default = [label for label, _ in trade_offs(OBJECTIVES)]
    assert default == [
        "throughput",
        "memory",
        "quality",
        "throughput and memory",
        "throughput and quality",
        "memory and quality",
        "all three",
    ]
    latency = trade_offs(objectives_named(["tpot_s", "ttft_s"]))
    tpot, ttft = "per-token latency (p50)", "time to first token (p50)"
    assert [label for label, _ in latency] == [tpot, ttft, f"{tpot} and {ttft}"]
    assert [weights.tolist() for _, weights in latency] == [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]


def test_a_study_searched_under_an_earlier_guard_of_its_preset_keeps_it_and_one_the_user_gave_does_not():
    from autotune.search.session import constraints_on_resume
    from autotune.specs import ModelSpec, SearchRequest

    earlier, now = (
        ["kl_divergence<=0.01", "token_agreement>=0.95"],
        list(search_goal("throughput", None, False, []).constraints),
    )
    preset = SearchRequest(ModelSpec("demo"), preset_guard=True)
    assert constraints_on_resume(preset, now, earlier) == earlier
    assert constraints_on_resume(preset, now, []) == now  # searched with none: the preset's, refused as before
    assert constraints_on_resume(SearchRequest(ModelSpec("demo")), now, earlier) == now  # the user's: refused
