"""Cross-check autotune's timer against a timing loop it did not write.

Two ways, printed one after the other:

1. paired, in one process: autotune's workload timer (the PaddedGeneration and statistics that
   `autotune measure` runs in its worker) and plain_generate.py's bare generate() loop (beside this file)
   (no autotune code) take turns on the same model and the same inputs, round after round, so both
   see the same machine: on a machine whose speed drifts, this is the comparison that means something;
2. separate processes: `autotune measure --json` and `python plain_generate.py`,
   alternately, each a fresh process, as a user would run them.

optimum-benchmark is another outside timer, but it times differently: its PyTorch backend times decode
from the first logits to the return of generate() and runs generate() under torch.inference_mode(),
which on CPU reads higher than generate's own no_grad (docs/benchmarks.md gives that gap: execution_mode).
0.6.0 runs on transformers 5 once the SpecialTokensMixin name it imports for a type hint is supplied.

    python benchmarks/experiments/crosscheck/crosscheck.py --rounds 20 --process-rounds 3
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


def paired(args: argparse.Namespace, model_path: str) -> tuple[float, float]:
    from transformers import AutoTokenizer

    from autotune.figures.stats import Summary
    from autotune.space import Target, build_plan
    from autotune.space.plan import Plan
    from autotune.specs import ModelSpec, WorkloadSpec
    from autotune.worker.generation import PaddedGeneration, build_inputs
    from autotune.worker.loading import load_model

    sys.path.insert(0, str(HERE))
    from plain_generate import timed_generate  # the bare loop, with no autotune code

    config = {"dtype": args.dtype, "attn_implementation": args.attn}
    plan = Plan.from_json(build_plan(config, Target("cpu" if args.gpu == "cpu" else "cuda")).to_json())
    device = "cpu" if args.gpu == "cpu" else "cuda"
    model = load_model(ModelSpec(args.model, path=model_path), plan, device)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    spec = WorkloadSpec(batch_size=args.batch_size, input_len=args.input_len, output_len=args.output_len)
    workload = PaddedGeneration(
        model, plan, build_inputs(tokenizer, spec, spec.batch_size), spec, tokenizer.pad_token_id
    )
    input_ids = workload.input_ids
    for _ in range(2):
        workload.run()
        timed_generate(model, input_ids, args.output_len, 1)
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(workload.run().decode_tok_s)
        prefill_s = timed_generate(model, input_ids, 1, 1)
        generate_s = timed_generate(model, input_ids, args.output_len, 1)
        theirs.append(args.batch_size * (args.output_len - 1) / (generate_s - prefill_s))
    return Summary.of(ours).p50, Summary.of(theirs).p50


def autotune_measure(args: argparse.Namespace) -> float:
    command = [sys.executable, "-m", "autotune", "measure", "--model", args.model, "--gpu", args.gpu, "--json",
               "--set", f"dtype={args.dtype}", "--set", f"attn_implementation={args.attn}",
               "--batch-size", str(args.batch_size), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len)]  # fmt: skip
    document = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return document["metrics"]["throughput_tok_s"]


def plain_process(args: argparse.Namespace, model_path: str) -> float:
    command = [sys.executable, str(HERE / "plain_generate.py"), model_path, "--dtype", args.dtype,
               "--attn", args.attn, "--device", "cpu" if args.gpu == "cpu" else "cuda",
               "--batch-size", str(args.batch_size), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len)]  # fmt: skip
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)["decode_tok_s"]


def verdict(ours: float, theirs: float) -> str:
    difference = abs(ours - theirs) / theirs
    return (
        f"ratio {ours / theirs:.3f}, difference {difference:.1%} ({'within' if difference <= 0.10 else 'OUTSIDE'} 10%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--gpu", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds in one process")
    parser.add_argument("--process-rounds", type=int, default=3, help="rounds of separate processes")
    args = parser.parse_args()
    model_path = str(demo_model_path(default_cache_dir())) if args.model == "demo" else args.model

    ours, theirs = paired(args, model_path)
    print(f"paired, one process, {args.rounds} rounds: autotune's timer {ours:.1f} tok/s, "
          f"plain generate loop {theirs:.1f} tok/s, {verdict(ours, theirs)}")  # fmt: skip
    if args.process_rounds:
        measured, plain = [], []
        for number in range(1, args.process_rounds + 1):
            measured.append(autotune_measure(args))
            plain.append(plain_process(args, model_path))
            print(f"  separate processes, round {number}: autotune measure {measured[-1]:.1f} tok/s, "
                  f"plain_generate.py {plain[-1]:.1f} tok/s")  # fmt: skip
        a, b = statistics.median(measured), statistics.median(plain)
        print(f"separate processes, medians: autotune measure {a:.1f} tok/s, plain_generate.py {b:.1f} tok/s, "
              f"{verdict(a, b)}")  # fmt: skip


if __name__ == "__main__":
    main()
