"""The decode ceiling: a hand-written greedy decoding loop, as gpt-fast writes it, on any model and device.

Under torch.no_grad: a static KV cache, one uncompiled prefill, then one decode step (the model's forward and
the argmax) compiled with torch.compile (reduce-overhead on CUDA, so one CUDA graph per step; default on a CPU) and
called once per token with nothing else between steps: no logits processing, no stopping criteria, no
host wait. Its inputs are autotune's workload (the bundled prompts, each exactly --input-len tokens), so
its figures compare with a trial's. For each --batch-size it prints the decode throughput (tokens after
each row's first, per second of decoding, as autotune measures it) and its share of the memory-bandwidth
roofline (bytes one step reads x steps per second, over the hardware profile's peak, as autotune's
`roofline_fraction`), with the device's measured copy bandwidth beside it.

    python benchmarks/decode_ceiling.py --model demo --device cpu --batch-size 1 --batch-size 8
    python benchmarks/decode_ceiling.py --model PATH --device cuda --batch-size 1 --batch-size 8 --json
    python benchmarks/decode_ceiling.py --model demo --device cpu --study demo-cpu --storage sqlite:///studies/demo-cpu.db

With --study, the figures are also stored with that study (its model and device must be the ones measured
here), and its report shows them beside its best trial (`autotune report` renders it again).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # autotune, when run as a script from anywhere

import torch

from autotune.errors import UserError
from autotune.paths import default_cache_dir
from autotune.specs import WorkloadSpec
from autotune.study.ceilings import utc_minute
from autotune.worker.measurement.speed import decode_bytes_per_step, kv_bytes_per_token, roofline
from autotune.worker.measurement.timing import repeat_until
from autotune.worker.measurement.token_clock import TokenClock

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}  # the buffer the copy bandwidth is measured on


@dataclass(frozen=True)
class Ceiling:
    """The hand loop's figures at one batch size; what a study stores (autotune.study.ceilings)."""

    model: str  # as given: demo, a folder or a hub id
    device: str
    device_name: str
    dtype: str
    compile: str  # torch.compile mode of the decode step, or off
    batch_size: int
    input_len: int
    output_len: int
    decode_tok_s: float  # median over iterations
    decode_tok_s_cv: float
    iterations: int
    achieved_bandwidth_gb_s: float
    roofline_fraction: float  # of the profile's peak
    peak_bandwidth_gb_s: float
    copy_bandwidth_gb_s: float  # measured here: a device-to-device copy, bytes read + written per second
    torch: str
    transformers: str
    measured_at: str  # when its iterations ended (a figure can be stored with a study later)

    @property
    def copy_fraction(self) -> float:
        return self.achieved_bandwidth_gb_s / self.copy_bandwidth_gb_s

    def line(self) -> str:
        return (
            f"hand loop, batch {self.batch_size}, {self.dtype}, compile {self.compile}: {self.decode_tok_s:.1f} tok/s "
            f"(cv {self.decode_tok_s_cv:.1%}, {self.iterations} runs), {self.roofline_fraction:.1%} of the "
            f"{self.peak_bandwidth_gb_s:g} GB/s roofline ({self.achieved_bandwidth_gb_s:.2f} GB/s; measured copy "
            f"bandwidth {self.copy_bandwidth_gb_s:.1f} GB/s, {self.copy_fraction:.1%} of it)"
        )


# ------------------------------------------------------------------------------------------ the loop


def decode_one_token(model: Any, token: torch.Tensor, cache: Any) -> torch.Tensor:
    """One greedy step: [batch, 1] token in, [batch, 1] next token out; the cache writes it at its own position."""
    logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
    return logits[:, -1].argmax(dim=-1, keepdim=True)


class HandLoop:
    """Greedy decoding of one batch of equal-length prompts with a static cache and a compiled decode step."""

    def __init__(self, model: Any, input_ids: torch.Tensor, output_len: int, mode: str) -> None:
        from transformers import StaticCache

        self.model = model
        self.input_ids = input_ids  # [batch, input_len]
        self.output_len = output_len
        self.cache = StaticCache(config=model.config, max_cache_len=input_ids.shape[1] + output_len)
        self.step: Callable[..., torch.Tensor] = decode_one_token
        if mode != "off":
            self.step = torch.compile(decode_one_token, mode=mode, fullgraph=True)
        self.cuda = input_ids.device.type == "cuda"

    def prefill(self) -> torch.Tensor:
        logits = self.model(input_ids=self.input_ids, past_key_values=self.cache, use_cache=True).logits
        return logits[:, -1].argmax(dim=-1, keepdim=True)

    @torch.no_grad()  # as gpt-fast decodes, and as generate() runs: no autograd graph, no saved activations
    def generate(self, mark: Callable[[], Any]) -> torch.Tensor:
        """The new tokens, [batch, output_len]; `mark` is called as each token is produced."""
        self.cache.reset()
        tokens = torch.empty(self.input_ids.shape[0], self.output_len, dtype=torch.long, device=self.input_ids.device)
        token = self.prefill()
        tokens[:, :1] = token
        mark()
        for index in range(1, self.output_len):
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are copied out below
            token = self.step(self.model, token, self.cache).clone()
            tokens[:, index : index + 1] = token
            mark()
        return tokens


# ----------------------------------------------------------------------------------------- timing


def timed_decode(loop: HandLoop) -> tuple[float, torch.Tensor]:
    """Decode throughput of one call, batch x (tokens - 1) / (last token's time - first token's), and its tokens.

    Timed with autotune's own token clock (a CUDA event per token, read after the call), as a trial is."""
    clock = TokenClock(loop.input_ids.device)
    started = clock.start()
    tokens = loop.generate(clock.mark)
    clock.stop()
    times = clock.times(started)
    return loop.input_ids.shape[0] * (len(times) - 1) / (times[-1] - times[0]), tokens


