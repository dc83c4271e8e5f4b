"""Where one trial's wall time goes: process start, model load, warm-up/compile, measurement, quality.

Runs `autotune measure --json` several times on one configuration (each a real trial in its own
worker process, as the search runs them) and prints the mean seconds of each phase, with what the
phases do not account for (result writing, interpreter exit, the runner's polling).

    python benchmarks/trial_overhead.py --runs 3
    python benchmarks/trial_overhead.py --set dtype=float32 --set cache_implementation=static --set compile=default
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PHASES = (
    ("startup", "process start (interpreter, torch, transformers imports)"),
    ("start", "device set-up"),
    ("load", "model and tokenizer load"),
    ("warmup", "warm-up (compile included)"),
    ("measure", "measurement"),
    ("quality", "quality evaluation"),
)


def run_once(args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, "-m", "autotune", "measure", "--model", args.model, "--gpu", args.gpu, "--json"]
    for setting in args.set or []:
        command += ["--set", setting]
    document = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    if document["outcome"] != "ok":
        raise SystemExit(f"the trial failed: {document['outcome']}: {document['message']}")
    return document["timings"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--gpu", default="cpu")
    parser.add_argument("--set", action="append", help="knob=value, as for autotune measure")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    runs = [run_once(args) for _ in range(args.runs)]
    wall = statistics.mean(run["wall"] for run in runs)
    print(f"trial wall time, mean of {args.runs} runs: {wall:.2f} s")
    accounted = 0.0
    for key, label in PHASES:
        seconds = statistics.mean(run.get(key, 0.0) for run in runs)
        accounted += seconds
        print(f"  {label:<58} {seconds:6.2f} s  {seconds / wall:6.1%}")
    rest = wall - accounted
    print(f"  {'other (result, exit, polling)':<58} {rest:6.2f} s  {rest / wall:6.1%}")


if __name__ == "__main__":
    main()
