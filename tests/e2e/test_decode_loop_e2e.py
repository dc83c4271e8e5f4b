"""A real demo search with decode_loop in its space, every configuration of it measured once: float32 and bfloat16,
each through generate()'s loop and through the fused step. The fused step decodes the tokens generate()'s loop decodes
on the same path: the float32 one the reference's own, the bfloat16 one what the bfloat16 baseline decodes. The fused
step's card carries the loop; its Python, run as printed in a fresh process beside the folder `autotune loop` writes,
gives the tokens generate()'s own loop gives (the same snippet without the loop, in another fresh process). Whether
the card is on the front is the machine's to say (a CPU with bf16 units puts the bfloat16 baseline there), so the
card is built for the fused step's trial wherever it lies, as the front's cards are built. The compiled static cache
through the fused step is the conformance run's and tests/worker/test_decode_loops.py's to check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.report.data import card, collect
from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

# The anchors (the float32 reference, the bf16 baseline) and the fused step on each: the whole space in four trials
SPACE = """
knobs:
  dtype: [float32, bfloat16]
  decode_loop: [generate, fused-step]
"""
STUDY = "decode-loop"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, str]]:
    workdir = tmp_path_factory.mktemp("decode-loop")
    (workdir / "space.yaml").write_text(SPACE)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--study", STUDY, "--trials", "4"]
    completed = run_cli([*args, "--batch-size", "4", "--input-len", "64", "--output-len", "32", *BRIEF], workdir, env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "loop=fused-step" in completed.stdout  # the terminal's trial lines and front name the loop
    return workdir, env


def test_the_fused_steps_card_carries_the_loop_and_its_python_gives_generates_tokens(searched, tmp_path):
    workdir, env = searched
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    data = collect(study, f"sqlite:///{workdir}/studies/{STUDY}.db")
    complete = {(record.config["dtype"], record.config["decode_loop"]): record for record in data.complete}
    assert len(complete) == 4, [record.config for record in data.trials]
    agreement = {key: record.metrics["greedy_agreement"] for key, record in complete.items()}
    assert agreement[("float32", "fused-step")] == 1.0, agreement  # the float32 reference's own tokens
    assert agreement[("bfloat16", "fused-step")] == agreement[("bfloat16", "generate")], agreement
    for front_card in data.cards:  # whichever the machine put there
        loop = front_card.record.config["decode_loop"]
        assert ("custom_generate=" in front_card.python) == (loop != "generate"), front_card.python
    fused_card = card(complete[("float32", "fused-step")], data.settings, data.baseline, data.capacities)
    assert "custom_generate='./autotune-fused-step'" in fused_card.python
    assert "decode_loop=fused-step (serve runs its own decoding loop)" in fused_card.serve
    written = run_cli(["loop", "fused-step"], tmp_path, env)  # as the snippet's comment says
    assert written.returncode == 0 and (tmp_path / "autotune-fused-step/custom_generate/generate.py").exists()
    with_loop = _run(fused_card.python, tmp_path, env)
    stock = "\n".join(line for line in fused_card.python.splitlines() if "custom_generate" not in line and
                      "trust_remote_code" not in line)  # fmt: skip
    assert with_loop == _run(stock, tmp_path, env)
    assert len(with_loop.strip("[]'\" \n")) >= 5, with_loop


def _run(code: str, cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, f"{code}\n{completed.stderr[-3000:]}"
    return completed.stdout
