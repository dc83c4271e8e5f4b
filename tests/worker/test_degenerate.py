"""Tier 0: the share of a trial's own free-running generations that are degenerate where the reference's are not."""

from __future__ import annotations

import pytest

from autotune.worker.measurement.quality.degenerate import (
    EMPTY,
    LOOP,
    NO_STOP,
    ONE_TOKEN,
    degenerate_figures,
    degenerate_kind,
    loop_period,
    stopped_at,
)

EOS = frozenset({2})
TEXT = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # twelve tokens, none repeated


def test_a_row_is_cut_before_the_first_end_of_sequence_token():
    assert stopped_at([5, 6, 2, 7, 2], EOS) == [5, 6]
    assert stopped_at([5, 6, 7], EOS) == [5, 6, 7]
    assert stopped_at([2, 5], EOS) == []


@pytest.mark.parametrize(
    ("tokens", "period"),
    [
        (TEXT, None),
        ([10, 11, 12, 13, 14, 15, 16, 17, 30, 30, 30, 30], 1),  # one token, 4 times over a third of the row
        ([10, 11, 12, 13, 14, 15, 30, 31, 30, 31, 30, 31], 2),
        ([10, 11, 12, 13, 14, 15, 16, 17, 18, 30, 31, 30], None),  # one repeat is no loop
        ([10, 11, 12, 13, 14, 15, 16, 17, 18, 30, 30, 30], None),  # 3 repeats, but a quarter of the row
    ],
)
def test_a_loop_repeats_a_span_three_times_over_a_third_of_the_row(tokens, period):
    assert loop_period(tokens) == period


def test_each_kind_counts_only_where_the_reference_row_is_not_degenerate_the_same_way():
    looping = TEXT[:6] + [30, 31] * 3
    assert degenerate_kind([2, *TEXT[1:]], TEXT, EOS) == EMPTY
    assert degenerate_kind([30] * 12, TEXT, EOS) == ONE_TOKEN
    assert degenerate_kind(looping, TEXT, EOS) == LOOP
    assert degenerate_kind(looping, looping, EOS) is None  # the reference loops there too: what this model does
    stopped = [*TEXT[:5], 2, *TEXT[6:]]
    assert degenerate_kind(TEXT, stopped, EOS) == NO_STOP  # the reference stopped; the trial ran to the limit
    assert degenerate_kind([*TEXT[:7], 2, *TEXT[8:]], stopped, EOS) is None  # it stopped too, later
    assert degenerate_kind(TEXT, TEXT, EOS) is None


def test_the_share_is_of_the_trials_rows_and_says_how_many_it_judged():
    reference = [TEXT, TEXT, TEXT, TEXT]
    figures = degenerate_figures([TEXT, [30] * 12, TEXT, TEXT[:6] + [30, 31] * 3], reference, EOS)
    assert figures == {"degenerate_share": 0.5, "generations_judged": 4}
    assert degenerate_figures([[30] * 12], None, EOS)["degenerate_share"] == 1.0  # no reference: judged alone


def test_a_timed_row_cut_at_the_first_end_of_sequence_is_what_generate_with_that_token_returns(cache_dir):
    """The timed generate() is given an end-of-sequence id no model produces; cut at the model's real one, each row is
    what generate() stopping there returns. The demo model never ends a sequence, so a token it does produce (",")
    plays its end of sequence here."""
    from transformers import AutoTokenizer

    from autotune.space import Target, build_plan
    from autotune.specs import ModelSpec, WorkloadSpec
    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model

    path = str(ensure_demo_model(cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    spec = WorkloadSpec(batch_size=4, input_len=32, output_len=24)
    plan = build_plan({"dtype": "float32"}, Target("cpu"))
    model = load_model(ModelSpec("demo", path=path), plan, "cpu")
    inputs = build_inputs(tokenizer, spec, spec.batch_size)
    timed = PaddedGeneration(model, plan, inputs, spec, tokenizer.pad_token_id).run().generated
    comma = tokenizer(",", add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = comma
    stopping = PaddedGeneration(model, plan, inputs, spec, tokenizer.pad_token_id)
    stopping.kwargs["eos_token_id"] = comma
    stopped = stopping.run().generated
    cut = [stopped_at(row, frozenset({comma})) for row in timed]
    assert any(len(row) < spec.output_len for row in cut)  # some rows did stop
    for row, ended in zip(cut, stopped, strict=True):
        assert ended[: len(row)] == row and (len(row) == spec.output_len or ended[len(row)] == comma)
