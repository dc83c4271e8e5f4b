"""On a CUDA machine: a real search on the demo model runs its trials on the GPU."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.study import records
from tests.conftest import run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_demo_search_on_cuda(tmp_path: Path, cli_env):
    completed = run_cli(["search", "--model", "demo", "--trials", "4", "--study", "gpu-demo"], tmp_path, cli_env)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    study = optuna.load_study(study_name="gpu-demo", storage=f"sqlite:///{tmp_path}/studies/gpu-demo.db")
    complete = [record for record in records(study) if record.complete]
    assert complete
    for record in complete:
        assert record.environment["device"].startswith("cuda")
        assert record.metrics["peak_memory_bytes"] > 0
