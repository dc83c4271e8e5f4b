"""Constraints: the parser `search --constraint` and `best` share, and how Optuna takes them."""

from __future__ import annotations

import optuna
import pytest
from optuna.samplers._tpe.sampler import _split_trials

from autotune import study as studies
from autotune.errors import StudyMismatchError, UserError
from autotune.figures.constraints import Constraint, parse_constraint, parse_constraints
from autotune.process.results import Outcome, TaskResult
from tests import fakes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("peak_memory_gb<=20", Constraint("peak_memory_gb", "<=", 20.0)),
        ("memory<=20GB", Constraint("peak_memory_gb", "<=", 20.0)),
        ("mem <= 512 MB", Constraint("peak_memory_gb", "<=", 0.512)),
        ("memory<20GiB", Constraint("peak_memory_gb", "<", 20 * 1024**3 / 1e9)),
        ("kl<=0.01", Constraint("kl_divergence", "<=", 0.01)),
        ("KL <= 1e-3", Constraint("kl_divergence", "<=", 0.001)),
        ("throughput>=500", Constraint("throughput_tok_s", ">=", 500.0)),
        ("throughput > 500 tok/s", Constraint("throughput_tok_s", ">", 500.0)),
        ("ttft_ms<=50", Constraint("ttft_s", "<=", 0.05)),
        ("ttft<=50ms", Constraint("ttft_s", "<=", 0.05)),
        ("ttft_s<=0.05", Constraint("ttft_s", "<=", 0.05)),
        ("top1>=99%", Constraint("top1_agreement", ">=", 0.99)),
        ("cost<=0.5", Constraint("cost_per_million_tokens_usd", "<=", 0.5)),
        ("roofline>=50%", Constraint("roofline_fraction", ">=", 0.5)),
    ],
)
def test_parse_names_units_and_operators(text, expected):
    parsed = parse_constraint(text)
    assert parsed.metric == expected.metric and parsed.op == expected.op
    assert parsed.bound == pytest.approx(expected.bound)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory", "write it as METRIC OP VALUE"),
        ("memory=20", "write it as METRIC OP VALUE"),
        ("memory<=lots", "write it as METRIC OP VALUE"),
        ("speed>=5", "unknown metric 'speed'"),
        ("memory<=20ms", "peak_memory_gb is in GB, and 'ms' does not convert to it"),
        ("kl<=5GB", "kl_divergence is in nats/token"),
    ],
)
def test_unparsable_constraints_are_bad_input_that_names_them(text, message):
    with pytest.raises(UserError, match=message) as error:
        parse_constraint(text)
    assert repr(text) in str(error.value)


def test_violation_is_feasible_exactly_when_the_bound_holds():
    below = Constraint("peak_memory_gb", "<=", 20.0)
    assert below.violation({"peak_memory_gb": 10.0}) == pytest.approx(-0.5) and below.holds({"peak_memory_gb": 10.0})
    assert below.violation({"peak_memory_gb": 30.0}) == pytest.approx(0.5)
    assert below.violation({"peak_memory_gb": 20.0}) == 0 and below.holds({"peak_memory_gb": 20.0})
    strict = Constraint("peak_memory_gb", "<", 20.0)
    assert strict.violation({"peak_memory_gb": 20.0}) > 0 and not strict.holds({"peak_memory_gb": 20.0})
    above = Constraint("throughput_tok_s", ">=", 100.0)
    assert above.violation({"throughput_tok_s": 150.0}) < 0 < above.violation({"throughput_tok_s": 50.0})
    # A figure the trial did not measure cannot be shown to hold.
    cost = Constraint("cost_per_million_tokens_usd", "<=", 1.0)
    assert cost.violation({}) > 0 and not cost.holds({})


def test_parse_constraints_keeps_order_and_drops_repeats():
    parsed = parse_constraints(["kl<=0.01", "memory<=20GB", "kl_divergence<=0.01"])
    assert [str(c) for c in parsed] == ["kl_divergence<=0.01", "peak_memory_gb<=20"]
    assert parse_constraints([str(c) for c in parsed]) == parsed  # stored form reads back the same


def _tell(study: optuna.Study, figures: dict[str, float], constraints: list[Constraint]) -> int:
    trial = study.ask()
    trial.suggest_categorical("dtype", ["bfloat16"])
    studies.record_result(study, trial, TaskResult(Outcome.OK, metrics=figures), 1.0, constraints)
    return trial.number


def test_record_result_passes_constraints_to_optuna_and_best_trials_keeps_only_feasible_ones(tmp_path):
    study, _ = fakes.new_study(tmp_path / "s.db")
    constraints = parse_constraints(["kl<=0.01", "memory<=2GB"])
    fast_but_inexact = _tell(study, fakes.metrics(400, 1.5, 0.05, 0.9, 11), constraints)
    exact = _tell(study, fakes.metrics(100, 1.8, 0.0, 1.0, 10), constraints)
    lean = _tell(study, fakes.metrics(120, 1.0, 0.005, 0.99, 10.1), constraints)
    failed = study.ask()
    studies.record_result(study, failed, TaskResult(Outcome.OOM, message="out of memory"), 1.0, constraints)
    trials = study.get_trials()
    assert trials[fast_but_inexact].constraints == {
        "kl_divergence<=0.01": pytest.approx(4.0),
        "peak_memory_gb<=2": pytest.approx(-0.25),
    }
    assert trials[failed.number].constraints == {}  # failures have no values and no constraints
    assert {t.number for t in study.best_trials} == {exact, lean}  # the fastest breaks kl<=0.01
    # TPE (autotune's sampler) ranks an infeasible trial below every feasible one.
    below, above = _split_trials(study, study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), 2)
    assert {t.number for t in below} == {exact, lean} and fast_but_inexact in {t.number for t in above}


def test_resuming_keeps_or_repeats_the_constraints_and_refuses_others():
    stored = fakes.settings(constraints=["kl_divergence<=0.01"])
    fakes.settings(constraints=["kl_divergence<=0.01"]).check_resumable(stored, "s")  # the same command
    fakes.settings(constraints=[]).check_resumable(stored, "s")  # none given: the study's are kept
    with pytest.raises(StudyMismatchError, match=r"searched with kl_divergence<=0.01, not kl_divergence<=0.05"):
        fakes.settings(constraints=["kl_divergence<=0.05"]).check_resumable(stored, "s")
    with pytest.raises(StudyMismatchError, match="searched with no constraints"):
        fakes.settings(constraints=["kl_divergence<=0.05"]).check_resumable(fakes.settings(), "s")


def test_settings_of_a_study_stored_before_constraints_existed_read_back():
    data = fakes.settings().to_json()
    del data["constraints"]
    assert studies.StudySettings.from_json(data).constraints == []
