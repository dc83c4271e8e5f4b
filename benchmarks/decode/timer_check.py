"""autotune's token clock against the one it replaced, both against a plain generate() timed only around the call.

One process, one model, the same inputs; round after round the three take turns:

- `plain`: model.generate() with the workload's arguments (the same forced length), timed only around the
  call (the device waited for before and after it), with no stopping criterion of ours;
- `events`: autotune's PaddedGeneration as a trial runs it, with its clock (a CUDA event per token, read after
  the call; the host clock on a CPU);
- `synchronizing`: the same workload with the clock autotune used before, which waited for the device at
  every token (`torch.cuda.synchronize()`) and then read the host clock.

A clock that adds no host wait leaves the call as long as the plain one. Printed: the median, over rounds, of each
timed call's length as a ratio to the plain call of its round, and each clock's decode throughput.

    python benchmarks/decode/timer_check.py --model PATH --device cuda --batch-size 1 --rounds 20
    python benchmarks/decode/timer_check.py --model demo --device cpu --set compile=off --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, when run as a script from anywhere

import torch

from autotune.space import Target, build_plan
from autotune.space.plan import Plan
from autotune.specs import ModelSpec, WorkloadSpec
from autotune.worker import generation as workload_module
from autotune.worker.generation import PaddedGeneration, build_inputs
from autotune.worker.loading import load_model
from autotune.worker.measurement.token_clock import TokenClock, synchronize

WAYS = ("plain", "events", "synchronizing")
STACK = {"dtype": "bfloat16", "attn_implementation": "sdpa", "cache_implementation": "static"}


class SynchronizingClock(TokenClock):
    """The clock before per-token events: the host waits for the device at every token, then reads its clock."""

    def mark(self) -> None:
        synchronize(self.device)
        self.marks.append(time.perf_counter())

    def times(self, started: float) -> list[float]:
        return list(self.marks)


def plain_seconds(workload: PaddedGeneration) -> float:
    """One generate() call with the workload's arguments, timed only around it."""
    synchronize(workload.model.device)
    started = time.perf_counter()
    with workload.contexts():
        workload.model.generate(
            input_ids=workload.input_ids, attention_mask=workload.attention_mask, max_new_tokens=workload.output_len,
            do_sample=False, pad_token_id=workload.pad_id, **workload.kwargs,
        )  # fmt: skip
    synchronize(workload.model.device)
    return time.perf_counter() - started


def clocked(workload: PaddedGeneration, clock: type[TokenClock]) -> tuple[float, float]:
    """The workload's call with this clock: its length and its decode throughput."""
    workload_module.TokenClock = clock  # type: ignore[misc] - the workload builds its clock from this name
    try:
        iteration = workload.run()
    finally:
        workload_module.TokenClock = TokenClock  # type: ignore[misc]
    return iteration.elapsed_s, iteration.decode_tok_s


def rounds(workload: PaddedGeneration, count: int) -> dict[str, list[tuple[float, float]]]:
    """(call seconds, decode tok/s) per way and round; plain has no per-token times, so no decode figure."""
    seen: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(count):
        seen["plain"].append((plain_seconds(workload), 0.0))
        seen["events"].append(clocked(workload, TokenClock))
        seen["synchronizing"].append(clocked(workload, SynchronizingClock))
    return seen


def report(seen: dict[str, list[tuple[float, float]]]) -> list[str]:
    plain = [seconds for seconds, _ in seen["plain"]]
    lines = [f"plain generate(): median call {statistics.median(plain) * 1e3:.2f} ms"]
    for way in WAYS[1:]:
        ratios = [seconds / base for (seconds, _), base in zip(seen[way], plain, strict=True)]
        speeds = [speed for _, speed in seen[way]]
        lines.append(
            f"{way} clock: call {statistics.median(ratios):.4f}x the plain call's length (median of per-round ratios, "
            f"range {min(ratios):.4f}-{max(ratios):.4f}); decode {statistics.median(speeds):.1f} tok/s"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="demo or a model folder [demo]")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[],
        help="knob=value over the stack (bfloat16, sdpa, static cache, compile reduce-overhead; default on CPU)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> PaddedGeneration:
    from transformers import AutoTokenizer

    from autotune.paths import default_cache_dir
    from autotune.worker.demo_model import ensure_demo_model

    path = str(ensure_demo_model(default_cache_dir())) if args.model == "demo" else args.model
    cuda = args.device.startswith("cuda")
    config: dict[str, Any] = {**STACK, "compile": "reduce-overhead" if cuda else "default"}
    config |= dict(override.split("=", 1) for override in args.overrides)
    plan = Plan.from_json(build_plan(config, Target("cuda" if cuda else "cpu", requests=args.batch_size)).to_json())
    model = load_model(ModelSpec(args.model, path=path), plan, args.device)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    spec = WorkloadSpec(batch_size=args.batch_size, input_len=args.input_len, output_len=args.output_len)
    print(f"{args.model} on {args.device} ({torch.__version__}), batch {args.batch_size}, {args.input_len} in / "
          f"{args.output_len} out: {config}", flush=True)  # fmt: skip
    return PaddedGeneration(model, plan, build_inputs(tokenizer, spec, spec.batch_size), spec, tokenizer.pad_token_id)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workload = build(args)
    rounds(workload, args.warmup)  # the first calls compile
    print("\n".join(report(rounds(workload, args.rounds))))


if __name__ == "__main__":
    main()
