"""Typed records that cross modules: a task's details and what prepare found, in their stored JSON layout.

The dictionaries below are written the way autotune stored them before these were dataclasses: old
studies and results must load, and what is written back keeps that layout.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from autotune import study as studies
from autotune.figures.metrics import OBJECTIVES
from autotune.process.results import Blame, FoundReference, Outcome, TaskDetails, TaskResult
from autotune.report.data import collect
from autotune.report.environment import environment
from autotune.report.html import render
from autotune.space.plan import Plan, Ref
from autotune.study import SETTINGS_ATTR, PreparedFacts, StudySettings
from tests import fakes

OLD_EXTRA = {
    "model_info": {"parameters": 1_000_000, "checkpoint_dtype": "float32"},
    "model_path": "/cache/models/demo",
    "environment": {"torch": "2.13.0", "transformers": "5.22.2"},
    "reference": {"config": fakes.REFERENCE, "perplexity": 10.0},
    "baseline": {"config": fakes.BASELINE},
    "device": "cpu",
    "hardware_note": None,
}


def old_settings() -> dict:
    """Settings as a study stored them before typed facts and a choice of objectives."""
    data = fakes.settings().to_json()
    del data["objectives"]
    return {**data, "extra": OLD_EXTRA}


def test_old_settings_load_with_typed_facts_and_the_default_objectives():
    settings = StudySettings.from_json(old_settings())
    assert settings.prepared.reference_config == fakes.REFERENCE and settings.prepared.reference_perplexity == 10.0
    assert settings.prepared.baseline_config == fakes.BASELINE and settings.prepared.device == "cpu"
    assert settings.prepared.model_path == "/cache/models/demo"
    assert settings.objective_metrics == OBJECTIVES
    assert settings.to_json()["extra"] == OLD_EXTRA  # written back in the same layout


def test_settings_stored_before_prepare_have_no_facts():
    settings = StudySettings.from_json({**old_settings(), "extra": {}})
    assert settings.prepared == PreparedFacts() and settings.to_json()["extra"] == {}


def test_an_old_study_opens_and_reports_as_before(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    study = optuna.create_study(study_name="old", storage=url, directions=["maximize", "minimize", "minimize"])
    study.set_user_attr(SETTINGS_ATTR, old_settings())  # where the oldest studies kept them
    fakes.add_complete(study, fakes.REFERENCE, fakes.metrics(100, 4.0, 0.0, 1.0, 10.0), roles=("reference",))
    fakes.add_complete(study, fakes.BASELINE, fakes.metrics(200, 2.0, 0.001, 0.99, 10.05), roles=("baseline",))
    loaded = studies.load_stored_study(url, "old")
    settings = studies.stored_settings(loaded)
    fakes.settings().check_resumable(settings, "old")  # same objectives: the default three
    data = collect(loaded, url)
    assert data.pareto == [1, 0]
    rows = environment(settings, [], data.trials)
    assert rows["device"] == "cpu" and rows["model parameters"] == "1000000" and rows["torch"] == "2.13.0"
    assert rows["reference configuration"] == str(fakes.REFERENCE) and "note" not in rows


def test_task_details_keep_the_json_the_worker_wrote():
    prepare = {
        "outcome": "ok",
        "details": {
            "model_path": "/cache/models/demo",
            "model": {"parameters": 10, "default_attn_implementation": "sdpa"},
            "reference": {"config": fakes.REFERENCE, "path": "ref.pt", "greedy_path": "ref.json", "perplexity": 9.5},
        },
    }
    result = TaskResult.from_json(prepare)
    assert result.details.reference == FoundReference(fakes.REFERENCE, "ref.pt", "ref.json", 9.5)
    assert result.details.model_path == "/cache/models/demo" and result.details.plan is None
    assert result.to_json()["details"] == prepare["details"]
    adapted = Plan(load={"dtype": Ref("torch.float16")}, generate={"cache_implementation": "quantized"})
    trial = TaskResult(Outcome.OK, details=TaskDetails(plan=adapted))
    assert TaskResult.from_json(trial.to_json()).details == TaskDetails(plan=adapted)
    assert TaskResult(Outcome.OOM).to_json()["details"] == {}


def test_a_failure_s_blame_is_stored_as_before_read_typed_and_shown(tmp_path):
    study, url = fakes.new_study(tmp_path / "blamed.db")
    refused = fakes.config(quantization="torchao-int8")
    for config, blame in ((refused, Blame("quantization", "torchao-int8", True)), (fakes.config("float16"), None)):
        trial = study.ask()
        studies.record_launch(trial, config, Plan(), ["sampler"])
        studies.record_result(study, trial, TaskResult(Outcome.UNSUPPORTED, "needs torchao", blame=blame), 1.0)
    first, second = study.get_trials(deepcopy=False)
    assert first.user_attrs["blame"] == {"knob": "quantization", "value": "torchao-int8", "certain": True}
    assert "blame" not in second.user_attrs
    assert [record.blame for record in studies.records(study)] == [Blame("quantization", "torchao-int8", True), None]
    assert "quantization=torchao-int8: refused (excluded for the study)" in render(collect(study, url))


def test_a_trial_that_meets_the_slo_at_no_batch_is_off_the_front_with_its_reason(tmp_path):
    from autotune.figures.capacity import Probe
    from autotune.process.results import Outcome, TaskDetails, TaskResult
    from autotune.study import front_numbers

    settings = fakes.settings()
    settings.workload = replace(settings.workload, slo={"itl_p95_s": 0.005})
    study = studies.create_study(studies.open_storage(f"sqlite:///{tmp_path}/s.db"), "slo", settings, seed=0)
    assert [str(c) for c in settings.feasibility] == ["meets_slo>=1"]
    for step_s in (0.004, 0.006):  # the second is faster in tokens/s, but its one batch misses the SLO
        probe = Probe([8], settings.workload.slo)
        probe.record(8, {"itl_p95_s": step_s})
        capacity = probe.capacity("batch")
        metrics = fakes.metrics(1000 * step_s / 0.004, 2.0, 1e-3, 0.99, 10.1, meets_slo=float(bool(capacity.chosen)))
        details = TaskDetails(capacity=capacity)
        studies.record_result(study, study.ask(), TaskResult(Outcome.OK, metrics=metrics, details=details), 3.0,
                              settings.feasibility)  # fmt: skip
    met, missed = studies.records(study)
    assert front_numbers(study) == {met.number}
    assert met.feasible and not missed.feasible
    assert missed.capacity.found() == "meets the SLO at no batch: batch 8 past the SLO: itl_p95 6 ms > 5 ms"
