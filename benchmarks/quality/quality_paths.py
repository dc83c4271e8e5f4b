"""Quality on the prefill path against quality on the decoding path, configuration by configuration.

Until 2026-11-27 a trial's KL, top-1 and perplexity came from one forward pass over the evaluation text with no cache
and no compiled step: a quantized cache, a compiled decode step, continuous batching or speculative decoding could not
move them. A trial now forces the text through the generate() call it timed (worker/measurement/quality/forced.py).
For each configuration this script measures the trial through the real worker (the library call behind `autotune
measure`), then loads the model as the configuration's plan loads it and computes the old prefill figure against the
reference model, in this process. One Markdown table, one row per configuration:

    python benchmarks/quality/quality_paths.py --device cpu [--out benchmarks/results/quality-paths-cpu.md]
    python benchmarks/quality/quality_paths.py --device cuda --model PATH --only "static cache" --only continuous

Speculative decoding runs one prompt at a time (the latency workload); the rest a batch of 8, 128 tokens in, 64 out.
Every configuration is float32 but the bfloat16 and float16 rows, so that what is lossless must show the reference's
exact figures; the last rows are the quantizations the speed presets' quality guard admits or refuses.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, when run as a script

from autotune.errors import UserError
from autotune.figures.quality import PATHS
from autotune.measure.configuration import measure
from autotune.measure.prepare import plan_target
from autotune.paths import default_cache_dir, demo_model_path
from autotune.profiles import resolve_hardware
from autotune.space import build_plan
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, WorkloadSpec

FLOAT32 = {"dtype": "float32"}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("float32, dynamic cache (the reference's own configuration)", {}),
    ("bfloat16, dynamic cache", {"dtype": "bfloat16"}),
    ("static cache, compile off", {"cache_implementation": "static", "compile": "off"}),
    ("static cache, compile default", {"cache_implementation": "static", "compile": "default"}),
    ("static cache, compile reduce-overhead", {"cache_implementation": "static", "compile": "reduce-overhead"}),
    ("offloaded cache", {"cache_implementation": "offloaded"}),
    ("offloaded static cache", {"cache_implementation": "offloaded_static", "compile": "off"}),
    ("quantized cache, fp8", {"cache_implementation": "quantized", "kv_cache_backend": "fp8"}),
    ("quantized cache, quanto (4-bit)", {"cache_implementation": "quantized", "kv_cache_backend": "quanto"}),
    ("quantized cache, hqq (4-bit)", {"cache_implementation": "quantized", "kv_cache_backend": "hqq"}),
    ("continuous batching", {"batching": "continuous"}),
    ("speculative: prompt lookup", {"speculative": "prompt_lookup"}),
    ("speculative: assistant (the demo's draft)", {"speculative": "assistant"}),
    ("speculative: early exit", {"speculative": "early_exit"}),
    # what the speed presets' quality guard admits and refuses (docs/usage.md, "Objectives")
    ("float16", {"dtype": "float16"}),
    ("8-bit weights, bitsandbytes", {"quantization": "bnb-8bit"}),
    ("8-bit weights, optimum-quanto", {"quantization": "quanto-int8"}),
    ("8-bit weights, torchao", {"quantization": "torchao-int8"}),
    ("4-bit weights, bitsandbytes NF4", {"quantization": "bnb-4bit"}),
    ("4-bit weights, optimum-quanto", {"quantization": "quanto-int4"}),
]
ONE_PROMPT = WorkloadSpec("latency", batch_size=1)
A_BATCH = WorkloadSpec("throughput", batch_size=8)


@dataclass(frozen=True)
class Row:
    label: str
    outcome: str
    decode: dict[str, float]
    prefill: dict[str, float]
    path: str
    quality_s: float | None


def request_for(settings: dict[str, Any], model: str, device: str) -> SearchRequest:
    workload = ONE_PROMPT if settings.get("speculative") else A_BATCH
    return SearchRequest(
        ModelSpec(model), HardwareSpec("auto", device), workload, budget=BudgetSpec(trial_timeout_s=600)
    )


def model_path(model: str) -> str:
    return str(demo_model_path(default_cache_dir())) if model == "demo" else model


def prefill_of(config: dict[str, Any], request: SearchRequest, reference_model: Any, windows: Any) -> dict[str, float]:
    """The figure a study stored before 2026-11-27: the configuration's model, one forward pass per window."""
    from autotune.process.results import ModelSpec as LoadedModel
    from autotune.worker.generation import entered
    from autotune.worker.loading import load_model
    from autotune.worker.measurement.quality.prefill import prefill_figures

    hardware = resolve_hardware(request.hardware.gpu, request.hardware.device)
    plan = build_plan(config, plan_target(hardware.profile, request))
    model = load_model(LoadedModel(request.model.id, path=model_path(request.model.id)), plan, hardware.device)
    with entered(plan.contexts):
        return prefill_figures(model, reference_model, windows)


def row(label: str, settings: dict[str, Any], model: str, device: str, reference_model: Any, windows: Any) -> Row:
    request = request_for(settings, model, device)
    try:
        config, result = measure(request, {**FLOAT32, **settings})
    except UserError as error:
        return Row(label, f"refused: {error}", {}, {}, "", None)
    if not result.ok:
        return Row(label, f"{result.outcome.value}: {result.message.splitlines()[0][:140]}", {}, {}, "", None)
    prefill = prefill_of(config, request, reference_model, windows)
    path = result.details.quality_path or ""
    return Row(label, "ok", result.metrics, prefill, path, result.timings.get("quality"))


def markdown(rows: list[Row]) -> list[str]:
    lines = [
        "| configuration | KL prefill | KL decoding | top-1 prefill | top-1 decoding | greedy | tokens | quality |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.outcome != "ok":
            lines.append(f"| {r.label} | {r.outcome} | | | | | | |")
            continue
        d, p = r.decode, r.prefill
        note = "" if r.path == "decode" else f" ({r.path})"
        lines.append(
            f"| {r.label}{note} | {p['kl_divergence']:.2e} | {d['kl_divergence']:.2e} | {p['top1_agreement']:.1%} "
            f"| {d['top1_agreement']:.1%} | {_share(d.get('greedy_agreement'))} | {_share(d.get('token_agreement'))} "
            f"| {r.quality_s:.2f} s |"
        )
    paths = sorted({r.path for r in rows if r.path})
    return [*lines, "", *(f"- {path}: quality measured {PATHS[path]}" for path in paths)]


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="demo", help="demo, or a model folder (the 1.1B Llama of llama_1b.py)")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--only", action="append", default=[], help="only the cases whose label starts so")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autotune.worker.measurement.quality.prefill import eval_windows

    path = model_path(args.model)  # the reference: float32, sdpa, as a search prepares it
    reference_model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa", device_map=args.device
    )
    windows = eval_windows(AutoTokenizer.from_pretrained(path))
    started = time.monotonic()
    rows = []
    for label, settings in CASES:
        if args.only and not any(label.startswith(prefix) for prefix in args.only):
            continue
        rows.append(row(label, settings, args.model, args.device, reference_model, windows))
        print(markdown(rows)[len(rows) + 1], flush=True)
    table = markdown(rows)
    print("\n".join(table))
    print(f"\n{len(rows)} configurations in {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
