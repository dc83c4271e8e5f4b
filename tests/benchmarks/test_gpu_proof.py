"""benchmarks/gpu/gpu_proof.py end to end on the demo model (CPU), and the 1.1B Llama builder at its small shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.profiles import PROFILES
from autotune.space import load_space
from tests.benchmarks import tool
from tests.conftest import BRIEF, REPO

OUTCOME_WORDS = tool("gpu/gpu_proof.py").OUTCOME_WORDS

# A slice of the default space whose warm-up runs in well under a minute on two cores: every value
# here runs on the cpu profile, and bfloat16 is the demo checkpoint's dtype (the baseline's).
SMALL_SPACE = """
knobs:
  dtype: [float32, bfloat16, float16]
  attn_implementation: [sdpa]
  quantization: [none]
  batching: [generate, continuous]
  cache_implementation:
    values: [dynamic, quantized]
    when: {batching: generate}
  max_batch_tokens:
    values: [256, 2048]
    when: {batching: continuous}
"""


def test_the_proof_process_never_imports_torch() -> None:
    probe = "import runpy, sys; runpy.run_path('benchmarks/gpu/gpu_proof.py'); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO).returncode == 0


def test_a_failed_search_fails_the_proof_and_the_summary_says_so(tmp_path: Path, cli_env: dict[str, str]) -> None:
    out = tmp_path / "proof"
    command = [sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu_proof.py"), "--model",
               str(tmp_path / "no-such-model"), "--device", "cpu", "--out", str(out), "--budget", "1m"]  # fmt: skip
    completed = subprocess.run(command, cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "does not exist" in (out / "search.log").read_text()
    summary = (out / "SUMMARY.md").read_text()
    assert "No study was stored" in summary and "exit status 2" in summary
    assert not (out / "best.json").exists()


def _section(summary: str, title: str) -> list[list[str]]:
    """The rows of the Markdown table under `## title`, as lists of cells, header and rule left out."""
    lines = summary.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[1:]]


@pytest.mark.slow
def test_gpu_proof_on_the_demo_model(tmp_path: Path, cli_env: dict[str, str]) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SMALL_SPACE)
    out = tmp_path / "proof"
    command = [sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu_proof.py"), "--model", "demo", "--device", "cpu",
               "--out", str(out), "--budget", "1m", "--space", str(space),
               "--batch-size", "1", "--input-len", "32", "--output-len", "16", *BRIEF]  # fmt: skip
    completed = subprocess.run(command, cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    for name in ("SUMMARY.md", "study.db", "report.html", "commands.log", "best.json", "plan.json", "search.log"):
        assert (out / name).is_file(), name
    assert f"summary: {out / 'SUMMARY.md'}" in completed.stdout
    summary = (out / "SUMMARY.md").read_text()
    plan = json.loads((out / "plan.json").read_text())
    assert [entry["why"] for entry in plan[:2]] == ["reference", "baseline"]
    assert "best decode throughput" in (out / "search.log").read_text()  # when it was found

    trials = _section(summary, "Trials")
    for row in trials:
        assert row[3].split(" (")[0] in OUTCOME_WORDS, row
    assert any(row[1] == "baseline" and row[3] == "works" for row in trials)
    kept = load_space(space).prune(PROFILES["cpu"].why_not_value)

    knob_values = _section(summary, "Knob values")
    assert {(row[0], row[1]) for row in knob_values} >= {(s.name, str(v)) for s in kept.knobs for v in s.values}
    for row in knob_values:
        assert row[2].split(" (")[0].split(":")[0] in OUTCOME_WORDS, row

    best = json.loads((out / "best.json").read_text())
    assert f"trial #{best['trial']}" in summary
    assert "torch" in summary and "transformers" in summary and "bitsandbytes" in summary
    assert "Memory-bandwidth roofline share at batch 1" in summary
    # The hand-written loop (autotune ceiling, compiled), stored, in the summary and report; once, as the search ran at
    # batch 1 (each batch compiles anew: 19 s more on a cold cache; tests/measure/test_ceiling.py runs two, uncompiled).
    assert [figure["batch_size"] for figure in json.loads((out / "ceiling.json").read_text())] == [1]
    line = next(line for line in summary.splitlines() if "decode loop (autotune ceiling), batch 1:" in line)
    assert "cannot be computed" not in line and "x (" in line and "compile default" in line, line
    assert '<section id="ceiling">' in (out / "report.html").read_text()


@pytest.mark.slow
def test_llama_builder_small_shape_loads(tmp_path: Path, cli_env: dict[str, str]) -> None:
    out = tmp_path / "llama-small"
    command = [sys.executable, str(REPO / "benchmarks" / "gpu" / "llama_1b.py"), "--device", "cpu", "--small",
               "--train-steps", "2", "--out", str(out)]  # fmt: skip
    built = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.stdout.strip().splitlines()[-1] == str(out)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (64, 2, 32000)
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is False

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("In the beginning", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 4

    again = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "reusing" in again.stdout  # a built folder is kept
