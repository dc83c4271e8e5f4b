"""The same space searched twice on the demo model: on the uniform default (8 prompts of 128 tokens, each forced to 64)
and on the demo trace (its 48 requests, long-tailed lengths, bursts, conversations). Prints both fronts side by side
and every configuration's figures in each, so that what changes with the traffic can be read off.

    python benchmarks/traffic/fronts.py [--trials 10] [--out FOLDER]

The space (SPACE below) is small enough that both searches measure all of it: dtype, generate() with a dynamic or a
static cache (compiled or not), continuous batching, and prefix_reuse (searched on the trace only: the uniform
prompts share no prefix). Needs the demo model (make demo builds it) and the two cores to itself.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

from autotune.figures.metrics import GOODPUT_TOKENS, KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT, WASTED_SHARE
from autotune.study.opened import OpenedStudy
from autotune.study.records import TrialRecord

SPACE = """
knobs:
  dtype: [float32, bfloat16]
  batching: [generate, continuous]
  cache_implementation: {values: [dynamic, static], when: {batching: generate}}
  compile: {values: ["off", default], when: {cache_implementation: static}}
  prefix_reuse: [auto, "on", "off"]
rules:
  - forbid: {prefix_reuse: "on", batching: continuous}
    reason: continuous batching shares a prefix's full pages by itself (auto)
  - forbid: {prefix_reuse: "off", batching: generate}
    reason: generate() keeps no prompt cache unless asked (auto)
  - forbid: {prefix_reuse: "on", cache_implementation: static}
    reason: the prompt cache is a DynamicCache
"""
SEARCHES = {"uniform": [], "trace": ["--traffic", "demo"]}
SHORT = {"batching": "", "cache_implementation": "cache", "compile": "compile", "prefix_reuse": "prefix"}


def search(folder: Path, name: str, extra: list[str], trials: int) -> OpenedStudy:
    args = ["search", "--model", "demo", "--gpu", "cpu", "--study", name, "--space", "space.yaml"]
    command = [sys.executable, "-m", "autotune", *args, "--trials", str(trials), *extra]
    print(f"$ autotune {' '.join(command[3:])}", flush=True)
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    return OpenedStudy.open(name, f"sqlite:///{folder}/studies/{name}.db")


def label(record: TrialRecord) -> str:
    config = record.config
    words = [config["dtype"], config["batching"]]
    if config["batching"] == "generate":
        words.append(f"{config.get('cache_implementation')} cache")
        if config.get("compile", "off") != "off":
            words.append(f"compile={config['compile']}")
    if config.get("prefix_reuse", "auto") != "auto":
        words.append(f"prefix_reuse={config['prefix_reuse']}")
    return " ".join(words)


def cell(record: TrialRecord | None, metric: str, form: str) -> str:
    value = record.metrics.get(metric) if record else None
    return "-" if value is None else form.format(value)


def table(studies: dict[str, OpenedStudy]) -> list[str]:
    rows: dict[str, dict[str, TrialRecord]] = {}
    for name, study in studies.items():
        for record in study.records:
            if record.complete:
                rows.setdefault(label(record), {})[name] = record
    head = "| configuration | uniform: tok/s | front | trace: tok/s | goodput tok/s | wasted | memory | KL | front |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(rows, key=lambda key: -(rows[key].get("trace") or rows[key]["uniform"]).metrics.get(
            GOODPUT_TOKENS.name, 0)):  # fmt: skip
        uniform, trace = rows[name].get("uniform"), rows[name].get("trace")
        on = {which: "yes" if r and r.number in studies[which].front_numbers else "" for which, r in rows[name].items()}
        lines.append(
            f"| {name} | {cell(uniform, THROUGHPUT.name, '{:.0f}')} | {on.get('uniform', '')} "
            f"| {cell(trace, THROUGHPUT.name, '{:.0f}')} | {cell(trace, GOODPUT_TOKENS.name, '{:.0f}')} "
            f"| {cell(trace, WASTED_SHARE.name, '{:.0%}')} | {cell(trace, PEAK_MEMORY.name, '{:.3f} GB')} "
            f"| {cell(trace, KL_DIVERGENCE.name, '{:.1e}')} | {on.get('trace', '')} |"
        )
    return lines


def best(study: OpenedStudy, metric: str) -> str:
    front = [record for record in study.records if record.number in study.front_numbers]
    top = max(front, key=lambda record: record.metrics.get(metric, 0))
    return f"{label(top)} ({top.metrics[metric]:.0f} {metric})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, help="keep the studies here (a new temporary folder otherwise)")
    args = parser.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="traffic-fronts-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(SPACE)
    studies = {name: search(folder, f"demo-{name}", extra, args.trials) for name, extra in SEARCHES.items()}
    print("\n".join(table(studies)))
    print(f"\nfastest on the uniform front (decode throughput): {best(studies['uniform'], THROUGHPUT.name)}")
    print(f"fastest on the trace's front (goodput): {best(studies['trace'], GOODPUT_TOKENS.name)}")
    print(f"studies in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
