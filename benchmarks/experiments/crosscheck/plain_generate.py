"""A plain model.generate timing loop, written without any autotune code, to cross-check its timer.

Decode throughput the way optimum-benchmark defines it: batch x (new tokens - 1) / (time of
generate(N tokens) - time of generate(1 token)), each time the median of repeated calls after
warm-up. Prints one JSON object.

    python benchmarks/experiments/crosscheck/plain_generate.py MODEL_PATH --dtype bfloat16 --attn sdpa
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def timed_generate(model, input_ids, new_tokens: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=getattr(torch, args.dtype), attn_implementation=args.attn, device_map=args.device
    ).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (args.batch_size, args.input_len), generator=generator)
    input_ids = input_ids.to(args.device)
    for _ in range(2):  # warm-up
        timed_generate(model, input_ids, args.output_len, 1)
    prefill_s = timed_generate(model, input_ids, 1, args.repeats)
    generate_s = timed_generate(model, input_ids, args.output_len, args.repeats)
    decode_tok_s = args.batch_size * (args.output_len - 1) / (generate_s - prefill_s)
    print(json.dumps({"decode_tok_s": decode_tok_s, "prefill_s": prefill_s, "generate_s": generate_s}))


if __name__ == "__main__":
    main()
