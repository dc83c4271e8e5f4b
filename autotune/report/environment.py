"""The report's environment table: the device, the versions, the model, the constraints, where the quality figures
came from, and the budget the search runs used."""

from __future__ import annotations

from typing import Any

from autotune.figures.quality import EVERY_TRIAL_DECODED, path_lines
from autotune.study import StudySettings, TrialRecord
from autotune.units import format_duration


def environment(settings: StudySettings, runs: list[dict[str, Any]], launched: list[TrialRecord]) -> dict[str, str]:
    """Device, versions, model, constraints and the budget used, as label -> text."""
    prepared = settings.prepared
    rows: dict[str, Any] = {
        "device": prepared.device,
        "profile": f"{settings.profile.name}: {settings.profile.description}",
        **prepared.environment,
        "model parameters": prepared.model_info.get("parameters"),
        "reference configuration": prepared.reference_config,
        "baseline configuration": prepared.baseline_config,
        "constraints": ", ".join(settings.constraints) or "none",
    }
    measured = [(record.number, record.quality_path) for record in launched if record.complete]
    rows["quality"] = ("; ".join(path_lines(measured)) or EVERY_TRIAL_DECODED) if measured else None
    rows.update(budget_used(runs, launched))
    if prepared.hardware_note:
        rows["note"] = prepared.hardware_note
    return {key: str(value) for key, value in rows.items() if value is not None}


def budget_used(runs: list[dict[str, Any]], launched: list[TrialRecord]) -> dict[str, str]:
    in_trials = sum(record.duration_s or 0.0 for record in launched)
    failed = sum(record.duration_s or 0.0 for record in launched if not record.complete)
    rows = {"time in trials": f"{format_duration(in_trials)} ({format_duration(failed)} of it in failed trials)"}
    if not runs:
        return rows
    elapsed = sum(run.get("elapsed_s", 0.0) for run in runs)
    rows["search runs"] = f"{len(runs)}, {format_duration(elapsed)} in all"
    for i, run in enumerate(runs, 1):
        limits = [f"--budget {format_duration(run['budget_s'])}"] if run.get("budget_s") else []
        limits += [f"--trials {run['max_trials']}"] if run.get("max_trials") else []
        rows[f"run {i}"] = (
            f"{run.get('launched', 0)} trials in {format_duration(run.get('elapsed_s', 0.0))} "
            f"({', '.join(limits) or 'no limit'}); stopped: {run.get('stop_reason', '?')}"
        )
        if run.get("passed_over"):
            rows[f"run {i}"] += f"; not started, the budget left could not finish them: {'; '.join(run['passed_over'])}"
    return rows
