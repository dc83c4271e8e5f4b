"""Shared fixtures. GPU tests carry the `gpu` marker and are skipped where torch sees no CUDA device."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.study import TrialRecord, open_storage, records

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


# ------------------------------------------------------------------ the one real search of the suite

DEMO_STUDY = "demo-cpu"
DEMO_CONSTRAINT = "memory<=40MB"  # steady on CPU: the flex-attention 4-bit trial (about 50 MB) breaks it
DEMO_SEARCH = [
    "search",
    "--model",
    "demo",
    "--gpu",
    "cpu",
    "--seed",
    "3",
    "--batch-size",
    "4",
    "--input-len",
    "64",
    "--output-len",
    "32",
]
# Runs the real CLI, then tells whether the study process ever imported torch.
WRAPPER = (
    "import sys\n"
    "from autotune.cli import main\n"
    "sys.argv = ['autotune', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as stop:\n    code = stop.code\n"
    "print('TORCH_IMPORTED_BY_STUDY_PROCESS', 'torch' in sys.modules)\n"
    "sys.exit(code)\n"
)


def run_demo_search(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, *DEMO_SEARCH, *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )


@dataclass(frozen=True)
class DemoSearch:
    workdir: Path
    completed: subprocess.CompletedProcess
    records: list[TrialRecord]  # right after the first run
    env: dict[str, str]

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.workdir}/studies/{DEMO_STUDY}.db"

    @property
    def report(self) -> Path:
        return self.workdir / "reports" / f"{DEMO_STUDY}.html"

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=DEMO_STUDY, storage=self.storage)


@pytest.fixture(scope="session")
def demo_search(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> DemoSearch:
    """One real search on the demo model (8 trials under one constraint), shared by the slow tests.

    Tests that add trials (the resume test) run after the ones that read the first run's report.
    """
    env = dict(os.environ)
    env["AUTOTUNE_CACHE_DIR"] = str(cache_dir)
    workdir = tmp_path_factory.mktemp("search")
    completed = run_demo_search(workdir, env, "--trials", "8", "--constraint", DEMO_CONSTRAINT)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    search = DemoSearch(workdir, completed, [], env)
    return DemoSearch(workdir, completed, records(search.study()), env)


# --------------------------------------------------------------------- a search watched while it runs

Found = TypeVar("Found")


def start_search(
    workdir: Path, env: dict[str, str], args: list[str], faults: dict[str, dict[str, str]]
) -> subprocess.Popen:
    """`autotune search ARGS` in the background, its output discarded; `faults`: trial number -> fault."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", *args],
        cwd=workdir,
        env={**env, "AUTOTUNE_INJECT_FAULTS": json.dumps(faults)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def running_trial(workdir: Path, study_name: str = DEMO_STUDY) -> FrozenTrial | None:
    """The trial of a search in `workdir` that runs now, once its worker's pid is recorded; else None."""
    db = workdir / "studies" / f"{study_name}.db"
    if not db.exists():
        return None
    try:
        # open_storage: the search may be creating this database's schema right now
        trials = optuna.load_study(study_name=study_name, storage=open_storage(f"sqlite:///{db}")).trials
    except KeyError:  # the database file exists a moment before the study in it
        return None
    running = [t for t in trials if t.state == TrialState.RUNNING and "worker_pid" in t.user_attrs]
    return running[0] if running else None


def wait_for(
    found: Callable[[], Found | None],
    search: subprocess.Popen,
    failure: str,
    timeout_s: float = 600,
    poll_s: float = 0.5,
) -> Found:
    """Poll `found` until it returns something; fail with `failure` if the search ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not (result := found()):
        assert time.monotonic() < deadline and search.poll() is None, failure
        time.sleep(poll_s)
    return result
