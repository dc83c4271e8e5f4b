"""Shared fixtures. GPU tests carry the `gpu` marker and are skipped where torch sees no CUDA device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _cuda_available() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items) or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One autotune cache (demo model, references) per test session, or AUTOTUNE_TEST_CACHE_DIR if set."""
    configured = os.environ.get("AUTOTUNE_TEST_CACHE_DIR")
    path = Path(configured) if configured else tmp_path_factory.mktemp("autotune-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def cli_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["AUTOTUNE_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(REPO)
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        pytest.skip("no Chromium installed (Debian package chromium; .ci/run installs it)")
    return path
