"""A trace's requests replayed by a trial (--traffic), as a deployment serves them: generate() takes them in order in
batches of the batch size, each row ending at its own request's length and each batch when its last row does;
continuous batching takes them all at once, each with its own length. One replay of the window is one iteration.

Under the throughput kind every request is there from the replay's start (offline): its time to first token counts
from then, so a request of a later batch waits for the batches before it, as it would for continuous batching's
slots. The latency kind sends one request at a time, through generate() or continuous batching alike: each counts
from its own call.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from autotune.space.knobs.batching import PrefixReuseKnob
from autotune.space.plan import Plan
from autotune.specs import WorkloadSpec
from autotune.worker.generation import Call, ContinuousGeneration, Generation, PaddedGeneration
from autotune.worker.measurement.speed import Iteration, Served
from autotune.worker.prefix_reuse import PromptCaches
from autotune.worker.traffic import ReplayRequest


class BatchedReplay:
    """generate() on the requests in order, `batch` at a time, each row to its own length; with prefix_reuse=on (one
    request at a time), each conversation's turn starts from the cache its previous turn left."""

    def __init__(
        self,
        model: Any,
        plan: Plan,
        requests: list[ReplayRequest],
        spec: WorkloadSpec,
        batch: int,
        pad_id: int,
        queued: bool,
    ) -> None:
        self.queued = queued
        self.requests = requests
        self.batches = [
            PaddedGeneration(model, plan, [r.ids for r in chunk], spec, pad_id, [r.output_len for r in chunk])
            for chunk in (requests[start : start + batch] for start in range(0, len(requests), batch))
        ]
        hook = plan.worker_hooks.get(PrefixReuseKnob.name)
        self.prompt_cache = hook is not None and hook.value == "on" and batch == 1
        self.continued = {request.previous for request in requests if request.previous is not None}
        self.shared = any(request.reusable for request in requests)

    def run(self) -> Iteration:
        ttfts, e2es, gaps, lengths, generated = [], [], [], [], []
        row_steps, decode_s, reused = 0, 0.0, 0
        caches = PromptCaches() if self.prompt_cache else None
        origin = time.perf_counter()
        for index, batch in enumerate(self.batches):
            call, held = self._call(batch, index, caches)
            reused += held
            base = origin if self.queued else call.start
            for row, length in zip(call.generated, batch.lengths or [], strict=True):
                times = call.times[: len(row)]  # a row's tokens are the first steps' tokens, up to its length
                ttfts.append(times[0] - base)
                e2es.append(times[-1] - base)
                gaps.append([later - earlier for earlier, later in itertools.pairwise(times)])
                lengths.append(length)
                generated.append(row)
            row_steps += len(call.times) * len(call.generated)
            decode_s += call.times[-1] - call.times[0]
        elapsed = time.perf_counter() - origin
        inputs = sum(len(request.ids) for request in self.requests)
        served = Served(ttfts, e2es, gaps, lengths, row_steps, inputs, reused if self.shared else None)
        return Iteration(
            elapsed_s=elapsed,
            ttft_s=sum(ttfts) / len(ttfts),
            decode_tok_s=(served.wanted - served.requests) / decode_s if decode_s > 0 else 0.0,
            e2e_tok_s=served.wanted / elapsed,
            gaps_s=[gap for row in gaps for gap in row],
            generated=generated,
            served=served,
        )

    def _call(self, batch: PaddedGeneration, index: int, caches: PromptCaches | None) -> tuple[Call, int]:
        """One batch's call, and how many input tokens it read from a kept prompt cache (one request a batch then)."""
        if caches is None:
            return batch.call(), 0
        request = self.requests[index]
        cache, held = caches.take(request.previous)
        call = batch.call(cache, keep_cache=index in self.continued)
        if index in self.continued:
            caches.keep(index, call.cache, len(request.ids))
        return call, held

    def close(self) -> None:
        """Nothing runs between calls."""


def make_replay(
    model: Any, plan: Plan, requests: list[ReplayRequest], spec: WorkloadSpec, batch: int, pad_id: int, queued: bool
) -> Generation:
    """The replay of the requests this plan's batching runs."""
    if plan.batching == "continuous":
        inputs, lengths = [request.ids for request in requests], [request.output_len for request in requests]
        shared = any(request.reusable for request in requests)
        alone = not queued  # the latency kind's requests, one at a time
        return ContinuousGeneration(model, plan, inputs, spec, lengths, shared_prefixes=shared, one_at_a_time=alone)
    return BatchedReplay(model, plan, requests, spec, batch, pad_id, queued)
