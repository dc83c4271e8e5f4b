"""A trial's decisions that need no model: what the study read once says, and what a failure says of its values."""

from optuna.trial import TrialState

from autotune import study as studies
from autotune.process.results import Blame, Outcome, TaskResult
from autotune.search.exclusions import judge_values
from autotune.search.trial import StudyRead
from autotune.space import config_key
from autotune.study.recovery import recover_interrupted
from tests import fakes
from tests.study.test_recovery import dead_owner, reopened, start_trial


def test_the_study_read_once_answers_as_the_study_it_was_read_from(tmp_path):
    """A trial measured, an interrupted one and its queued retry: what the loop and the trial decide from."""
    fakes.new_study(tmp_path / "s.db")
    study, claims = reopened(tmp_path / "s.db")
    measured = fakes.config("float16")
    fakes.add_complete(study, measured, fakes.metrics(100.0, 1.0, 0.01, 0.99, 10.1))
    interrupted = start_trial(study, claims, dead_owner())
    recover_interrupted(study, claims)
    read = StudyRead(study.get_trials(deepcopy=False))
    waiting = (TrialState.WAITING,)
    assert read.waiting and read.get_trials(states=waiting) == study.get_trials(deepcopy=False, states=waiting)
    assert read.awaiting_retry == studies.awaiting_retry(study) == {config_key(fakes.BASELINE): interrupted}
    assert read.measured == studies.measured_keys(study) == {config_key(measured): 0}
    assert read.history() == [(0, measured, "ok"), (interrupted, fakes.BASELINE, "crashed")]


def test_a_trial_whose_outcome_is_stored_before_its_figures_is_not_yet_complete(tmp_path):
    """Another process stores a result one attribute at a time: a read between its outcome and its figures sees an
    "ok" trial, still running, without figures; planning from it met KeyError 'throughput_tok_s'."""
    study, _ = fakes.new_study(tmp_path / "s.db")
    measured = fakes.config("float16")
    fakes.add_complete(study, measured, fakes.metrics(100.0, 1.0, 0.01, 0.99, 10.1))
    storing = study.ask()
    storing.set_user_attr("config", fakes.BASELINE)
    storing.set_user_attr("outcome", Outcome.OK.value)  # record_result's first write; the figures come later
    read = StudyRead(study.get_trials(deepcopy=False))
    assert [(r.outcome, bool(r.metrics)) for r in read.records] == [("ok", True), ("ok", False)]
    assert read.complete == {config_key(measured): (measured, fakes.metrics(100.0, 1.0, 0.01, 0.99, 10.1))}


WORDS = "RuntimeError: the tokenizer's cache is not supported for this vocabulary"


def test_a_value_only_the_words_of_an_error_point_at_is_suspected_and_excluded_after_another_configuration(tmp_path):
    study, _ = fakes.new_study(tmp_path / "study.db")
    first, second = fakes.config(cache_implementation="static"), fakes.config("float16", cache_implementation="static")
    suspected = TaskResult(Outcome.UNSUPPORTED, WORDS, blame=Blame("cache_implementation", "static", certain=False))
    left = judge_values(study, fakes.SPACE, 3, first, suspected)
    assert left.violation(second) is None  # still searched: the words may be about something else
    assert studies.suspicions(study)["cache_implementation"]["static"]["trial"] == 3
    assert judge_values(study, fakes.SPACE, 4, first, suspected).violation(second) is None  # the same one again
    left = judge_values(study, fakes.SPACE, 5, second, suspected)
    assert "cache_implementation=static is suspected twice (trials #3 and #5" in (left.violation(first) or "")
    assert studies.suspicions(study) == {}


def test_a_trial_that_completes_clears_the_suspicion_of_its_values(tmp_path):
    study, _ = fakes.new_study(tmp_path / "study.db")
    first, second = fakes.config(cache_implementation="static"), fakes.config("float16", cache_implementation="static")
    suspected = TaskResult(Outcome.UNSUPPORTED, WORDS, blame=Blame("cache_implementation", "static", certain=False))
    judge_values(study, fakes.SPACE, 3, first, suspected)
    judge_values(study, fakes.SPACE, 4, fakes.config("float32", cache_implementation="static"), TaskResult(Outcome.OK))
    assert studies.suspicions(study) == {}
    assert judge_values(study, fakes.SPACE, 5, second, suspected).violation(first) is None  # suspected anew


def test_a_typed_refusal_excludes_its_value_at_once(tmp_path):
    study, _ = fakes.new_study(tmp_path / "study.db")
    config = fakes.config(quantization="torchao-int8")
    refused = TaskResult(
        Outcome.UNSUPPORTED,
        "UnsupportedError: quantization=torchao-int8 needs torchao, which is not installed: pip install torchao",
        blame=Blame("quantization", "torchao-int8", certain=True),
    )
    left = judge_values(study, fakes.SPACE, 3, config, refused)
    assert "quantization=torchao-int8 cannot run here" in (
        left.violation(fakes.config(quantization="torchao-int8")) or ""
    )
