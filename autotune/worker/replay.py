"""A trace's requests replayed by a trial (--traffic), as a deployment serves them: generate() takes them in order in
batches of the batch size, each row ending at its own request's length and each batch when its last row does;
continuous batching takes them all at once, each with its own length. One replay of the window is one iteration.

Under the throughput kind every request is there from the replay's start (offline): its time to first token counts
from then, so a request of a later batch waits for the batches before it, as it would for continuous batching's
slots. The latency kind sends one request at a time: each counts from its own call.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from autotune.space.plan import Plan
from autotune.specs import WorkloadSpec
from autotune.worker.generation import ContinuousGeneration, Generation, PaddedGeneration
from autotune.worker.measurement.speed import Iteration, Served
from autotune.worker.traffic import ReplayRequest


class BatchedReplay:
    """generate() on the requests in order, `batch` at a time, each row to its own length."""

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
        self.batches = [
            PaddedGeneration(model, plan, [r.ids for r in chunk], spec, pad_id, [r.output_len for r in chunk])
            for chunk in (requests[start : start + batch] for start in range(0, len(requests), batch))
        ]

    def run(self) -> Iteration:
        ttfts, e2es, gaps, lengths, generated = [], [], [], [], []
        row_steps, decode_s = 0, 0.0
        origin = time.perf_counter()
        for batch in self.batches:
            call = batch.call()
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
        served = Served(ttfts, e2es, gaps, lengths, row_steps)
        return Iteration(
            elapsed_s=elapsed,
            ttft_s=sum(ttfts) / len(ttfts),
            decode_tok_s=(served.wanted - served.requests) / decode_s if decode_s > 0 else 0.0,
            e2e_tok_s=served.wanted / elapsed,
            gaps_s=[gap for row in gaps for gap in row],
            generated=generated,
            served=served,
        )

    def close(self) -> None:
        """Nothing runs between calls."""


def make_replay(
    model: Any, plan: Plan, requests: list[ReplayRequest], spec: WorkloadSpec, batch: int, pad_id: int, queued: bool
) -> Generation:
    """The replay of the requests this plan's batching runs."""
    if plan.batching == "continuous":
        inputs = [request.ids for request in requests]
        return ContinuousGeneration(model, plan, inputs, spec, [request.output_len for request in requests])
    return BatchedReplay(model, plan, requests, spec, batch, pad_id, queued)
