"""A trace replayed by a trial, on the real demo model: each request receives exactly its own output length, in
generate()'s batches (each row ending at its own length, as an end of sequence would end it) and under continuous
batching (each request with its own max_new_tokens); static batching's steps on rows whose request had ended are
counted; a request's tokens are what it would get alone; the requests are made the same on any machine, a
conversation's turn beginning with the turn before it; a prompt cache and continuous batching's shared pages reuse a
conversation's prefix without changing a token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.space import Target, build_plan
from autotune.specs import ModelSpec, WorkloadSpec
from autotune.traffic import BLOCK_TOKENS, TraceRequest

pytestmark = pytest.mark.slow

LENGTHS = [5, 12, 3, 9, 1, 7]  # two batches of three: the first runs 12 steps, the second 9


@pytest.fixture(scope="module")
def demo(cache_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model

    path = ensure_demo_model(cache_dir)
    return str(path), AutoTokenizer.from_pretrained(path, padding_side="left")


def _model(demo: tuple[Any, Any], config: dict[str, Any]) -> tuple[Any, Any]:
    from autotune.worker.loading import load_model

    plan = build_plan({"dtype": "float32", **config}, Target("cpu", 3, 256, shared_prefixes=True))
    return load_model(ModelSpec("demo", path=demo[0]), plan, "cpu"), plan


def _requests(demo: tuple[Any, Any], trace: list[TraceRequest]) -> list[Any]:
    from autotune.worker.traffic import Tokens, materialize

    torch.set_num_threads(1)
    return materialize(trace, Tokens(demo[1]))


def _alone(model: Any, request: Any, pad_id: int) -> list[int]:
    """What the request gets alone: greedy, to exactly its length."""
    ids = torch.tensor([request.ids])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=request.output_len,
        min_new_tokens=request.output_len,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return out[0, ids.shape[1] :].tolist()


TRACE = [
    TraceRequest(output, prompt=f"Request number {n} asks the model about its day and" + " more" * n)
    for n, output in enumerate(LENGTHS)
]


def test_generate_batches_end_each_row_at_its_own_length_and_count_the_steps_past_it(demo):
    from autotune.worker.replay import BatchedReplay

    model, plan = _model(demo, {})
    requests = _requests(demo, TRACE)
    replay = BatchedReplay(model, plan, requests, WorkloadSpec(), 3, demo[1].pad_token_id, queued=True)
    iteration = replay.run()
    served = iteration.served
    assert [len(row) for row in iteration.generated] == LENGTHS
    assert served.lengths == LENGTHS and served.wanted == sum(LENGTHS)
    assert served.row_steps == 3 * 12 + 3 * 9  # each batch runs until its longest row ends
    assert served.wasted_share == pytest.approx(1 - sum(LENGTHS) / (3 * 12 + 3 * 9))
    assert iteration.generated == [_alone(model, request, demo[1].pad_token_id) for request in requests]
    # every request waited for the replay's start; the second batch's waited for the first batch too
    assert all(later > earlier for earlier, later in zip(served.e2es_s[:3], served.ttfts_s[3:], strict=False))
    assert [len(gaps) for gaps in served.gaps_s] == [length - 1 for length in LENGTHS]


def test_continuous_batching_gives_each_request_its_own_length_and_no_wasted_step(demo):
    from autotune.worker.replay import make_replay

    model, plan = _model(demo, {"batching": "continuous"})
    requests = _requests(demo, TRACE)
    replay = make_replay(model, plan, requests, WorkloadSpec(), 3, demo[1].pad_token_id, queued=True)
    try:
        iteration = replay.run()
    finally:
        replay.close()
    assert [len(row) for row in iteration.generated] == LENGTHS
    assert iteration.served.row_steps == sum(LENGTHS) and iteration.served.wasted_share == 0
    assert iteration.generated == [_alone(model, request, demo[1].pad_token_id) for request in requests]


def test_the_latency_kind_sends_continuous_batching_one_request_after_the_other(demo):
    """Each request's clock starts when it is sent, once the one before it has ended: the requests' spans, end to end,
    fit in the replay's time (sent all at once, they overlap: each counts from the replay's start)."""
    from autotune.worker.replay import make_replay

    model, plan = _model(demo, {"batching": "continuous"})
    requests = _requests(demo, TRACE)
    replay = make_replay(model, plan, requests, WorkloadSpec("latency"), 1, demo[1].pad_token_id, queued=False)
    try:
        iteration = replay.run()
    finally:
        replay.close()
    served = iteration.served
    assert [len(row) for row in iteration.generated] == LENGTHS and served.wasted_share == 0
    assert sum(served.e2es_s) <= iteration.elapsed_s
    assert all(0 < ttft <= e2e for ttft, e2e in zip(served.ttfts_s, served.e2es_s, strict=True))
    assert iteration.generated == [_alone(model, request, demo[1].pad_token_id) for request in requests]


def test_requests_are_made_alike_on_any_machine_and_a_turn_begins_with_the_one_before(demo):
    """Text is tokenized; counts get corpus tokens of their own; hash ids share blocks and only them; a conversation's
    turn is the turn before (its input and reply) and its own input."""
    tokenizer = demo[1]
    trace = [
        TraceRequest(4, input_tokens=40),
        TraceRequest(4, input_tokens=40),
        TraceRequest(3, input_tokens=BLOCK_TOKENS + 20, hash_ids=(7, 8)),
        TraceRequest(3, input_tokens=BLOCK_TOKENS + 30, hash_ids=(7, 9)),
        TraceRequest(None, prompt="Hello there", reply="General Kenobi", conversation="c"),
        TraceRequest(6, prompt="And then?", conversation="c"),
        TraceRequest(2, prompt_ids=(11, 12, 13)),
    ]
    first, again = _requests(demo, trace), _requests(demo, trace)
    assert first == again
    counted_a, counted_b, blocks_a, blocks_b, turn_1, turn_2, given = first
    assert len(counted_a.ids) == len(counted_b.ids) == 40 and counted_a.ids[:3] != counted_b.ids[:3]
    assert blocks_a.ids[:BLOCK_TOKENS] == blocks_b.ids[:BLOCK_TOKENS]  # block 7
    assert blocks_a.ids[BLOCK_TOKENS:] != blocks_b.ids[BLOCK_TOKENS : BLOCK_TOKENS + 20]  # blocks 8 and 9
    assert (blocks_a.reusable, blocks_b.reusable) == (0, BLOCK_TOKENS)
    reply = tokenizer("General Kenobi", add_special_tokens=False)["input_ids"]
    own = tokenizer("And then?", add_special_tokens=False)["input_ids"]
    assert turn_1.output_len == len(reply)  # the recorded reply's tokens
    assert turn_2.ids == turn_1.ids + reply + own
    assert (turn_2.previous, turn_2.reusable) == (4, len(turn_1.ids))
    assert given.ids == [11, 12, 13]


PSALM = "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me "
GENESIS = "And the LORD God called unto Adam, and said unto him, Where art thou? And he said, I heard thy voice "
CONVERSATION = [  # first turns of more than a page of 16 tokens each, so that a later turn finds a full page
    TraceRequest(6, prompt=PSALM, conversation="a"),
    TraceRequest(5, prompt=GENESIS, conversation="b"),
    TraceRequest(8, prompt="beside the still waters.", conversation="a"),
    TraceRequest(4, prompt="in the garden, and I was afraid", conversation="b"),
    TraceRequest(7, prompt="He restoreth my soul", conversation="a"),
]


def test_a_prompt_cache_reuses_each_turns_history_and_changes_no_token(demo):
    from autotune.worker.replay import BatchedReplay

    requests = _requests(demo, CONVERSATION)
    model, plan = _model(demo, {})
    plain = BatchedReplay(model, plan, requests, WorkloadSpec(), 1, demo[1].pad_token_id, queued=False).run()
    _, cached_plan = _model(demo, {"prefix_reuse": "on"})
    assert "prefix_reuse" in cached_plan.worker_hooks
    cached = BatchedReplay(model, cached_plan, requests, WorkloadSpec(), 1, demo[1].pad_token_id, queued=False).run()
    assert cached.generated == plain.generated
    assert plain.served.reused == 0  # generate() alone reuses nothing
    assert cached.served.reused == sum(request.reusable for request in requests) > 0
    assert cached.served.input_tokens == sum(len(request.ids) for request in requests)


def test_continuous_batching_counts_the_pages_it_shares_and_none_when_told_not_to(demo):
    """Full pages of a conversation's earlier turn (page 16 here) are found in the cache; prefix_reuse=off stops it.
    Each run gets a new manager where pages are shared, so the next run does not find this run's prompts."""
    from autotune.worker.replay import make_replay

    requests = _requests(demo, CONVERSATION)
    counted = {}
    for value in ("auto", "off"):
        model, plan = _model(demo, {"batching": "continuous", "page_size": 16, "prefix_reuse": value})
        replay = make_replay(model, plan, requests, WorkloadSpec(), 3, demo[1].pad_token_id, queued=True)
        try:
            runs = [replay.run(), replay.run()]
        finally:
            replay.close()
        counted[value] = [run.served.reused for run in runs]
        assert [len(row) for row in runs[-1].generated] == [request.output_len for request in requests]
    assert counted["off"] == [0, 0]
    assert counted["auto"][0] > 0 and counted["auto"][0] == counted["auto"][1]  # the second run started afresh
