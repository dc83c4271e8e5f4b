"""Decode ceilings stored with a study: only of its model and device; a new figure replaces one measured alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune import study as studies
from autotune.errors import UserError
from autotune.study.ceilings import ceilings, store_ceilings
from tests import fakes

DEVICE = "NVIDIA A10G"


def ceiling(batch: int, tok_s: float, **changes: object) -> dict[str, object]:
    """A figure as `autotune ceiling` stores it."""
    figure = {"model": "org/model", "device": "cuda:0", "device_name": DEVICE, "dtype": "bfloat16",
              "compile": "reduce-overhead", "batch_size": batch, "input_len": 128, "output_len": 64,
              "decode_tok_s": tok_s, "decode_tok_s_cv": 0.01, "iterations": 5, "achieved_bandwidth_gb_s": 100.0,
              "roofline_fraction": 0.2, "peak_bandwidth_gb_s": 600.0, "copy_bandwidth_gb_s": 500.0,
              "torch": "2.11.0", "transformers": "5.22.2"}  # fmt: skip
    return {**figure, **changes}


def prepared_study(tmp_path, make=fakes.known_study):
    """fakes.known_study (or another of fakes' studies), with the device its prepare step found."""
    study, url = make(tmp_path / "known.db")
    settings = studies.stored_settings(study)
    environment = {**settings.prepared.environment, "device_name": DEVICE}
    studies.update_settings(study, replace(settings, prepared=replace(settings.prepared, environment=environment)))
    return study, url


def test_figures_of_the_studys_model_and_device_are_stored_and_a_new_one_replaces_the_same_measurement(tmp_path):
    study, url = prepared_study(tmp_path)
    store_ceilings(url, study.study_name, [ceiling(8, 500.0), ceiling(1, 80.0)])
    store_ceilings(url, study.study_name, [ceiling(8, 520.0)])
    stored = ceilings(studies.load_stored_study(url, study.study_name))
    assert sorted((f["batch_size"], f["decode_tok_s"]) for f in stored) == [(1, 80.0), (8, 520.0)]
    assert all(f["stored_at"].endswith("UTC") for f in stored)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model": "other/model"}, "study 'fake' is of model 'org/model', not 'other/model'"),
        ({"device_name": "NVIDIA H200"}, "study 'fake' ran on NVIDIA A10G, not NVIDIA H200"),
    ],
)
def test_a_figure_of_another_model_or_device_is_refused_and_nothing_is_stored(tmp_path, changes, words):
    study, url = prepared_study(tmp_path)
    with pytest.raises(UserError, match=words):
        store_ceilings(url, study.study_name, [ceiling(1, 80.0), ceiling(8, 500.0, **changes)])
    assert ceilings(study) == []


def test_a_study_that_is_not_there_is_bad_input(tmp_path):
    with pytest.raises(UserError, match="no study named 'missing'"):
        store_ceilings(f"sqlite:///{tmp_path / 'none.db'}", "missing", [ceiling(8, 500.0)])
    assert not (tmp_path / "none.db").exists()
