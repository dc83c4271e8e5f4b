"""A lock file left by a builder killed mid-build: torch's own build waits on it forever, the guarded build removes it.

On a copy of optimum-quanto's quanto_cpp sources (a real torch C++ extension build, in this test's folder, so the
shared installation is not touched)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

quanto_extensions = pytest.importorskip("optimum.quanto.library.extensions")
CPP = Path(quanto_extensions.__file__).parent / "cpp"
BUILD = """
import sys
from optimum.quanto.library.extensions.extension import Extension
from autotune.worker.extensions import build_guarded
ext = Extension("quanto_cpp", root_dir=sys.argv[1], sources=["unpack.cpp", "pybind_module.cpp"], extra_cflags=["-O3"])
if sys.argv[2] == "guarded":
    build_guarded(ext)
print("built:", ext.lib.unpack.__name__)
"""


def _sources_with_a_stale_lock(tmp_path: Path) -> Path:
    root = tmp_path / "cpp"
    root.mkdir()
    for source in ("unpack.cpp", "unpack.h", "pybind_module.cpp"):
        shutil.copy(CPP / source, root / source)
    (root / "build").mkdir()
    (root / "build" / "lock").touch()  # what a builder killed mid-build leaves
    return root


def _build(root: Path, how: str, timeout: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", BUILD, str(root), how]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_torchs_build_waits_on_a_stale_lock_and_the_guarded_build_removes_it(tmp_path):
    root = _sources_with_a_stale_lock(tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        _build(root, "plain", timeout=10)  # torch's FileBaton polls the lock file until it goes: never
    built = _build(root, "guarded", timeout=600)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == "built: unpack"
    assert not (root / "build" / "lock").exists() and list((root / "build").glob("quanto_cpp*.so"))
