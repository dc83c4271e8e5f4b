"""An open-loop load generator for an OpenAI-style `/v1/completions` endpoint, streaming, with httpx.

Each request's timeline is kept (start, every streamed chunk, end), or its error. Rate mode sends
requests at their arrival times whatever the server does (open loop): Poisson arrivals, or a trace's own scaled to
the rate; concurrency mode keeps that many requests in flight. Each request asks for its own number of tokens (a
trace's, or the workload's). Warm-up requests run first, one at a time, and are marked as such.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

MAX_CONNECTIONS = 1024
ERROR_TEXT_CHARS = 300


@dataclass
class RequestRecord:
    """One request as the client saw it; times are time.perf_counter() seconds."""

    level: float | None  # None: a warm-up request
    start: float
    wanted: int = 0  # the tokens it asked for
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with text
    end: float | None = None
    tokens: int = 0  # generated tokens, from the server's usage report (else the chunks with text)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and bool(self.chunk_times)

    @property
    def ttft_s(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def e2e_s(self) -> float:
        assert self.end is not None
        return self.end - self.start

    @property
    def gaps_s(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


@dataclass(frozen=True)
class Endpoint:
    """Where to send: the completions URL, the served model name."""

    url: str
    model: str
    timeout_s: float = 120.0

    def body(self, prompt: str, output_len: int) -> dict[str, Any]:
        forced = {"min_new_tokens": output_len, "max_new_tokens": output_len, "do_sample": False}
        # transformers serve rejects `ignore_eos`; its own generation_config (a JSON string) forces the length.
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": output_len,
            "stream": True,
            "generation_config": json.dumps(forced),
        }


@dataclass(frozen=True)
class Requests:
    """What a load sends, in order and again from the first when it needs more: each request's prompt and the tokens
    it asks for; and where a trace gives them, their arrival times (seconds from the first), which a rate level scales
    to its rate instead of drawing Poisson arrivals."""

    prompts: Sequence[str]
    output_lens: Sequence[int]
    arrivals_s: Sequence[float] | None = None

    @classmethod
    def alike(cls, prompts: Sequence[str], output_len: int) -> Requests:
        """Prompts that each ask for the same number of tokens, arriving as a Poisson process."""
        return cls(prompts, [output_len] * len(prompts))

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.prompts[index % len(self.prompts)], self.output_lens[index % len(self.output_lens)]

    def arrivals(self, rate: float, count: int, rng: random.Random) -> list[float]:
        """When each of `count` requests starts, in seconds from the level's start, at `rate` requests per second:
        the trace's own arrivals scaled so that they come at that rate on average (its bursts kept), from its first
        again after its last; Poisson arrivals where the trace has none (or all at one instant)."""
        if count <= 0:
            return []
        trace = list(self.arrivals_s or [])
        span = trace[-1] - trace[0] if len(trace) > 1 else 0.0
        if span <= 0:
            return list(itertools.accumulate((rng.expovariate(rate) for _ in range(count - 1)), initial=0.0))
        period = span * len(trace) / (len(trace) - 1)  # the trace once through, and one mean gap before it starts again
        scale = (len(trace) - 1) / span / rate
        return [(index // len(trace) * period + trace[index % len(trace)] - trace[0]) * scale for index in range(count)]


async def send(
    client: httpx.AsyncClient, target: Endpoint, request: tuple[str, int], level: float | None
) -> RequestRecord:
    """One streaming completion request (its prompt and the tokens it asks for); every failure is kept in the record,
    never raised."""
    prompt, output_len = request
    record = RequestRecord(level=level, start=time.perf_counter(), wanted=output_len)
    try:
        async with client.stream("POST", target.url, json=target.body(prompt, output_len)) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:ERROR_TEXT_CHARS]}"
                return record
            await _read_stream(response, record)
    except (httpx.HTTPError, OSError) as error:
        name = type(error).__name__  # httpx's ReadError (the server closed the stream) may say nothing more
        record.error = f"{name}: {error}"[:ERROR_TEXT_CHARS] if str(error) else name
    record.end = time.perf_counter()
    if record.error is None and record.tokens != output_len:
        record.error = f"the server generated {record.tokens} of {output_len} tokens"
    return record


async def _read_stream(response: httpx.Response, record: RequestRecord) -> None:
    """Server-sent events: `data: {json}` lines, each a chunk of text; the last one carries the usage."""
    chunks = 0
    usage_tokens = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if any(choice.get("text") for choice in event.get("choices", ())):
            record.chunk_times.append(time.perf_counter())
            chunks += 1
        if event.get("usage"):
            usage_tokens = event["usage"].get("completion_tokens")
    record.tokens = usage_tokens if usage_tokens is not None else chunks


async def run_load(
    target: Endpoint,
    requests: Requests,
    mode: str,
    levels: Sequence[float],
    per_level: int,
    warmup: int,
    seed: int = 0,
) -> list[RequestRecord]:
    """Warm-up requests one at a time, then `per_level` requests at each load level, lowest first, each level on
    connections of its own."""
    async with load_client(target) as client:
        records = await warm_up(client, target, requests, warmup)
    for level in levels:
        async with load_client(target) as client:
            records += await run_level(client, target, requests, mode, level, per_level, seed)
    return records


def load_client(target: Endpoint) -> httpx.AsyncClient:
    """A client for one level: its connections close with it. A level sent on the hundreds of connections a level
    above the server's capacity left open was served worse than on new ones (docs/benchmarks.md, serve capacity)."""
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
    # trust_env=False: the server is this machine's, and HTTP_PROXY would send its requests through a proxy.
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(target.timeout_s), trust_env=False)


async def warm_up(client: httpx.AsyncClient, target: Endpoint, requests: Requests, count: int) -> list[RequestRecord]:
    """Requests one at a time, marked as warm-up (level None): they never count."""
    return [await send(client, target, requests[index], None) for index in range(count)]


async def run_level(
    client: httpx.AsyncClient,
    target: Endpoint,
    requests: Requests,
    mode: str,
    level: float,
    count: int,
    seed: int = 0,
) -> list[RequestRecord]:
    """`count` requests at one load level: arriving at `level` per second (a trace's arrivals scaled to it, else
    Poisson arrivals, the same draws at every rate for one seed), or sent by `level` clients."""
    if mode == "rate":
        return await _open_loop(client, target, requests, level, requests.arrivals(level, count, random.Random(seed)))
    return await _concurrent(client, target, requests, int(level), count)


async def _open_loop(
    client: httpx.AsyncClient, target: Endpoint, requests: Requests, rate: float, arrivals: list[float]
) -> list[RequestRecord]:
    """Open loop: request i starts at its arrival, whatever the server does."""
    begin = time.perf_counter()
    tasks = []
    for index, arrival in enumerate(arrivals):
        delay = begin + arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(client, target, requests[index], rate)))
    return list(await asyncio.gather(*tasks))


async def _concurrent(
    client: httpx.AsyncClient, target: Endpoint, requests: Requests, clients: int, count: int
) -> list[RequestRecord]:
    """`clients` loops, each sending its next request as soon as its last one ends, `count` requests in all."""
    queue = list(range(count))
    records: list[RequestRecord] = []

    async def client_loop() -> None:
        while queue:
            index = queue.pop(0)
            records.append(await send(client, target, requests[index], float(clients)))

    await asyncio.gather(*(client_loop() for _ in range(clients)))
    return records
