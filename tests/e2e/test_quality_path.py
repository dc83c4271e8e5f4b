"""Quality on the path that runs: a real search of the demo model with the throughput preset, over a space with the
quantized cache, and faults planted in some of its configurations (injected by configuration, as the storage faults
are: AUTOTUNE_INJECT_FAULTS).

The first fault (decode_drift, autotune/testing/worker_faults.py) shifts the logits of every forward pass that decodes
one token per row, as a KV cache decodes; a forward pass over a whole text is left exact. The figure studies stored
before 2026-11-27 (one forward pass over the text, no cache) cannot see it; the decoding path's can, and the preset's
quality guard keeps the configuration off the front. The second (runaway) makes a generation loop once it says a span
twice: text forced along seldom does, so teacher forcing cannot see it; tier 0, the share of the trial's own
generations that are degenerate, does, and the preset's guard keeps it off the front.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import optuna
import pytest

from autotune.figures.constraints import parse_constraints
from autotune.figures.objectives import QUALITY_KEPT
from autotune.figures.quality import DECODE
from autotune.study import TrialRecord, records, stored_settings
from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

SPACE = """
knobs:
  dtype: [float32, bfloat16]
  attn_implementation: [sdpa, eager]
  batching: [generate]
  cache_implementation:
    values: [dynamic, quantized]
  kv_cache_backend:
    values: [quanto]
    when: {cache_implementation: quantized}
  execution_mode: [no_grad, inference_mode]
"""
PLANTED = "execution_mode=inference_mode"  # every configuration with this value decodes wrong
RUNAWAY = "attn_implementation=eager"  # every configuration with this value (and no_grad) loops once it repeats
FAULT = {PLANTED: {"kind": "decode_drift"}, RUNAWAY: {"kind": "runaway"}}
STUDY = "quality-path"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, list[TrialRecord]]:
    workdir = tmp_path_factory.mktemp("quality-path")
    (workdir / "space.yaml").write_text(SPACE)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    env["AUTOTUNE_INJECT_FAULTS"] = json.dumps(FAULT)
    args = ["search", "--model", "demo", "--gpu", "cpu", "--objective", "throughput", "--space", "space.yaml"]
    completed = run_cli(
        [*args, "--study", STUDY, "--trials", "12", "--input-len", "128", "--output-len", "64", *BRIEF], workdir, env
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    return workdir, [record for record in records(study) if record.complete]


def test_the_decoding_path_catches_a_fault_the_prefill_path_misses(searched, cache_dir):
    _, trials = searched
    planted = [r for r in trials if r.config["execution_mode"] == "inference_mode" and r.config["dtype"] == "float32"]
    exact = [r for r in trials if _sound(r) and r.config["dtype"] == "float32"]
    dynamic = next(r for r in planted if r.config["cache_implementation"] == "dynamic")
    assert dynamic.quality_path == DECODE
    assert dynamic.metrics["kl_divergence"] > 0.1 and dynamic.metrics["token_agreement"] < 0.5
    assert min(r.metrics["kl_divergence"] for r in exact if r.config["cache_implementation"] == "dynamic") < 1e-6
    assert _prefill_kl_of_the_planted_model(cache_dir) < 1e-9  # what the study would have stored before


def _sound(record: TrialRecord) -> bool:
    return record.config["execution_mode"] == "no_grad" and record.config["attn_implementation"] == "sdpa"


def _runaway(record: TrialRecord) -> bool:
    return record.config["execution_mode"] == "no_grad" and record.config["attn_implementation"] == "eager"


def test_tier_0_catches_a_runaway_generation_teacher_forcing_cannot_see_and_the_guard_keeps_it_off_the_front(searched):
    workdir, trials = searched
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    front = {trial.number for trial in study.best_trials}
    runaway = [r for r in trials if _runaway(r)]
    sound = [r for r in trials if _sound(r)]
    assert runaway, [r.config for r in trials]
    exact = [r for r in sound if r.metrics["greedy_agreement"] == 1.0]  # the reference's tokens: nothing new in them
    assert exact and all(r.metrics["degenerate_share"] == 0 for r in exact), [r.metrics for r in exact]
    # bfloat16 and the quantized caches decode other tokens, which on some CPUs loop where the reference's do not (a
    # CPU with bf16 units rounds otherwise); the runaway loops more than any of them
    shares = [(r.config, r.metrics["degenerate_share"]) for r in trials]
    most_sound, most_runaway = (max(r.metrics["degenerate_share"] for r in kind) for kind in (sound, runaway))
    assert most_sound < most_runaway, shares
    # The guard admits a share up to its bound (2 rows of 8 where 0.25): a runaway above it is kept off the front, and
    # one of those passes every figure of the decoding path: only tier 0 keeps it out
    guard = next(c for c in parse_constraints(QUALITY_KEPT) if c.metric == "degenerate_share")
    caught = [r for r in runaway if not guard.holds(r.metrics)]
    assert caught and all(not r.feasible for r in caught) and not front & {r.number for r in caught}, shares
    forced_blind = [r for r in caught if r.metrics["kl_divergence"] <= 0.01 and r.metrics["token_agreement"] >= 0.95]
    assert forced_blind, [r.metrics for r in caught]
    drifted = [r for r in trials if r.config["execution_mode"] == "inference_mode"]
    assert all(r.metrics["degenerate_share"] > 0 for r in drifted)  # the decoding-path fault: degenerate too


def _prefill_kl_of_the_planted_model(cache_dir: Path) -> float:
    """The demo model with the same fault planted, judged as trials were before: one forward pass per window."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autotune.for_tests import Fault
    from autotune.paths import demo_model_path
    from autotune.testing.worker_faults import plant
    from autotune.worker.measurement.quality.prefill import eval_windows, prefill_figures

    path = demo_model_path(cache_dir)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    planted = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    plant(Fault.from_json(FAULT[PLANTED]), planted)
    return prefill_figures(planted, reference, eval_windows(AutoTokenizer.from_pretrained(path)))["kl_divergence"]


