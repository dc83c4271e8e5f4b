"""A lock file left by a builder killed mid-build: torch's own build waits on it forever, the guarded build removes it.

A real torch C++ extension build through optimum-quanto's Extension, in this test's folder (the shared installation is
not touched), of a one-function source: the lock is torch's whatever the source, and quanto's own sources took 45 s
and more to compile (they include torch/extension.h), which the cache fixture already does once per run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

pytest.importorskip("optimum.quanto.library.extensions")
SOURCE = """
#include <pybind11/pybind11.h>
int unpack(int bits) { return bits; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("unpack", &unpack, "unpack"); }
"""
BUILD = """
import sys
from optimum.quanto.library.extensions.extension import Extension
from autotune.worker.extensions import build_guarded
ext = Extension("quanto_cpp", root_dir=sys.argv[1], sources=["unpack.cpp"])
if sys.argv[2] == "guarded":
    build_guarded(ext)
print("built:", ext.lib.unpack.__name__)
"""


def _sources_with_a_stale_lock(tmp_path: Path) -> Path:
    root = tmp_path / "cpp"
    root.mkdir()
    (root / "unpack.cpp").write_text(SOURCE)
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
