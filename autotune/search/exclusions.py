"""The exclusion rules: what a trial's failure says of its knob values, for the rest of the study. A typed refusal
excludes its value; a value the words of an error point at is suspected, and excluded when another configuration fails
on it too (stored with the study: study/settings.py)."""

from __future__ import annotations

import optuna

from autotune import study as studies
from autotune.process.results import TaskResult
from autotune.space import Config, SearchSpace, config_key


def judge_values(
    study: optuna.Study, declared: SearchSpace, number: int, config: Config, result: TaskResult
) -> SearchSpace:
    """What a trial's result says of its values; the space left to search.

    A typed refusal excludes its value for the study. A value only the words of an error point at is suspected,
    and excluded when a trial of another configuration fails on it too; a trial that completes clears the
    suspicion of its values.
    """
    blame = result.blame
    if blame is not None and blame.certain:
        knob, value = blame.knob, blame.value
        studies.add_exclusion(study, knob, value, f"{knob}={value} cannot run here: {_first_line(result.message)}")
    elif blame is not None:
        knob, value = blame.knob, blame.value
        earlier = studies.suspicions(study).get(knob, {}).get(str(value))
        if earlier is None:
            studies.add_suspicion(study, knob, value, number, config_key(config), _first_line(result.message))
        elif earlier["config_key"] != config_key(config):
            why = f"trials #{earlier['trial']} and #{number} failed with words that point at it"
            reason = f"{knob}={value} is suspected twice ({why}): {_first_line(result.message)}"
            studies.add_exclusion(study, knob, value, reason)
    elif result.ok:
        suspected = studies.suspicions(study)
        for knob, value in config.items():
            if str(value) in suspected.get(knob, {}):
                studies.clear_suspicion(study, knob, value)
    return studies.space_with_exclusions(declared, study)


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""
