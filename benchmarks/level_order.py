"""Is a load level measured right after a level above the server's capacity served as on a fresh server? A capacity
bracket bisects after its first refused level, so its next level follows an overload.

python -m benchmarks.level_order [--rounds 3] [--over 128] [--edge 96] [--flags "..."]

Each round starts `transformers serve` on the demo model (continuous batching by default, the flags a trial of the
serve recipe runs with) on the first core, the load client on the last, as a serve trial does, and measures one of:
  fresh:        the edge rate alone, after the warm-up;
  same client:  the over rate, then the edge rate on the connections the over level left open;
  new client:   the over rate, then the edge rate on new connections (what autotune.serving.levels does).
A rate level sends for 2 s (rate x 2 requests, Poisson arrivals), as under `--slo ttft_p95<=300ms`. It prints the
share of the edge level's requests within TTFT 300 ms and its TTFT p95, round by round; the ways alternate within a
round, so that the machine's drift falls on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from autotune.paths import default_cache_dir
from autotune.serving.latency import level_figures
from autotune.serving.load import Endpoint, load_client, run_level, warm_up
from autotune.serving.server import ServerProcess, free_port, serve_argv, split_cores
from autotune.specs import WorkloadSpec

CB_FLAGS = "--dtype bfloat16 --attn-implementation sdpa --continuous-batching --cb-block-size 16 --cb-num-blocks 26 " \
    "--cb-max-batch-tokens 256"  # fmt: skip
SLO = {"ttft_p95_s": 0.3}
LEVEL_S = 2.0
WAYS = ("fresh", "same client", "new client")


async def _edge_level(target: Endpoint, prompts: list[str], way: str, over: float, edge: float) -> dict:
    async with load_client(target) as client:
        await warm_up(client, target, prompts, 2)
        if way == "fresh":
            sent = await run_level(client, target, prompts, "rate", edge, int(edge * LEVEL_S))
            return level_figures(edge, sent, SLO)
        await run_level(client, target, prompts, "rate", over, int(over * LEVEL_S))
        if way == "same client":
            sent = await run_level(client, target, prompts, "rate", edge, int(edge * LEVEL_S))
            return level_figures(edge, sent, SLO)
    async with load_client(target) as client:
        sent = await run_level(client, target, prompts, "rate", edge, int(edge * LEVEL_S))
    return level_figures(edge, sent, SLO)


def measure(model: str, flags: list[str], prompts: list[str], way: str, over: float, edge: float) -> dict:
    server_cores, client_cores = split_cores()
    server = ServerProcess(serve_argv(model, flags, "cpu", free_port()), server_cores)
    mine = os.sched_getaffinity(0)
    try:
        server.start()
        server.wait_healthy(600)
        os.sched_setaffinity(0, client_cores)
        target = Endpoint(f"{server.base_url}/v1/completions", model, 16)
        return asyncio.run(_edge_level(target, prompts, way, over, edge))
    finally:
        server.stop()
        server.remove_log()
        os.sched_setaffinity(0, mine)


def demo_prompts() -> tuple[str, list[str]]:
    """The demo model's folder, and the prompts a serve trial of 32 tokens in, 16 out sends it."""
    from transformers import AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.generation import build_inputs

    model = str(ensure_demo_model(default_cache_dir()))
    tokenizer = AutoTokenizer.from_pretrained(model)
    workload = WorkloadSpec("serve", input_len=32, output_len=16)
    return model, [tokenizer.decode(ids) for ids in build_inputs(tokenizer, workload, 8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--over", type=float, default=128.0, help="a rate above the server's capacity")
    parser.add_argument("--edge", type=float, default=96.0, help="the rate measured after it")
    parser.add_argument("--flags", default=CB_FLAGS, help="the server's flags")
    args = parser.parse_args()
    model, prompts = demo_prompts()
    print(f"edge rate {args.edge:g}/s after {args.over:g}/s; share of its requests with TTFT <= 300 ms, TTFT p95")
    for round_number in range(args.rounds):
        cells = []
        for way in WAYS[round_number % len(WAYS) :] + WAYS[: round_number % len(WAYS)]:
            figures = measure(model, args.flags.split(), prompts, way, args.over, args.edge)
            cells.append(f"{way}: {figures['slo_share']:.0%}, {figures['ttft_p95_s'] * 1000:.0f} ms")
        print(f"round {round_number + 1}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
