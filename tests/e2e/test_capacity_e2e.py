"""A throughput search whose trials probe batch sizes, through the real worker on the demo model.

One search of two trials: the reference (float32) climbs 1, 2 and 4 and skips 512, which the memory of the two below
predicts to be over the study's memory bound (the demo's peak grows by about a megabyte a doubling: 512 would need
hundreds); the baseline (bfloat16) runs out of memory at batch 2 (injected, as a
GPU's allocator would refuse it), so the probe ends there and the trial keeps batch 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna

from autotune.study import records
from tests.conftest import run_cli

STUDY = "probe"
SHAPE = ["--input-len", "64", "--output-len", "16", "--batch-size", "1,2,4,512"]
ARGS = ["search", "--model", "demo", "--gpu", "cpu", "--trials", "2", "--study", STUDY, *SHAPE,
        "--slo", "itl_p95<=10s", "--constraint", "memory<=60MB"]  # fmt: skip
OOM_FROM_BATCH_2 = {"dtype=bfloat16": {"phase": "measure", "kind": "oom", "batch": 2}}


def test_a_probe_skips_a_batch_predicted_not_to_fit_and_an_oom_ends_it_keeping_the_batches_below(
    tmp_path: Path, cli_env
):
    env = {**cli_env, "AUTOTUNE_INJECT_FAULTS": json.dumps(OOM_FROM_BATCH_2)}
    completed = run_cli(ARGS, tmp_path, env, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path}/studies/{STUDY}.db")
    reference, baseline = sorted((r for r in records(study) if r.launched), key=lambda r: r.number)

    assert reference.complete and reference.capacity is not None
    sizes = [(point["size"], point["verdict"]) for point in reference.capacity["points"]]
    assert sizes == [(1, "met"), (2, "met"), (4, "met"), (512, "memory")]
    skipped = reference.capacity["points"][-1]
    assert skipped["figures"] == {} and skipped["reason"].startswith("predicted peak ")  # never run
    assert skipped["reason"].endswith("> 60.00 MB, not run")
    assert reference.metrics["capacity"] == 4 and reference.metrics["meets_slo"] == 1
    assert reference.feasible

    assert baseline.complete, baseline.message  # the probe's OOM is the end of its bracket, not a failed trial
    sizes = [(point["size"], point["verdict"]) for point in baseline.capacity["points"]]
    assert sizes == [(1, "met"), (2, "oom")]
    assert "can't allocate memory" in baseline.capacity["points"][-1]["reason"]
    assert baseline.metrics["capacity"] == 1
    assert baseline.capacity["said"] == (
        f"batch 1 is the largest within the SLO; batch 2 out of memory: {baseline.capacity['points'][-1]['reason']}"
    )
    # the search's trial lines print each point and why the probe stopped climbing
    assert "batch 2: refused: RuntimeError" in completed.stdout
    assert "capacity within itl_p95<=10s: batch 1 is the largest within the SLO" in completed.stdout
