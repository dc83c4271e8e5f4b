"""Is the load generator ever the bottleneck? Drive a trivial server that answers at once, and print
the request rate the generator sustains, beside the rate the demo model's `transformers serve` handles.

python benchmarks/experiments/load_generator/load_generator.py [--rates 25,50,100,200,400] [--requests 400]
    [--output-len 32]   # from the repository root

The trivial server (tests/servers.py) runs on the first core, the load generator (the same
code a serve trial runs: autotune.serving.load) on the last one, as in a trial. For each offered Poisson
rate it prints the completed requests/s, TTFT p50/p95 and the generator's CPU use. The generator keeps
up while the completed rate follows the offered one. Compare the highest such rate with the demo
server's `requests_per_s` from `autotune measure --model demo --workload serve --json`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # autotune and tests, run as a script

from autotune.serving.latency import level_figures
from autotune.serving.load import Endpoint, Requests, run_load
from autotune.serving.server import HOST, free_port, split_cores
from tests.servers import start_trivial_server


def measure_rate(target: Endpoint, rate: float, requests: int, output_len: int) -> tuple[dict, float]:
    """Figures of one Poisson level and the generator's CPU seconds per second of wall time."""
    before, started = psutil.Process().cpu_times(), time.perf_counter()
    hello = Requests.alike(["hello"], output_len)
    records = asyncio.run(run_load(target, hello, "rate", [rate], requests, warmup=5))
    wall = time.perf_counter() - started
    after = psutil.Process().cpu_times()
    cpu = (after.user - before.user + after.system - before.system) / wall
    return level_figures(rate, [r for r in records if r.level is not None], {}), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="25,50,100,200,400")
    parser.add_argument("--requests", type=int, default=400, help="requests per rate")
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    server_cores, client_cores = split_cores()
    port = free_port()
    server = start_trivial_server(port, server_cores)
    os.sched_setaffinity(0, client_cores)
    print(f"trivial server on cores {server_cores}, load generator on cores {client_cores}; "
          f"{args.requests} requests per rate, {args.output_len} streamed tokens each")  # fmt: skip
    print(f"{'offered req/s':>14} {'completed req/s':>16} {'errors':>7} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} "
          f"{'generator CPU':>14}")  # fmt: skip
    try:
        target = Endpoint(f"http://{HOST}:{port}/v1/completions", "trivial")
        for rate in (float(value) for value in args.rates.split(",")):
            figures, cpu = measure_rate(target, rate, args.requests, args.output_len)
            ttft_ms = f"{figures['ttft_p50_s'] * 1000:>12.2f} {figures['ttft_p95_s'] * 1000:>12.2f}"
            print(f"{rate:>14g} {figures['requests_per_s']:>16.1f} {figures['errors']:>7} {ttft_ms} {cpu:>13.0%}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
