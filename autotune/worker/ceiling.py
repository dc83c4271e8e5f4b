"""The decode ceiling task: a hand-written greedy decoding loop, as gpt-fast writes it, on any model and device.

Under torch.no_grad: a static KV cache, one uncompiled prefill, then one decode step (the model's forward and
the argmax) compiled with torch.compile (reduce-overhead on CUDA, so one CUDA graph per step; default on a CPU) and
called once per token with nothing else between steps: no logits processing, no stopping criteria, no
host wait. Its inputs are autotune's workload (the bundled prompts, each exactly input_len tokens), so
its figures compare with a trial's. For each batch size it measures the decode throughput (tokens after
each row's first, per second of decoding, as autotune measures it) and its share of the memory-bandwidth
roofline (bytes one step reads x steps per second, over the hardware profile's peak, as autotune's
`roofline_fraction`), with the device's measured copy bandwidth beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune.process.ceiling import Ceiling, utc_minute
from autotune.process.results import Outcome, TaskDetails, TaskResult, TaskSpec
from autotune.specs import WorkloadSpec
from autotune.worker.environment import environment
from autotune.worker.generation import build_inputs
from autotune.worker.measurement.speed import decode_bytes_per_step, kv_bytes_per_token, roofline
from autotune.worker.measurement.timing import repeat_until
from autotune.worker.measurement.token_clock import TokenClock
from autotune.worker.tasks import Phases

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}  # the buffer the copy bandwidth is measured on
MAX_ITERATIONS = 200

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


def load_model(model: str, dtype: str, device: str, cache_dir: Path) -> tuple[Any, Any]:
    """The model (demo, a folder or a hub id) as the hand loop runs it, sdpa attention, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model
    if model == "demo":
        from autotune.worker.demo_model import ensure_demo_model

        path = str(ensure_demo_model(cache_dir))
    loaded = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation="sdpa", device_map=device
    ).eval()
    return loaded, AutoTokenizer.from_pretrained(path, padding_side="left")


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


def measure(spec: TaskSpec, model: Any, tokenizer: Any, batch: int, found: dict[str, Any], copy_gb_s: float) -> Ceiling:
    """The hand loop's figures at one batch size; `found` is the environment (device name, versions)."""
    hand = spec.ceiling
    assert hand is not None and spec.bandwidth_gb_s is not None
    workload = WorkloadSpec(batch_size=batch, input_len=hand.input_len, output_len=hand.output_len)
    rows = build_inputs(tokenizer, workload, workload.batch_size)
    if len({len(row) for row in rows}) != 1:
        raise ValueError("the hand loop takes prompts of one length; the workload's are not")
    loop = HandLoop(model, torch.tensor(rows, device=model.device), hand.output_len, hand.compile)
    for _ in range(hand.warmup):
        timed_decode(loop)  # the first call compiles
    timed = repeat_until(lambda: timed_decode(loop), hand.min_iterations, hand.min_seconds, MAX_ITERATIONS)
    speeds = [speed for speed, _ in timed]
    speed = statistics.median(speeds)
    peak = spec.bandwidth_gb_s
    figures = roofline(speed, batch, bytes_per_step(model, batch, hand.input_len, hand.output_len), peak)
    return Ceiling(
        model=spec.model.id, device=str(model.device), device_name=found["device_name"], dtype=hand.dtype,
        compile=hand.compile, batch_size=batch, input_len=hand.input_len, output_len=hand.output_len,
        decode_tok_s=speed, decode_tok_s_cv=statistics.pstdev(speeds) / statistics.mean(speeds),
        iterations=len(speeds), achieved_bandwidth_gb_s=figures["achieved_bandwidth_gb_s"],
        roofline_fraction=figures["roofline_fraction"], peak_bandwidth_gb_s=peak, copy_bandwidth_gb_s=copy_gb_s,
        torch=found["torch"], transformers=found["transformers"], measured_at=utc_minute(),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- the task


def run(spec: TaskSpec, phases: Phases) -> TaskResult:
    """The ceiling task: the hand loop at each batch size; refused before loading on another device than the study's
    (the result's environment says which device this is)."""
    hand = spec.ceiling
    assert hand is not None
    found = environment(spec.device)
    if hand.study_device_name is not None and found["device_name"] != hand.study_device_name:
        why = f"this device is {found['device_name']}, the study's {hand.study_device_name}"
        return TaskResult(Outcome.UNSUPPORTED, why, phase=phases.current, environment=found)
    with phases("load"):
        model, tokenizer = load_model(spec.model.id, hand.dtype, spec.device, Path(spec.cache_dir))
    with phases("measure"):
        copy_gb_s = copy_bandwidth_gb_s(model.device)
        figures = [measure(spec, model, tokenizer, batch, found, copy_gb_s) for batch in hand.batch_sizes]
    details = TaskDetails(ceilings=figures)
    return TaskResult(Outcome.OK, details=details, environment=found)
