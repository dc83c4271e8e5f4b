"""Cross-check autotune's timer against a timing loop it did not write.

Runs `autotune measure --json` and benchmarks/plain_generate.py (a bare model.generate loop) on the
same model, configuration and workload shape, alternately, and prints both decode throughputs and
their ratio. optimum-benchmark would be the natural outside timer, but 0.6.0 cannot import its
PyTorch backend with transformers 5 (it imports SpecialTokensMixin, which transformers 5 removed).

    python benchmarks/crosscheck.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from autotune.paths import default_cache_dir, demo_model_path

HERE = Path(__file__).parent


def autotune_throughput(args: argparse.Namespace) -> float:
    command = [sys.executable, "-m", "autotune", "measure", "--model", args.model, "--gpu", args.gpu, "--json",
               "--set", f"dtype={args.dtype}", "--set", f"attn_implementation={args.attn}",
               "--batch-size", str(args.batch_size), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len)]  # fmt: skip
    document = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return document["metrics"]["throughput_tok_s"]


def plain_throughput(args: argparse.Namespace, model_path: str) -> float:
    command = [sys.executable, str(HERE / "plain_generate.py"), model_path, "--dtype", args.dtype,
               "--attn", args.attn, "--device", "cpu" if args.gpu == "cpu" else "cuda",
               "--batch-size", str(args.batch_size), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len)]  # fmt: skip
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)["decode_tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--gpu", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model_path = str(demo_model_path(default_cache_dir())) if args.model == "demo" else args.model

    ours, theirs = [], []
    for round_number in range(1, args.rounds + 1):
        ours.append(autotune_throughput(args))
        theirs.append(plain_throughput(args, model_path))
        print(
            f"round {round_number}: autotune measure {ours[-1]:.1f} tok/s, plain generate loop {theirs[-1]:.1f} tok/s"
        )
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"median: autotune measure {a:.1f} tok/s, plain generate loop {b:.1f} tok/s, ratio {a / b:.3f}")
    print(f"difference {abs(a - b) / b:.1%} ({'within' if abs(a - b) / b <= 0.10 else 'OUTSIDE'} 10%)")


if __name__ == "__main__":
    main()
