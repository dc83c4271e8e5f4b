"""The search loop's decisions that need no model: budget estimates, and where the time went."""

import pytest

from autotune.figures.capacity import Probe
from autotune.process import phases
from autotune.process.results import CompileFigures, Outcome, TaskDetails, TaskResult
from autotune.search.loop import TRIAL_PROCESSES, Spending, overrun_reason
from autotune.space import config_key
from autotune.strategy.durations import ALIKE_MARGIN, Durations, ended, warm_ended
from autotune.study import TrialRecord


def record(
    config: dict, duration: float | None, outcome: str | None = "ok", compiled: CompileFigures | None = None
) -> TrialRecord:
    return TrialRecord(
        number=0, state="COMPLETE", config=config, roles=(), outcome=outcome, message="", phase=None, metrics={},
        timings={}, environment={}, plan=None, skipped=None, duration_s=duration, pid=None, log_tail="",
        compiled=compiled,
    )  # fmt: skip


PLAIN = {"dtype": "float32", "batching": "generate", "cache_implementation": "dynamic", "quantization": "none"}
COMPILED = {**PLAIN, "cache_implementation": "static", "compile": "default"}


def test_budget_stopped_and_unfinished_trials_teach_nothing_about_durations():
    history = [record(PLAIN, 3.0, outcome="budget"), record(PLAIN, None, outcome=None), record(PLAIN, 20.0)]
    assert ended(history) == [(PLAIN, 20.0)]


COLD_COMPILE = CompileFigures(graphs=1, missed=1, seconds=50.0)
WARM_COMPILE = CompileFigures(graphs=1, missed=0, seconds=6.0)
EAGER = {**COMPILED, "attn_implementation": "eager"}


def test_a_trial_expected_to_compile_warm_is_expected_from_the_warm_ones_alike():
    history = [
        record(PLAIN, 10.0),
        record(COMPILED, 60.0, compiled=COLD_COMPILE),
        record(EAGER, 16.0, compiled=WARM_COMPILE),
    ]
    assert ended(history) == [(PLAIN, 10.0), (COMPILED, 60.0)] and warm_ended(history) == [(EAGER, 16.0)]
    warm = {config_key(COMPILED), config_key(EAGER)}
    durations = Durations(ended(history), PLAIN, "cpu", warm=warm_ended(history), expected_warm=warm)
    cold = Durations(ended(history), PLAIN, "cpu", warm=warm_ended(history))
    assert durations.of(COMPILED).expected == pytest.approx(16.0)  # its code is held: like the warm one alike
    assert cold.of(COMPILED).expected == pytest.approx(60.0)  # not held: like the cold one, the warm one left out
    assert durations.of(COMPILED).at_most == pytest.approx(16.0 * ALIKE_MARGIN)


def test_no_trial_starts_that_may_overrun_the_budget():
    durations = Durations(ended([record(PLAIN, 10.0), record(COMPILED, 60.0)]), PLAIN, "cpu")
    assert overrun_reason(PLAIN, durations, seconds_left=13.5) is None  # at most 1.3 x 10 s
    assert overrun_reason(PLAIN, durations, seconds_left=12.5) == (
        "budget nearly used up: a trial like this may take up to 13s and 12s are left"
    )
    assert "may take up to 78s and 70s are left" in overrun_reason(COMPILED, durations, seconds_left=70)
    assert overrun_reason(COMPILED, Durations(baseline=PLAIN), seconds_left=1) is None  # nothing ended: no scale


# ------------------------------------------------------------------------------------ where the time went


def _ok_trial(first_call_s: float) -> TaskResult:
    timings = {"startup": 0.4, "start": 0.1, "load": 2.0, "setup": 0.5, "warmup": 6.0, "measure": 3.0, "quality": 1.0}
    return TaskResult(Outcome.OK, metrics={"first_call_s": first_call_s}, timings=timings)


def test_a_trial_that_compiles_nothing_spends_no_time_compiling():
    spending = Spending()
    spending.add_trial(_ok_trial(first_call_s=5.0), duration=15.0, compiles=False)
    assert spending.seconds == {
        "loading models": 2.5,
        "first calls": 5.0,
        "warming up": 1.0,
        "measuring": 3.0,
        "checking quality": 1.0,
        TRIAL_PROCESSES: 2.5,  # start-up, device set-up, exit: outside the phases the worker timed
    }


def test_only_the_first_call_of_a_compiled_plan_is_compiling():
    spending = Spending()
    spending.add_trial(_ok_trial(first_call_s=5.0), duration=15.0, compiles=True)
    spending.add_trial(_ok_trial(first_call_s=1.0), duration=11.0, compiles=False)
    assert spending.seconds["compiling"] == 5.0 and spending.seconds["first calls"] == 1.0
    assert spending.seconds["warming up"] == 1.0 + 5.0


def test_a_capacity_probe_compiles_at_the_first_call_of_each_batch_not_only_at_its_capacity():
    """The H100's 8B probe compiled for 35 s at batch 1 and 48 s at batch 2; its capacity's own first call (batch 64)
    took 1.2 s, and the summary said 'compiling (first calls) 1.2s, warming up 1m40s'."""
    probe = Probe([1, 2, 4], {})
    for size, first_call_s in ((1, 35.0), (2, 48.0), (4, 1.2)):
        probe.record(size, {"first_call_s": first_call_s})
    trial = _ok_trial(first_call_s=1.2)
    trial.timings["warmup"] = 90.0
    trial.details = TaskDetails(capacity=probe.capacity())
    spending = Spending()
    spending.add_trial(trial, duration=110.0, compiles=True)
    assert spending.seconds["compiling"] == 35.0 + 48.0 + 1.2
    assert spending.seconds["warming up"] == 90.0 - (35.0 + 48.0 + 1.2)


def test_compiling_trials_are_counted_cold_or_warm_and_their_compiled_code_loading_is_compiling():
    spending = Spending()
    for figures in (COLD_COMPILE, WARM_COMPILE, WARM_COMPILE, CompileFigures()):  # the last compiled nothing
        trial = _ok_trial(first_call_s=2.0)
        trial.timings[phases.COMPILE_CACHE] = 0.5
        trial.details = TaskDetails(compile=figures)
        spending.add_trial(trial, duration=15.0, compiles=figures.compiled)
    failed = TaskResult(Outcome.ERROR, timings={"warmup": 9.0}, details=TaskDetails(compile=COLD_COMPILE))
    spending.add_trial(failed, duration=10.0, compiles=True)  # its seconds are a failed trial's: so is its compile
    assert spending.compiles == {"cold": 1, "warm": 2}
    assert spending.seconds["compiling"] == 3 * (2.0 + 0.5)
    assert spending.seconds["loading models"] == 4 * 2.5 + 0.5  # where nothing compiled, loading it is loading


def test_failed_and_cut_short_trials_are_counted_whole_under_their_own_names():
    spending = Spending()
    spending.add_trial(TaskResult(Outcome.OOM, timings={"load": 1.0}), duration=4.0, compiles=True)
    spending.add_trial(TaskResult(Outcome.BUDGET), duration=2.0, compiles=False)
    assert spending.seconds == {"failed trials": 4.0, "stopped at the deadline": 2.0}
