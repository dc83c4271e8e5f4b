"""One compiled first call of the demo model in this process: how long, and what torch's caches said.

    python benchmarks/compile_cache/first_call.py --cache DIR [--load ARTIFACT] [--save ARTIFACT] [--batches 2,4]

The caches live in DIR (TORCHINDUCTOR_CACHE_DIR). --load loads portable artifacts before compiling, --save writes
this process's after. Prints one JSON line per batch: the first call's seconds, the second's, Dynamo's and inductor's
cache counters, and the compile-time metrics torch keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", required=True)
    parser.add_argument("--load")
    parser.add_argument("--save")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--batches", default="2")
    parser.add_argument("--dynamic", choices=("auto", "true"), default="auto", help="CompileConfig.dynamic")
    parser.add_argument("--repeat", type=int, default=1, help="calls timed after the first (their median is printed)")
    parser.add_argument("--precompile", action="store_true", help="torch._dynamo.config.caching_precompile")
    parser.add_argument("--cache-dir", default=os.environ.get("AUTOTUNE_CACHE_DIR", ".cache/autotune"))
    args = parser.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache
    import torch
    from torch._dynamo.utils import counters

    from autotune.paths import demo_model_path
    from autotune.space import Target, build_plan
    from autotune.specs import ModelSpec, WorkloadSpec
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    loaded_info = None
    if args.load:
        start = time.perf_counter()
        info = torch.compiler.load_cache_artifacts(Path(args.load).read_bytes())
        loaded_info = {"seconds": round(time.perf_counter() - start, 3), "info": str(info)[:300]}
    config = {"dtype": args.dtype, "attn_implementation": args.attn, "cache_implementation": "static",
              "compile": "default"}  # fmt: skip
    plan = build_plan(config, Target("cpu", 8, 192))
    if args.dynamic == "true":
        plan.generate["compile_config"].kwargs["dynamic"] = True
    if args.precompile:
        torch._dynamo.config.caching_precompile = True
    model = ModelSpec("demo", path=str(demo_model_path(Path(args.cache_dir))))
    tokenizer = load_tokenizer(model)
    loaded = load_model(model, plan, "cpu")
    for batch in [int(b) for b in args.batches.split(",")]:
        workload = WorkloadSpec(batch_size=batch, input_len=64, output_len=32)
        generation = PaddedGeneration(loaded, plan, build_inputs(tokenizer, workload, batch), workload,
                                      tokenizer.pad_token_id)  # fmt: skip
        counters.clear()
        first = generation.run().elapsed_s
        second = statistics.median(generation.run().elapsed_s for _ in range(args.repeat))
        times = torch._dynamo.utils.compile_times(repr="csv")
        kept = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd", "stats", "frames")}
        compile_times = dict(zip(times[0], times[1], strict=False))
        print(json.dumps({"batch": batch, "first_s": round(first, 3), "second_s": round(second, 3), "counters": kept,
                          "compile_times": compile_times, "loaded": loaded_info}))  # fmt: skip
        loaded_info = None
    if args.save:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            Path(args.save).write_bytes(saved[0])
            print(json.dumps({"saved_bytes": len(saved[0]), "info": str(saved[1])[:400]}))


if __name__ == "__main__":
    main()