def copy_bandwidth_gb_s(device: torch.device, repeats: int = 10) -> float:
    """The best of `repeats` copies of a large buffer: bytes read and written per second, in GB/s."""
    size = COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    source = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        clock = TokenClock(device)
        started = clock.start()
        clock.mark()
        target.copy_(source)
        clock.mark()
        clock.stop()
        times = clock.times(started)
        best = min(best, times[1] - times[0])
    return 2 * size / best / 1e9


# ----------------------------------------------------------------------------------------- figures


def bytes_per_step(model: Any, batch: int, input_len: int, output_len: int) -> float:
    """What one decode step reads, as autotune counts it: every weight, and each row's cache at its mean length."""
    weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    kv = kv_bytes_per_token(config.num_hidden_layers, kv_heads, head_dim, torch.finfo(model.dtype).bits // 8)
    return decode_bytes_per_step(weight_bytes, kv, batch, input_len, output_len)


def measure(args: argparse.Namespace, model: Any, tokenizer: Any, batch: int, copy_gb_s: float) -> Ceiling:
    from autotune.worker.environment import environment
    from autotune.worker.generation import build_inputs

    spec = WorkloadSpec(batch_size=batch, input_len=args.input_len, output_len=args.output_len)
    rows = build_inputs(tokenizer, spec, spec.batch_size)
    if len({len(row) for row in rows}) != 1:
        raise UserError("the hand loop takes prompts of one length; the workload's are not")
    loop = HandLoop(model, torch.tensor(rows, device=model.device), args.output_len, args.compile)
    for _ in range(args.warmup):
        timed_decode(loop)  # the first call compiles
    timed = repeat_until(lambda: timed_decode(loop), args.min_iterations, args.min_seconds, 200)
    speeds = [speed for speed, _ in timed]
    speed = statistics.median(speeds)
    peak = args.bandwidth_gb_s
    figures = roofline(speed, batch, bytes_per_step(model, batch, args.input_len, args.output_len), peak)
    found = environment(str(model.device))
    return Ceiling(
        model=args.model, device=str(model.device), device_name=found["device_name"], dtype=args.dtype,
        compile=args.compile, batch_size=batch, input_len=args.input_len, output_len=args.output_len,
        decode_tok_s=speed, decode_tok_s_cv=statistics.pstdev(speeds) / statistics.mean(speeds),
        iterations=len(speeds), achieved_bandwidth_gb_s=figures["achieved_bandwidth_gb_s"],
        roofline_fraction=figures["roofline_fraction"], peak_bandwidth_gb_s=peak, copy_bandwidth_gb_s=copy_gb_s,
        torch=found["torch"], transformers=found["transformers"], measured_at=utc_minute(),
    )  # fmt: skip


# -------------------------------------------------------------------------------------------- main


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = args.model
    if args.model == "demo":
        from autotune.worker.demo_model import ensure_demo_model

        path = str(ensure_demo_model(default_cache_dir()))
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, args.dtype), attn_implementation="sdpa", device_map=args.device
    ).eval()
    return model, AutoTokenizer.from_pretrained(path, padding_side="left")


def check_study(args: argparse.Namespace) -> None:
    """The study to store the figures with exists, and searched this model on this device."""
    from autotune.study import load_stored_study
    from autotune.study.ceilings import check_same_model_and_device
    from autotune.worker.environment import environment

    study = load_stored_study(args.storage, args.study)
    check_same_model_and_device(study, args.model, environment(args.device)["device_name"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="demo, a model folder or a hub id [demo]")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N [cpu]")
    parser.add_argument("--gpu", help="hardware profile for the roofline's peak [cpu on a CPU, else auto]")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype of the weights [bfloat16]")
    parser.add_argument("--compile", help="torch.compile mode of the decode step, or off [reduce-overhead on CUDA, "
                        "default on a CPU]")  # fmt: skip
    parser.add_argument("--batch-size", type=int, action="append", help="prompts per batch; repeat for more [8]")
    parser.add_argument("--input-len", type=int, default=128, help="tokens per prompt [128]")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per prompt [64]")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (the first compiles) [2]")
    parser.add_argument("--min-iterations", type=int, default=5, help="timed calls at least [5]")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="seconds of timed calls at least [3]")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of lines")
    parser.add_argument("--study", help="also store the figures with this study")
    parser.add_argument("--storage", help="the study's storage URL (with --study)")
    args = parser.parse_args(argv)
    args.batch_size = args.batch_size or [8]
    cuda = args.device.startswith("cuda")
    args.compile = args.compile or ("reduce-overhead" if cuda else "default")
    args.gpu = args.gpu or ("auto" if cuda else "cpu")
    if args.output_len < 2:
        parser.error("--output-len must be at least 2: decode throughput needs two tokens")
    if args.study and not args.storage:
        parser.error("--study needs --storage")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from autotune.profiles import resolve_hardware

        args.bandwidth_gb_s = resolve_hardware(args.gpu, args.device).bandwidth_gb_s
        if args.study:  # before minutes of measuring
            check_study(args)
        model, tokenizer = load(args)
        copy_gb_s = copy_bandwidth_gb_s(model.device)
        ceilings = [measure(args, model, tokenizer, batch, copy_gb_s) for batch in args.batch_size]
        if args.study:
            from autotune.study.ceilings import store_ceilings

            store_ceilings(args.storage, args.study, [asdict(ceiling) for ceiling in ceilings])
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps([asdict(c) for c in ceilings], indent=1) if args.json else "\n".join(c.line() for c in ceilings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
