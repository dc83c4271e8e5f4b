"""A real demo search with decode_loop in its space: the compiled static cache through generate()'s loop and through
the fused step, every configuration measured once. The fused step's card is on the front and carries the loop; its
Python, run as printed in a fresh process beside the folder `autotune loop` writes, gives the tokens generate()'s own
loop gives (the same snippet without the loop, in another fresh process), and the trial itself decoded the
reference's greedy tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.report.data import collect
from tests.conftest import BRIEF, REPO, run_cli

pytestmark = pytest.mark.slow

# The anchors (the float32 reference, the bf16 baseline, the throughput recipe's compiled bf16) and these two: five
# configurations, five trials
SPACE = """
knobs:
  dtype: [float32]
  cache_implementation: [static]
  compile:
    values: [default]
    when: {cache_implementation: static}
  decode_loop: [generate, fused-step]
"""
STUDY = "decode-loop"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, str]]:
    workdir = tmp_path_factory.mktemp("decode-loop")
    (workdir / "space.yaml").write_text(SPACE)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    args = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--study", STUDY, "--trials", "5"]
    completed = run_cli([*args, "--batch-size", "4", "--input-len", "64", "--output-len", "32", *BRIEF], workdir, env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "loop=fused-step" in completed.stdout  # the terminal's trial lines and front name the loop
    return workdir, env


def test_the_fused_steps_card_is_on_the_front_and_its_python_gives_generates_tokens(searched, tmp_path):
    workdir, env = searched
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir}/studies/{STUDY}.db")
    data = collect(study, f"sqlite:///{workdir}/studies/{STUDY}.db")
    fused = [card for card in data.cards if card.record.config.get("decode_loop") == "fused-step"]
    assert fused, [card.record.config for card in data.cards]
    card = fused[0]
    assert card.record.metrics["greedy_agreement"] == 1.0  # the trial decoded the float32 reference's tokens
    assert "custom_generate='./autotune-fused-step'" in card.python
    assert "decode_loop=fused-step (serve runs its own decoding loop)" in card.serve
    written = run_cli(["loop", "fused-step"], tmp_path, env)  # as the snippet's comment says
    assert written.returncode == 0 and (tmp_path / "autotune-fused-step/custom_generate/generate.py").exists()
    with_loop = _run(card.python, tmp_path, env)
    stock = "\n".join(line for line in card.python.splitlines() if "custom_generate" not in line and
                      "trust_remote_code" not in line)  # fmt: skip
    assert with_loop == _run(stock, tmp_path, env)
    assert len(with_loop.strip("[]'\" \n")) >= 5, with_loop


def _run(code: str, cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, f"{code}\n{completed.stderr[-3000:]}"
    return completed.stdout
