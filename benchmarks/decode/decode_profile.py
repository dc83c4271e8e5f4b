"""Where generate()'s decode step spends the time the hand-written loop does not: torch.profiler on both, and on
autotune's decoding loops.

The same model, inputs, static cache and torch.compile mode decode in several ways, each under
torch.profiler (CPU activities), with a marker recorded as each token is produced:

- `hand`: `autotune ceiling`'s loop (autotune/worker/ceiling.py), the compiled step and the argmax, nothing else;
- `generate`: model.generate() as a user deploys it (static cache, compile_config, greedy, no stopping
  criteria of its own, max_new_tokens only);
- `autotune`: generate() as an autotune trial runs it (autotune.worker.generation.PaddedGeneration: the
  plan's arguments, an end-of-sequence id no model produces to force the length, the per-token clock);
- `autotune+LOOP`: the same through each of autotune's decoding loops (decode_loop=LOOP, custom_generate).

The steps between the first and the last quarter of the tokens are cut out of each profiled call by their
markers (--calls calls per way), and every operator that ran in them is summed per step: how often it ran
and its own CPU time. The table puts the three side by side; `step` is the wall time of one step under the
profiler, and `outside operators` is the part of it no operator accounts for (Python: generate()'s
bookkeeping); the last row counts each way's host reads of a device value per token over whole calls. --paired
then times the ways without the profiler, round by round in one process, and prints the median of each and of
their ratios to the hand loop, in wall time and in the decoding thread's CPU time.

    python benchmarks/decode/decode_profile.py --model demo --dtype float32 --batch-size 1 --paired 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

import torch
from torch.profiler import record_function

from autotune.paths import default_cache_dir
from autotune.space import Target, build_plan
from autotune.space.plan import Plan
from autotune.specs import WorkloadSpec
from autotune.worker import generation as workload_module
from autotune.worker.ceiling import HandLoop, load_model
from autotune.worker.generation import PaddedGeneration, build_inputs
from autotune.worker.loading import materialize

MARKER = "decode_profile: token"
LOOPS = ("deferred-stop", "fused-step")  # autotune's decoding loops (decode_loop), each through a trial's generate()
WAYS = ("hand", "generate", "autotune", *(f"autotune+{loop}" for loop in LOOPS))
# The operator that reads a tensor's value on the host (aten::item and aten::is_nonzero call it): on a GPU the host
# waits there for the device. A CPU tensor's read waits for nothing but is counted the same, so a CPU counts what a
# GPU would wait for.
READ = "aten::_local_scalar_dense"


def mark() -> None:
    """A zero-length profiler event: the boundary between two decode steps."""
    with record_function(MARKER):
        pass


class OnToken:
    """A stopping criterion that only calls `hook`; it returns one preallocated tensor, so it runs no operator."""

    def __init__(self, batch: int, device: torch.device, hook: Callable[[], None]) -> None:
        self.never = torch.zeros(batch, dtype=torch.bool, device=device)
        self.hook = hook

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.hook()
        return self.never


class Ways:
    """The three ways of decoding the same batch, each a call that generates `output_len` tokens."""

    def __init__(self, args: argparse.Namespace, model: Any, tokenizer: Any) -> None:
        spec = WorkloadSpec(batch_size=args.batch_size, input_len=args.input_len, output_len=args.output_len)
        rows = build_inputs(tokenizer, spec, spec.batch_size)
        self.input_ids = torch.tensor(rows, device=model.device)
        self.model = model
        config = {"dtype": args.dtype, "attn_implementation": "sdpa", "cache_implementation": "static"}
        config["compile"] = args.compile
        device_type = "cuda" if model.device.type == "cuda" else "cpu"
        target = Target(device_type, requests=args.batch_size)
        self.plan = Plan.from_json(build_plan(config, target).to_json())
        self.generate_kwargs = materialize(self.plan.generate)
        self.output_len = args.output_len
        self.pad_id = tokenizer.pad_token_id
        self.hand_loop = HandLoop(model, self.input_ids, args.output_len, args.compile)
        self.trials = {"autotune": PaddedGeneration(model, self.plan, rows, spec, tokenizer.pad_token_id)}
        for loop in LOOPS:
            plan = Plan.from_json(build_plan({**config, "decode_loop": loop}, target).to_json())
            self.trials[f"autotune+{loop}"] = PaddedGeneration(model, plan, rows, spec, tokenizer.pad_token_id)

    def run(self, way: str, hook: Callable[[], None]) -> None:
        """One call; `hook` runs as each token is produced (in autotune's way, just before its clock's mark)."""
        if way == "hand":
            self.hand_loop.generate(hook)
        elif way == "generate":
            self._plain_generate(hook)
        else:
            self._autotune_generate(self.trials[way], hook)

    def _plain_generate(self, hook: Callable[[], None]) -> None:
        from transformers import StoppingCriteriaList

        self.model.generate(
            input_ids=self.input_ids,
            attention_mask=torch.ones_like(self.input_ids),
            max_new_tokens=self.output_len,
            do_sample=False,
            pad_token_id=self.pad_id,
            stopping_criteria=StoppingCriteriaList([OnToken(self.input_ids.shape[0], self.input_ids.device, hook)]),
            **self.generate_kwargs,
        )

    def _autotune_generate(self, trial: PaddedGeneration, hook: Callable[[], None]) -> None:
        clock_call = workload_module.TokenClock.__call__

        def hooked_call(clock: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            hook()
            return clock_call(clock, *args, **kwargs)

        workload_module.TokenClock.__call__ = hooked_call  # type: ignore[method-assign]
        try:
            trial.run()
        finally:
            workload_module.TokenClock.__call__ = clock_call  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------- profiles


def profile_steps(ways: Ways, way: str, calls: int) -> tuple[dict[str, tuple[float, float]], float, float]:
    """Per decode step in the middle half of each call: {operator: (calls, self CPU µs)}, and the step's wall µs; and
    the device-to-host reads per token over whole calls (a loop may read at its end only)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    steps, wall, reads, tokens = 0, 0.0, 0, 0
    for _ in range(calls):
        events = _profiled_events(ways, way)
        reads += sum(1 for event in events if event.name == READ)
        tokens += sum(1 for event in events if event.name == MARKER)
        marks = sorted(e.time_range.start for e in events if e.name == MARKER)
        first, last = marks[len(marks) // 4], marks[3 * len(marks) // 4]
        steps += 3 * len(marks) // 4 - len(marks) // 4
        wall += last - first
        for event in events:
            if event.name != MARKER and first <= event.time_range.start < last:
                totals[event.name][0] += 1
                totals[event.name][1] += event.self_cpu_time_total
    per_step = {name: (count / steps, micros / steps) for name, (count, micros) in totals.items()}
    return per_step, wall / steps, reads / tokens


def _profiled_events(ways: Ways, way: str) -> list[Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        ways.run(way, mark)
    return list(profiler.events())


Profile = tuple[dict[str, tuple[float, float]], float, float]  # per-step operators, step wall µs, reads per token


def profile_table(profiles: dict[str, Profile], top: int) -> list[str]:
    names = sorted(
        {name for per_step, _, _ in profiles.values() for name in per_step},
        key=lambda name: -max(profiles[way][0].get(name, (0, 0))[1] for way in profiles),
    )
    header = "| operator (per decode step) | " + " | ".join(f"{way}: calls, self µs" for way in profiles) + " |"
    lines = [header, "|---|" + "---|" * len(profiles)]
    for name in names[:top]:
        cells = [_cell(profiles[way][0].get(name)) for way in profiles]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    operators = [sum(micros for _, micros in per_step.values()) for per_step, _, _ in profiles.values()]
    calls = [sum(count for count, _ in per_step.values()) for per_step, _, _ in profiles.values()]
    walls = [wall for _, wall, _ in profiles.values()]
    lines.append(
        "| all operators | " + " | ".join(f"{c:.0f}, {o:.0f}" for c, o in zip(calls, operators, strict=True)) + " |"
    )
    lines.append(
        "| outside operators (Python) | "
        + " | ".join(f"–, {w - o:.0f}" for w, o in zip(walls, operators, strict=True))
        + " |"
    )
    lines.append("| step (wall, profiled) | " + " | ".join(f"–, {w:.0f}" for w in walls) + " |")
    reads = [f"{per_token:.2f}, –" for _, _, per_token in profiles.values()]
    lines.append(f"| device-to-host reads per token (`{READ}`, whole calls) | " + " | ".join(reads) + " |")
    return lines


def _cell(entry: tuple[float, float] | None) -> str:
    return "–" if entry is None else f"{entry[0]:.3g}, {entry[1]:.1f}"


# ------------------------------------------------------------------------------------------ paired


def step_times(ways: Ways, way: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds of this thread per decode step of one call, unprofiled: (at the last token -
    at the first) / (tokens - 1). A busy shared machine's preemption lengthens the first, not the second. On CUDA the
    wall time is the device's, between events recorded at the first and the last token (a loop that does not wait
    for the device would otherwise be timed by how fast its host queues steps), and the CPU time is the host's."""
    cuda = ways.input_ids.device.type == "cuda"
    stamps: list[tuple[Any, float]] = []

    def stamp() -> None:
        event = torch.cuda.Event(enable_timing=True) if cuda else None
        if event is not None:
            event.record()
        stamps.append((event or time.perf_counter(), time.thread_time()))

    ways.run(way, stamp)
    (wall_0, cpu_0), (wall_n, cpu_n) = stamps[0], stamps[-1]
    if cuda:
        torch.cuda.synchronize()
        wall = wall_0.elapsed_time(wall_n) / 1e3
    else:
        wall = wall_n - wall_0
    return wall / (len(stamps) - 1), (cpu_n - cpu_0) / (len(stamps) - 1)


def paired(ways: Ways, rounds: int) -> list[str]:
    seen: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            seen[way].append(step_times(ways, way))
    lines = []
    for index, what in enumerate(("wall", "CPU (thread)")):
        medians = {way: statistics.median(times[index] for times in seen[way]) for way in WAYS}
        lines.append(f"paired, {rounds} rounds, median {what} µs per decode step: "
                     + ", ".join(f"{way} {medians[way] * 1e6:.0f}" for way in WAYS))  # fmt: skip
        for way in WAYS[1:]:
            ratios = [h[index] / w[index] for h, w in zip(seen["hand"], seen[way], strict=True)]
            lines.append(f"  {way}: {statistics.median(ratios):.3f}x the hand loop's speed ({what}; median of "
                         f"per-round ratios, range {min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", default="default", help="torch.compile mode of both [default]")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--top", type=int, default=25, help="operators in the table [25]")
    parser.add_argument("--calls", type=int, default=5, help="profiled calls per way, summed [5]")
    parser.add_argument("--paired", type=int, default=0, help="paired unprofiled rounds afterwards [0]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tokenizer = load_model(args.model, args.dtype, args.device, default_cache_dir())
    ways = Ways(args, model, tokenizer)
    for way in WAYS:
        for _ in range(2):  # the first call compiles
            ways.run(way, lambda: None)
    profiles = {way: profile_steps(ways, way, args.calls) for way in WAYS}
    print(f"{args.model}, {args.dtype}, batch {args.batch_size}, {args.input_len} in / {args.output_len} out, "
          f"static cache, compile {args.compile}, torch {torch.__version__}")  # fmt: skip
    print("\n".join(profile_table(profiles, args.top)))
    if args.paired:
        print("\n".join(paired(ways, args.paired)))


if __name__ == "__main__":
    main()