def test_the_quality_guard_acts_on_the_decoding_path_and_keeps_the_fault_off_the_front(searched):
    workdir, trials = searched
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    front = {trial.number for trial in study.best_trials}
    planted = [r for r in trials if r.config["execution_mode"] == "inference_mode"]
    assert planted and all(not r.feasible for r in planted) and not front & {r.number for r in planted}
    quantized = [r for r in trials if r.config.get("cache_implementation") == "quantized" and _sound(r)]
    assert quantized and all(r.metrics["kl_divergence"] > 1e-5 for r in quantized)  # off the exact figures
    stored = [str(constraint) for constraint in stored_settings(study).feasibility]
    assert stored == [str(constraint) for constraint in parse_constraints(QUALITY_KEPT)]


def test_report_and_best_show_the_agreements_and_where_quality_came_from(searched, cli_env):
    workdir, _ = searched
    page = html.unescape((workdir / "reports" / f"{STUDY}.html").read_text())
    assert "<th>tokens</th><th>greedy</th>" in page
    assert "with the reference's greedy tokens: token agreement" in page
    assert "teacher-forced through each trial's own decoding path" in page
    best = run_cli(["best", "--study", STUDY, "--format", "json"], workdir, cli_env, timeout=120)
    document = json.loads(best.stdout)
    assert {"greedy_agreement", "token_agreement"} <= set(document["metrics"])
    assert document["metrics"]["token_agreement"] >= 0.95  # the guard the pick keeps to
    text = run_cli(["best", "--study", STUDY], workdir, cli_env, timeout=120).stdout
    assert "with the reference's greedy tokens: token agreement" in text and "greedy agreement" in text
    constrained = run_cli(["best", "--study", STUDY, "--constraint", "greedy>=0.99"], workdir, cli_env, timeout=120)
    assert constrained.returncode in (0, 1), constrained.stderr  # accepted as a figure, whatever it finds
    assert "unknown" not in constrained.stderr
