"""What each setting transformers offers does to generate()'s decode step: paired rounds in one process.

Every variant is generate() with a static cache and a compiled decode step (CompileConfig), greedy, the same
inputs and the same forced length, each on its own copy of the model (a compiled call is kept per model, so
the variants never recompile each other). Round after round each variant generates once; its decode step
time is (last token's time - first token's) / (tokens - 1), read by a stopping criterion that runs no operator,
in wall time and in the decoding thread's CPU time (which a busy shared machine's preemption does not lengthen).
Printed per variant: the median step time and the median over rounds of its speed relative to `base`.

Variants (--variants, comma-separated; base always runs):
  base               CompileConfig(mode=--mode), min_new_tokens forcing the length (as autotune measured before)
  fullgraph          CompileConfig(fullgraph=True): no graph break allowed
  static-shapes      CompileConfig(dynamic=False): never a dynamic-shape graph
  freezing           compiled under torch._inductor.config.patch(freezing=True): weights folded as constants
  inference-mode     generate() inside torch.inference_mode()
  no-min-new-tokens  max_new_tokens alone: a deployment's call, and what autotune's end-of-sequence id no model
                     produces costs per step (the model's own end of sequence must not come first: checked)

    python benchmarks/decode/generate_settings.py --model demo --dtype float32 --batch-size 1 --rounds 20
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

import torch

from autotune.paths import default_cache_dir
from autotune.specs import WorkloadSpec
from autotune.worker.ceiling import load_model
from autotune.worker.generation import build_inputs

VARIANTS = ("base", "fullgraph", "static-shapes", "freezing", "inference-mode", "no-min-new-tokens")


@dataclass
class Variant:
    name: str
    model: Any
    compile_config: dict[str, Any]
    context: Any = contextlib.nullcontext
    forced_length: bool = True
    steps: list[tuple[float, float]] = field(default_factory=list)  # (wall, thread CPU) seconds per step


class StepClock:
    """Wall and thread CPU time at each token; returns one preallocated tensor, so it runs no operator."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.never = torch.zeros(batch, dtype=torch.bool, device=device)
        self.times: list[tuple[float, float]] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.times.append((time.perf_counter(), time.thread_time()))
        return self.never

    def per_step(self) -> tuple[float, float]:
        (wall_0, cpu_0), (wall_n, cpu_n) = self.times[0], self.times[-1]
        return (wall_n - wall_0) / (len(self.times) - 1), (cpu_n - cpu_0) / (len(self.times) - 1)


def variant(name: str, args: argparse.Namespace) -> Variant:
    model, _ = load_model(args.model, args.dtype, args.device, default_cache_dir())
    config: dict[str, Any] = {"mode": args.mode}
    if name == "fullgraph":
        return Variant(name, model, {**config, "fullgraph": True})
    if name == "static-shapes":
        return Variant(name, model, {**config, "dynamic": False})
    if name == "freezing":
        return Variant(name, model, config, context=lambda: torch._inductor.config.patch(freezing=True))
    if name == "inference-mode":
        return Variant(name, model, config, context=torch.inference_mode)
    return Variant(name, model, config, forced_length=name != "no-min-new-tokens")


def step_seconds(v: Variant, input_ids: torch.Tensor, output_len: int) -> tuple[float, float]:
    from transformers import CompileConfig, StoppingCriteriaList

    compile_config = CompileConfig(**v.compile_config)
    compile_config._compile_all_devices = True  # generate() compiles on CUDA only unless told
    clock = StepClock(input_ids.shape[0], input_ids.device)
    forced = {"min_new_tokens": output_len} if v.forced_length else {}
    with v.context():
        output = v.model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=output_len,
            do_sample=False, pad_token_id=0, cache_implementation="static", compile_config=compile_config,
            stopping_criteria=StoppingCriteriaList([clock]), **forced,
        )  # fmt: skip
    if output.shape[1] - input_ids.shape[1] != output_len:
        raise SystemExit(f"{v.name}: generate() stopped after {output.shape[1] - input_ids.shape[1]} tokens")
    return clock.per_step()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--mode", default="default", help="CompileConfig mode [default]")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS[1:]))
    parser.add_argument("--rounds", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = ["base", *(name for name in args.variants.split(",") if name and name != "base")]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}: choose among {', '.join(VARIANTS)}")
    variants = [variant(name, args) for name in names]
    _, tokenizer = load_model(args.model, args.dtype, args.device, default_cache_dir())
    spec = WorkloadSpec(batch_size=args.batch_size, input_len=args.input_len, output_len=args.output_len)
    input_ids = torch.tensor(build_inputs(tokenizer, spec, spec.batch_size), device=args.device)
    for v in variants:
        for _ in range(2):  # the first call compiles
            step_seconds(v, input_ids, args.output_len)
    for _ in range(args.rounds):
        for v in variants:
            v.steps.append(step_seconds(v, input_ids, args.output_len))
    print(f"{args.model}, {args.dtype}, batch {args.batch_size}, {args.input_len} in / {args.output_len} out, static "
          f"cache, compile {args.mode}, torch {torch.__version__}, {args.rounds} paired rounds")  # fmt: skip
    base = variants[0].steps
    for index, what in enumerate(("wall", "CPU")):
        print(f" {what} time of the decoding thread:" if what == "CPU" else " wall time:")
        for v in variants:
            speedups = [b[index] / s[index] for b, s in zip(base, v.steps, strict=True)]
            step = statistics.median(s[index] for s in v.steps)
            print(f"  {v.name:18} {step * 1e6:8.0f} µs/step   speed vs base: median {statistics.median(speedups):.3f}x "
                  f"(range {min(speedups):.3f}-{max(speedups):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
