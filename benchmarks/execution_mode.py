"""The execution_mode knob measured both ways: generate() as it is (no_grad) and inside torch.inference_mode().

Paired, in one process: the same model and inputs, autotune's own workload timer (the PaddedGeneration
that trials run), the two modes taking turns round after round and the order swapped every round, so
both see the same machine. Prints each batch size's per-mode median decode throughput and the median
and spread of the per-round ratio inference_mode / no_grad.

    python benchmarks/execution_mode.py --rounds 20 --batch-sizes 1,4 --dtype float32
"""

from __future__ import annotations

import argparse

from autotune.paths import default_cache_dir, demo_model_path


def paired_rounds(args: argparse.Namespace, batch_size: int) -> tuple[list[float], list[float]]:
    """Decode tok/s of each mode, one figure per round, the two modes alternating."""
    from transformers import AutoTokenizer

    from autotune.space import Target, build_plan
    from autotune.specs import ModelSpec, WorkloadSpec
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model

    model_path = str(demo_model_path(default_cache_dir())) if args.model == "demo" else args.model
    plans = {
        mode: build_plan({"dtype": args.dtype, "attn_implementation": args.attn, "execution_mode": mode}, Target("cpu"))
        for mode in ("no_grad", "inference_mode")
    }
    model = load_model(ModelSpec(args.model, path=model_path), plans["no_grad"], args.device)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    spec = WorkloadSpec(batch_size=batch_size, input_len=args.input_len, output_len=args.output_len)
    inputs = build_inputs(tokenizer, spec, spec.batch_size)
    workloads = {
        mode: PaddedGeneration(model, plan, inputs, spec, tokenizer.pad_token_id) for mode, plan in plans.items()
    }
    for workload in workloads.values():  # warm-up
        workload.run()
    figures: dict[str, list[float]] = {mode: [] for mode in workloads}
    for number in range(args.rounds):
        order = list(workloads) if number % 2 == 0 else list(reversed(workloads))
        for mode in order:
            figures[mode].append(workloads[mode].run().decode_tok_s)
    return figures["no_grad"], figures["inference_mode"]


def main() -> None:
    from autotune.figures.stats import Summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    for batch_size in (int(size) for size in args.batch_sizes.split(",")):
        no_grad, inference = paired_rounds(args, batch_size)
        ratios = Summary.of([b / a for a, b in zip(no_grad, inference, strict=True)])
        print(
            f"{args.model} {args.dtype} {args.attn}, batch {batch_size}, {args.input_len} in / {args.output_len} out, "
            f"{args.rounds} paired rounds: no_grad {Summary.of(no_grad).p50:.1f} tok/s, "
            f"inference_mode {Summary.of(inference).p50:.1f} tok/s; ratio inference_mode/no_grad "
            f"p50 {ratios.p50:.3f}, p95 {ratios.p95:.3f}, cv {ratios.cv:.1%}"
        )


if __name__ == "__main__":
    main()
