"""Studies written before quality was measured on the decoding path (2026-11-27) are still read, and say so: their
KL, top-1 and perplexity came from one forward pass with no cache (the prefill path), and never pass as equal to a
later study's."""

from __future__ import annotations

import pytest

from autotune.analysis.compare import compare
from autotune.analysis.tolerances import DEFAULT_TOLERANCES
from autotune.errors import StudyMismatchError
from autotune.figures.quality import DECODE, GENERATE, PREFILL
from autotune.report.cards import card_facts
from autotune.report.data import collect
from autotune.study import records, stored_settings
from autotune.study.settings import StudySettings
from tests import fakes


def study_of(tmp_path, name: str, path: str | None) -> tuple:
    """Reference, baseline and a compiled trial; `path`: the quality path each names (None: a study from before)."""
    study, url = fakes.new_study(tmp_path / f"{name}.db", name)
    fakes.add_complete(
        study, fakes.REFERENCE, fakes.metrics(100, 4.0, 0.0, 1.0, 10.0), ("reference",), quality_path=path
    )
    fakes.add_complete(
        study, fakes.BASELINE, fakes.metrics(200, 2.0, 0.001, 0.99, 10.05), ("baseline",), quality_path=path
    )
    fakes.add_complete(study, fakes.COMPILED, fakes.metrics(400, 2.2, 0.004, 0.97, 10.1), quality_path=path)
    return study, url


def test_a_study_from_before_says_its_quality_came_from_the_prefill_path(tmp_path):
    study, url = study_of(tmp_path, "before", None)
    assert {record.quality_path for record in records(study) if record.complete} == {PREFILL}
    data = collect(study, url)
    assert data.environment["quality"].startswith("#0, #1, #2: quality measured on the prefill path: one forward pass")
    quality = next(fact for fact in card_facts(data.cards[0]) if fact.startswith("quality loss"))
    assert quality.endswith("a quantized cache, compilation or batching could not move these figures)")


def test_a_study_of_the_decoding_path_names_no_exception_and_one_that_judged_batching_through_generate_does(tmp_path):
    study, url = study_of(tmp_path, "after", DECODE)
    data = collect(study, url)
    assert data.environment["quality"].startswith("KL, top-1, perplexity and token agreement teacher-forced through")
    assert all("quality measured" not in fact for fact in card_facts(data.cards[0]))
    fakes.add_complete(study, fakes.CONTINUOUS, fakes.metrics(500, 1.5, 0.001, 0.99, 10.05), quality_path=GENERATE)
    assert collect(study, url).environment["quality"].startswith("#3: quality measured through generate()'s decoding")


def test_a_study_from_before_and_one_after_compare_throughput_and_memory_but_not_quality(tmp_path):
    before, _ = study_of(tmp_path, "before", None)
    after, _ = study_of(tmp_path, "after", DECODE)
    front = lambda study: {trial.number for trial in study.best_trials}  # noqa: E731
    comparison = compare(records(before), front(before), records(after), front(after), DEFAULT_TOLERANCES["cuda"])
    assert comparison.quality_apart == (
        "quality measured on other paths (A: prefill; B: decode): KL and agreements are not compared"
    )
    assert all("kl_divergence" not in movement.change for movement in comparison.movements)
    same = compare(records(after), front(after), records(after), front(after), DEFAULT_TOLERANCES["cuda"])
    assert same.quality_apart is None


def test_resuming_a_study_from_before_is_refused_in_one_line(tmp_path):
    study, _ = study_of(tmp_path, "before", None)
    before = {**stored_settings(study).to_json(), "quality": {"window": 256, "max_tokens": 2048, "top_k": 1024}}
    stored = StudySettings.from_json(before)  # what studies from before stored
    now = StudySettings.from_json(stored_settings(study).to_json())
    with pytest.raises(StudyMismatchError, match=r"measured quality on the prefill path .* pass --study NEW_NAME"):
        now.check_resumable(stored, "before")
