"""A lock file left by a builder killed mid-build: torch's own build waits on it forever, the guarded build removes it.

A real torch C++ extension build through optimum-quanto's Extension, in this test's folder (the shared installation is
not touched), of a one-function source: the lock is torch's whatever the source, and quanto's own sources took 45 s
and more to compile (they include torch/extension.h), which the cache fixture already does once per run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

pytest.importorskip("optimum.quanto.library.extensions")
# Python's own C API, not pybind11, whose headers took several seconds to compile.
SOURCE = """
#include <Python.h>
static PyObject* unpack(PyObject*, PyObject*) { Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"unpack", unpack, METH_VARARGS, "unpack"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "quanto_cpp", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_quanto_cpp() { return PyModule_Create(&module); }
"""
BUILD = """
import sys
from optimum.quanto.library.extensions.extension import Extension
from autotune.worker.extensions import build_guarded
ext = Extension("quanto_cpp", root_dir=sys.argv[1], sources=["unpack.cpp"])
print("building", flush=True)
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


def _build(root: Path, how: str, timeout: float, path: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", BUILD, str(root), how]
    env = {**os.environ, "PATH": path}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_torchs_build_waits_on_a_stale_lock_and_the_guarded_build_removes_it_and_builds_once(tmp_path):
    root = _sources_with_a_stale_lock(tmp_path)
    plain = subprocess.Popen([sys.executable, "-c", BUILD, str(root), "plain"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert plain.stdout.readline().strip() == "building"  # imported: it asks torch for the extension now
        time.sleep(3)  # past the lock, torch writes its build.ninja at once (this source builds in about a second)
        assert plain.poll() is None, "torch's build ended beside a lock file"
        assert not (root / "build" / "build.ninja").exists()  # its FileBaton polls the lock until it goes: never
    finally:
        plain.kill()
        plain.wait()
    venv_bin = str(Path(sys.executable).parent)
    without_venv = os.pathsep.join(part for part in os.environ["PATH"].split(os.pathsep) if part != venv_bin)
    built = _build(root, "guarded", timeout=600, path=without_venv)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip().splitlines() == ["building", "built: unpack"]
    assert not (root / "build" / "lock").exists() and list((root / "build").glob("quanto_cpp*.so"))
    # ninja 1.11 (a system's) and 1.13 (the ninja package's) log a command under different hashes, so a build by one
    # after the other compiled it all again: the guarded build runs this environment's, whatever PATH says
    compiled_at = (root / "build" / "unpack.o").stat().st_mtime_ns
    again = _build(root, "guarded", timeout=600, path=venv_bin + os.pathsep + without_venv)
    assert again.returncode == 0, again.stderr
    assert (root / "build" / "unpack.o").stat().st_mtime_ns == compiled_at, "compiled again under another PATH"
