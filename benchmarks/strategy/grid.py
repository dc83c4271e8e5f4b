"""Measure every configuration of a search space once, and store the table the replay benchmark reads.

Each configuration is a real trial: the same prepare step, worker process and measurement as
`autotune search`. The table (JSON) maps each configuration to its outcome, figures and trial time
(compile included). An interrupted run resumes: configurations already in the table are skipped.

    python benchmarks/strategy/grid.py --space search_spaces/cpu-grid.yaml --out benchmarks/results/grid-demo-cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

from autotune.figures.metrics import OBJECTIVES
from autotune.measure.prepare import plan_target, prepare, trial_spec
from autotune.process.results import write_json_atomically
from autotune.process.runner import Limits, run_in_worker
from autotune.profiles import resolve_hardware
from autotune.space import build_plan, config_key, load_space
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, WorkloadSpec

KEPT = (*(metric.name for metric in OBJECTIVES), "ttft_s", "tpot_s", "top1_agreement", "compile_s", "throughput_cv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--gpu", default="cpu")
    parser.add_argument("--space", type=Path, default=Path("search_spaces/cpu-grid.yaml"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/grid-demo-cpu.json"))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--trial-timeout", type=float, default=600.0)
    args = parser.parse_args()

    workload = WorkloadSpec(batch_size=args.batch_size, input_len=args.input_len, output_len=args.output_len)
    request = SearchRequest(
        ModelSpec(args.model), HardwareSpec(args.gpu), workload, budget=BudgetSpec(trial_timeout_s=args.trial_timeout)
    )
    hardware = resolve_hardware(args.gpu, None)
    space = load_space(args.space).prune(hardware.profile.why_not_value)
    table = json.loads(args.out.read_text()) if args.out.exists() else _new_table(args, workload, space)
    workdir = Path("studies") / f"grid-{args.out.stem}"
    prepared = prepare(request, hardware, space, workdir, deadline=None)
    table["reference"], table["baseline"] = prepared.reference_config, prepared.baseline_config
    configs = list(space.configurations())
    for index, config in enumerate(configs, 1):
        key = config_key(config)
        if key in table["trials"]:
            continue
        plan = build_plan(config, plan_target(hardware.profile, request)).to_json()
        started = time.monotonic()
        result = run_in_worker(
            trial_spec(request, prepared, config, plan), workdir / "trial", Limits(args.trial_timeout)
        )
        duration = time.monotonic() - started
        table["trials"][key] = {
            "config": config,
            "outcome": result.outcome.value,
            "message": result.message.splitlines()[0] if result.message else "",
            "metrics": {name: result.metrics[name] for name in KEPT if name in result.metrics},
            "duration_s": round(duration, 3),
        }
        write_json_atomically(args.out, table)
        figures = f"{result.metrics.get('throughput_tok_s', 0):.0f} tok/s" if result.ok else result.message[:60]
        print(f"[{index}/{len(configs)}] {result.outcome.value:<11} {duration:6.1f}s  {figures}  {key}", flush=True)
    table["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomically(args.out, table)


def _new_table(args: argparse.Namespace, workload: WorkloadSpec, space) -> dict:
    return {
        "model": args.model,
        "profile": args.gpu,
        "space": space.to_json(),
        "workload": workload.__dict__,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "trials": {},
    }


if __name__ == "__main__":
    main()
