"""The search loop's decisions that need no model: budget estimates."""

from autotune.search.loop import expected_duration_s, overrun_reason
from autotune.study import TrialRecord


def record(config: dict, duration: float | None, outcome: str | None = "ok") -> TrialRecord:
    return TrialRecord(
        number=0, state="COMPLETE", config=config, roles=(), outcome=outcome, message="", phase=None, metrics={},
        timings={}, environment={}, plan=None, skipped=None, duration_s=duration, pid=None, log_tail="",
    )  # fmt: skip


PLAIN = {"dtype": "float32", "batching": "generate", "cache_implementation": "dynamic", "quantization": "none"}
COMPILED = {**PLAIN, "cache_implementation": "static", "compile": "default"}


def test_a_trial_is_expected_to_take_as_long_as_trials_like_it():
    history = [record(PLAIN, 10.0), record(PLAIN, 12.0), record(COMPILED, 60.0)]
    assert expected_duration_s(PLAIN, history) == 11.0
    assert expected_duration_s(COMPILED, history) == 60.0
    assert expected_duration_s({**PLAIN, "batching": "continuous"}, history) == 12.0  # none alike: all of them
    assert expected_duration_s(PLAIN, []) is None


def test_budget_stopped_and_unfinished_trials_teach_nothing_about_durations():
    history = [record(PLAIN, 3.0, outcome="budget"), record(PLAIN, None, outcome=None), record(PLAIN, 20.0)]
    assert expected_duration_s(PLAIN, history) == 20.0


def test_no_trial_starts_that_would_overrun_the_budget():
    history = [record(PLAIN, 10.0), record(COMPILED, 60.0)]
    assert overrun_reason(PLAIN, history, seconds_left=30) is None
    assert "takes about 60s and 30s are left" in overrun_reason(COMPILED, history, seconds_left=30)
    assert overrun_reason(COMPILED, [], seconds_left=1) is None  # nothing learned yet: the deadline stops it
