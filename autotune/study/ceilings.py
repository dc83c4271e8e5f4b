"""Decode ceilings stored with a study: what a hand-written decoding loop reached on the study's model and device
(`autotune ceiling`), so that its report can set the best trial against it."""

from __future__ import annotations

from typing import Any

import optuna

from autotune.errors import UserError
from autotune.process.ceiling import utc_minute
from autotune.study.optuna_internals import set_study_system_attr, study_system_attrs
from autotune.study.settings import stored_settings
from autotune.study.storage import load_stored_study

CEILINGS_ATTR = "decode_ceilings"
# A new figure replaces a stored one measured the same way.
SAME_MEASUREMENT = ("batch_size", "input_len", "output_len", "dtype", "compile")


def ceilings(study: optuna.Study) -> list[dict[str, Any]]:
    return list(study_system_attrs(study).get(CEILINGS_ATTR) or [])


def add_ceilings(study: optuna.Study, figures: list[dict[str, Any]]) -> None:
    """Store figures of the hand loop with the study, after checking they are of its model and device."""
    for figure in figures:
        check_same_model_and_device(study, figure["model"], figure["device_name"])
    keys = {_key(figure) for figure in figures}
    kept = [stored for stored in ceilings(study) if _key(stored) not in keys]
    now = utc_minute()
    set_study_system_attr(study, CEILINGS_ATTR, [*kept, *({**figure, "stored_at": now} for figure in figures)])


def store_ceilings(url: str, study_name: str, figures: list[dict[str, Any]]) -> None:
    """add_ceilings on a study in storage; a study that is not there is bad input."""
    add_ceilings(load_stored_study(url, study_name), figures)


def check_same_model_and_device(study: optuna.Study, model: str, device_name: str) -> None:
    """UserError unless the study searched `model` (as given) on the device named `device_name`."""
    check_same_device(study, device_name, check_same_model(study, model))


def check_same_model(study: optuna.Study, model: str) -> str:
    """UserError unless the study searched `model` (as given) and measured something; the device it searched on."""
    settings = stored_settings(study)
    searched_on = settings.prepared.environment.get("device_name")
    if model != settings.model:
        raise UserError(
            f"study {study.study_name!r} is of model {settings.model!r}, not {model!r}: "
            "measure the hand loop on the study's model"
        )
    if searched_on is None:
        raise UserError(f"study {study.study_name!r} has not measured anything yet: search it first")
    return searched_on


def check_same_device(study: optuna.Study, device_name: str, searched_on: str) -> None:
    """UserError unless `device_name` is the device the study searched on."""
    if device_name != searched_on:
        raise UserError(
            f"study {study.study_name!r} ran on {searched_on}, not {device_name}: "
            "measure the hand loop on the study's device"
        )


def _key(figure: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(figure.get(name) for name in SAME_MEASUREMENT)
