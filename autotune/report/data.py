"""The data behind the report, computed from the study alone (no drawing here)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import optuna

from autotune import study as studies
from autotune.metrics import KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT
from autotune.report.snippets import json_snippet, python_snippet, serve_command
from autotune.space.plan import Plan
from autotune.study import StudySettings, TrialRecord


@dataclass(frozen=True)
class ParetoCard:
    record: TrialRecord
    speedup: float | None  # throughput / baseline throughput
    memory_saving: float | None  # 1 - memory / baseline memory
    python: str
    serve: str
    json: str


@dataclass
class ReportData:
    study_name: str
    storage: str
    settings: StudySettings
    trials: list[TrialRecord]  # launched trials, in order
    skipped: list[TrialRecord]
    pareto: list[int]  # trial numbers on the front, best throughput first
    cards: list[ParetoCard]
    baseline: TrialRecord | None
    reference: TrialRecord | None
    outcomes: dict[str, int]
    generated_at: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    @property
    def complete(self) -> list[TrialRecord]:
        return [trial for trial in self.trials if trial.complete]


def collect(study: optuna.Study, storage_url: str) -> ReportData:
    settings = studies.stored_settings(study)
    all_records = studies.records(study)
    launched = [record for record in all_records if record.launched and record.outcome is not None]
    by_number = {record.number: record for record in launched}
    front = sorted(
        (by_number[number] for number in studies.pareto_numbers(study) if number in by_number),
        key=lambda record: -record.metrics[THROUGHPUT.name],
    )
    baseline = _with_role(launched, "baseline")
    model_id = _model_id_for_code(settings)
    device = settings.extra.get("device", "cuda")
    max_new_tokens = settings.workload["output_len"]
    cards = [_card(record, baseline, model_id, device, max_new_tokens) for record in front]
    return ReportData(
        study_name=study.study_name,
        storage=studies.redact(storage_url),
        settings=settings,
        trials=launched,
        skipped=[record for record in all_records if not record.launched],
        pareto=[record.number for record in front],
        cards=cards,
        baseline=baseline,
        reference=_with_role(launched, "reference"),
        outcomes=dict(Counter(record.outcome for record in launched)),
    )


def _with_role(records: list[TrialRecord], role: str) -> TrialRecord | None:
    return next((record for record in records if role in record.roles and record.complete), None)


def _model_id_for_code(settings: StudySettings) -> str:
    """The id to paste: the user's hub id or path; the demo model's cached folder for `demo`."""
    if settings.model == "demo":
        return settings.extra.get("model_path", "demo")
    return settings.model


def _card(record: TrialRecord, baseline: TrialRecord | None, model_id: str, device: str, tokens: int) -> ParetoCard:
    plan = Plan.from_json(record.plan) if record.plan else Plan()
    return ParetoCard(
        record=record,
        speedup=_ratio(record, baseline, THROUGHPUT.name),
        memory_saving=_saving(record, baseline),
        python=python_snippet(model_id, plan, device, tokens),
        serve=serve_command(model_id, plan, device),
        json=json_snippet(model_id, record.config, plan),
    )


def _ratio(record: TrialRecord, baseline: TrialRecord | None, metric: str) -> float | None:
    if baseline is None or not baseline.metrics.get(metric):
        return None
    return record.metrics[metric] / baseline.metrics[metric]


def _saving(record: TrialRecord, baseline: TrialRecord | None) -> float | None:
    ratio = _ratio(record, baseline, PEAK_MEMORY.name)
    return None if ratio is None else 1 - ratio


def objective_values(record: TrialRecord) -> dict[str, Any]:
    return {metric.name: record.metrics.get(metric.name) for metric in (THROUGHPUT, PEAK_MEMORY, KL_DIVERGENCE)}
