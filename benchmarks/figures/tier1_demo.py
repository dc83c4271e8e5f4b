"""Tier 1 on the demo task, configuration by configuration, through the real worker (the evaluate task a search runs
after its loop): the reference, the dynamic cache in float32 and bfloat16, the quantized KV cache (optimum-quanto),
the decoding-path fault the quality tests plant (decode_drift) and the runaway generation (runaway). Each row: the
task's accuracy, recovery with its one-sided 95% paired lower bound, flips, and the evaluation's wall time.

    AUTOTUNE_CACHE_DIR=.cache/autotune python benchmarks/figures/tier1_demo.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.figures.metrics import TASK_ACCURACY, TASK_FLIPS, TASK_RECOVERY
from autotune.figures.task import task_figures
from autotune.for_tests import Fault
from autotune.paths import default_cache_dir, demo_model_path
from autotune.process.results import Candidate, TaskSpec
from autotune.process.runner import Limits, run_in_worker
from autotune.space import Target, build_plan
from autotune.specs import EvalSpec, ModelSpec, WorkloadSpec

FLOAT32 = {"dtype": "float32", "cache_implementation": "dynamic"}
ROWS = (
    ("reference: float32, dynamic cache", FLOAT32, None),
    ("bfloat16, dynamic cache", {"dtype": "bfloat16", "cache_implementation": "dynamic"}, None),
    ("float32, quantized cache (quanto)", {"dtype": "float32", "cache_implementation": "quantized",
                                           "kv_cache_backend": "quanto"}, None),
    ("bfloat16, quantized cache (quanto)", {"dtype": "bfloat16", "cache_implementation": "quantized",
                                            "kv_cache_backend": "quanto"}, None),
    ("float32, decode_drift planted", FLOAT32, Fault("decode_drift")),
    ("float32, runaway planted", FLOAT32, Fault("runaway")),
)  # fmt: skip


def evaluate(config: dict, fault: Fault | None, cache: Path, folder: Path) -> tuple[dict[str, bool], float]:
    plan = build_plan(config, Target("cpu"))
    model = ModelSpec("demo", path=str(demo_model_path(cache)))
    spec = TaskSpec("evaluate", model, "cpu", str(cache), WorkloadSpec(), candidate=Candidate(config, plan),
                    evaluation=EvalSpec("demo"), fault=fault)  # fmt: skip
    result = run_in_worker(spec, folder, Limits(600.0))
    assert result.ok and result.details.evaluation is not None, result.message
    return result.details.evaluation.answers, result.timings["wall"]


def main() -> None:
    cache = Path(os.environ.get("AUTOTUNE_CACHE_DIR") or default_cache_dir())
    with tempfile.TemporaryDirectory() as folder:
        reference, _ = evaluate(FLOAT32, None, cache, Path(folder) / "reference")
        print("| configuration | accuracy | recovery (95% lower bound) | flips | wall |")
        print("|---|---|---|---|---|")
        for index, (name, config, fault) in enumerate(ROWS):
            answers, seconds = evaluate(config, fault, cache, Path(folder) / str(index))
            figures = task_figures(reference, answers)
            cells = [metric.text(figures) for metric in (TASK_ACCURACY, TASK_RECOVERY, TASK_FLIPS)]
            print(f"| {name} | {' | '.join(cells)} | {seconds:.1f}s |")


if __name__ == "__main__":
    main()
