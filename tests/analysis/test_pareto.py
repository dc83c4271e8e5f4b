"""The one Pareto computation: the study's front, the front of a subset, hypervolumes, over any objectives."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune import study as studies
from autotune.analysis.pareto import hypervolume, non_dominated, raw_losses
from autotune.figures.metrics import KL_FLOOR, METRICS, OBJECTIVES, objectives_named
from autotune.report.data import collect
from autotune.study import front_numbers
from autotune.study.opened import OpenedStudy
from tests import fakes


def test_the_study_front_is_optunas_and_the_subset_test_agrees(tmp_path: Path):
    study, _ = fakes.known_study(tmp_path / "known.db")
    front = OpenedStudy.of(study, str(tmp_path / "known.db")).front
    assert [record.number for record in front] == [3, 1, 2, 0]  # best throughput first
    assert front_numbers(study) == {trial.number for trial in study.best_trials}
    complete = [record for record in studies.records(study) if record.complete]
    assert non_dominated(complete) == front_numbers(study)


def test_with_constraints_only_feasible_trials_are_on_either_front(tmp_path: Path):
    study, _ = fakes.new_study(tmp_path / "constrained.db", constraints=["kl<=0.01"])
    fakes.add_complete(study, fakes.REFERENCE, fakes.metrics(100, 4.0, 0.0, 1.0, 10.0), constraints={"kl": -0.01})
    fakes.add_complete(study, fakes.FOUR_BIT, fakes.metrics(300, 1.0, 0.05, 0.9, 11.0), constraints={"kl": 0.04})
    feasible = [record for record in studies.records(study) if record.complete and record.feasible]
    assert front_numbers(study) == non_dominated(feasible) == {0}


def test_equal_trials_are_both_on_the_front_as_in_optuna():
    records = [_record(0, 200, 2.0, 0.001), _record(1, 200, 2.0, 0.001), _record(2, 100, 3.0, 0.01)]
    assert non_dominated(records) == {0, 1}


def test_losses_follow_each_objectives_direction_and_scale():
    figures = [{"throughput_tok_s": 250.0, "peak_memory_gb": 1.5, "kl_divergence": 0.01},
               {"throughput_tok_s": 100.0, "peak_memory_gb": 3.0, "kl_divergence": 0.0}]  # fmt: skip
    # Throughput negated, memory as it is, KL as log10 above its floor.
    assert raw_losses(figures).tolist() == [[-250.0, 1.5, -2.0], [-100.0, 3.0, math.log10(KL_FLOOR)]]
    latency = objectives_named(["ttft_p95_s", "goodput_req_s"])
    assert raw_losses([{"ttft_p95_s": 0.3, "goodput_req_s": 4.0}], latency).tolist() == [[0.3, -4.0]]


def test_hypervolume_is_measured_in_as_many_dimensions_as_objectives():
    assert hypervolume(np.zeros((1, 3))) == pytest.approx(1.1**3)  # the whole box up to the reference point
    assert hypervolume(np.array([[0.0, 1.0], [1.0, 0.0]])) == pytest.approx(0.11 + 0.11 - 0.01)
    assert hypervolume(np.empty((0, 2))) == 0.0


def test_an_unknown_or_undirected_objective_is_refused():
    with pytest.raises(ValueError, match="not an objective: perplexity_change_pct, environment"):
        objectives_named(["perplexity_change_pct", "environment"])
    assert all(metric.direction for metric in OBJECTIVES) and METRICS["throughput_tok_s"] is OBJECTIVES[0]


def test_a_study_with_other_objectives_has_its_front_and_report(tmp_path: Path):
    """Other objectives (as an --objective preset will choose) go through the front and the report untouched."""
    settings = fakes.settings()
    settings.objectives = ["ttft_s", "throughput_tok_s"]
    url = f"sqlite:///{tmp_path / 'latency.db'}"
    study = studies.create_study(studies.open_storage(url), "latency", settings, seed=0)
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    assert study.metric_names == ["time to first token (p50) [s]", "decode throughput [tok/s]"]
    figures = {
        0: fakes.metrics(100, 4.0, 0.0, 1.0, 10.0, ttft_ms=30),  # on the front: lowest latency
        1: fakes.metrics(400, 2.0, 0.001, 0.99, 10.0, ttft_ms=60),  # on the front: fastest
        2: fakes.metrics(90, 1.0, 0.0, 1.0, 10.0, ttft_ms=70),  # dominated on both, though leanest
        3: fakes.metrics(150, 3.0, 0.001, 0.99, 10.0, ttft_ms=40),  # on the front: in between
    }
    configs = [fakes.REFERENCE, fakes.BASELINE, fakes.FOUR_BIT, fakes.COMPILED]
    for number, cfg in enumerate(configs):
        _add(study, cfg, figures[number], [figures[number]["ttft_s"], figures[number]["throughput_tok_s"]])
    front = OpenedStudy.of(study, url).front
    assert [record.number for record in front] == [0, 3, 1]  # lowest time to first token first
    data = collect(study, url)
    assert data.pareto == [0, 3, 1]
    assert [axis.label for axis in data.parallel.axes[-2:]] == ["time to first token (p50) (s)", "tokens/s"]
    assert data.progress.hypervolume[-1] == 1.0 and data.progress.last_improvement == 3


def _add(study: optuna.Study, cfg: dict, figures: dict[str, float], values: list[float]) -> None:
    attrs = {"config": cfg, "config_key": str(sorted(cfg.items())), "roles": ["sampler"], "outcome": "ok"}
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            params=cfg,
            distributions=fakes._distributions(cfg),
            values=values,
            user_attrs={**attrs, "duration_s": 1.0, "timings": {}, "metrics": figures},
        )
    )


def _record(number: int, throughput: float, memory_gb: float, kl: float) -> studies.TrialRecord:
    figures = {"throughput_tok_s": throughput, "peak_memory_gb": memory_gb, "kl_divergence": kl}
    return studies.TrialRecord(number, "COMPLETE", {}, (), "ok", "", None, figures, {}, {}, None, None, 1.0, None, "")
