"""A study's compile folder in the trial process: its key, its archives unpacked once, those of another key or
unreadable ignored with a note, what a trial adds archived. Files stand for what torch compiles; the compiles
themselves are the end-to-end tests' (tests/e2e/test_compile_cache_e2e.py)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from autotune.process.results import CompileCacheSpec, ModelSpec
from autotune.worker.compile_cache import FORMAT, HEADER, LOADED, CompileCache, cache_key, folder_name

KEY = {"torch": "2.13.0+cpu", "triton": "none", "transformers": "5.22.2", "python": "3.11",
       "device": "x86_64 a CPU", "model": "demo-0123abcd"}  # fmt: skip


@pytest.fixture(autouse=True)
def torch_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a cache sets in this process's environment is undone after each test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset by the test")
    monkeypatch.setenv("TRITON_CACHE_DIR", "unset by the test")


def compiled(folder: Path, key: dict[str, str] = KEY, files: dict[str, bytes] | None = None) -> Path:
    """A trial that compiles `files` into the study's folder at `folder`: its archive."""
    archive = folder / "trial.compile.tar.gz"
    cache = CompileCache(CompileCacheSpec(str(folder), [], str(archive)), key)
    for name, data in (files or {"fxgraph/ab/entry": b"graph", "cd/kernel.so": b"\x7fELF"}).items():
        (cache.folder / name).parent.mkdir(parents=True, exist_ok=True)
        (cache.folder / name).write_bytes(data)
    (cache.folder / "locks").mkdir(exist_ok=True)
    (cache.folder / "locks" / "kernel.lock").write_text("")
    figures = cache.close(None)
    assert figures.archive == str(archive)
    return archive


def loading(folder: Path, *archives: Path, key: dict[str, str] = KEY) -> CompileCache:
    return CompileCache(CompileCacheSpec(str(folder), [str(a) for a in archives], None), key)


def test_a_trial_compiles_in_the_folder_its_key_names_whatever_the_process_inherited(tmp_path: Path):
    cache = loading(tmp_path / "study")
    assert cache.folder == tmp_path / "study" / folder_name(KEY)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder)
    assert os.environ["TRITON_CACHE_DIR"] == str(cache.folder / "triton")
    assert folder_name({**KEY, "torch": "2.12.0"}) != folder_name(KEY)


def test_the_key_names_what_invalidates_compiled_code(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    key = cache_key(ModelSpec("demo", path=str(tmp_path)), "cpu")
    assert set(key) == {"torch", "triton", "transformers", "python", "device", "model"}
    assert key["model"].startswith("demo-") and key["device"]
    assert cache_key(ModelSpec("demo", path=str(tmp_path)), "cpu") == key


def test_what_a_trial_adds_is_archived_and_another_machine_unpacks_it_once(tmp_path: Path):
    archive = compiled(tmp_path / "first")
    with tarfile.open(archive) as tar:
        assert tar.getnames() == [HEADER, "cd/kernel.so", "fxgraph/ab/entry"]  # no locks, no record
    other = loading(tmp_path / "second", archive)
    assert other.loaded == 1 and other.notes == []
    assert (other.folder / "fxgraph/ab/entry").read_bytes() == b"graph"
    assert (other.folder / "cd/kernel.so").read_bytes() == b"\x7fELF"
    again = loading(tmp_path / "second", archive)
    assert again.loaded == 0 and again.notes == []  # the folder's record says it holds it
    assert again.close(None).archive is None  # a trial that compiled nothing anew archives nothing


def test_a_file_the_folder_holds_is_kept(tmp_path: Path):
    archive = compiled(tmp_path / "first")
    kept = tmp_path / "second" / folder_name(KEY) / "fxgraph/ab/entry"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"this machine's")
    loading(tmp_path / "second", archive)
    assert kept.read_bytes() == b"this machine's"


def test_an_archive_of_another_torch_is_ignored_with_a_note_and_once(tmp_path: Path):
    archive = compiled(tmp_path / "first", {**KEY, "torch": "2.12.0"})
    cache = loading(tmp_path / "second", archive)
    assert cache.loaded == 0
    assert cache.notes == [
        f"compile archive {archive.name} ignored: compiled for another torch 2.12.0 (here 2.13.0+cpu); "
        "compiling without it"
    ]
    assert not (cache.folder / "fxgraph").exists()
    assert loading(tmp_path / "second", archive).notes == []  # said once on this machine


@pytest.mark.parametrize("damage", ["truncated", "garbage", "escapes its folder", "no header"])
def test_an_archive_that_cannot_be_read_is_ignored_with_a_note_and_leaves_no_file(tmp_path: Path, damage: str):
    archive = compiled(tmp_path / "first")
    if damage == "truncated":
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif damage == "garbage":
        archive.write_bytes(b"not an archive at all")
    else:
        archive.write_bytes(_tar({"../../evil": b"x"} if damage == "escapes its folder" else {"fx/entry": b"x"}))
    cache = loading(tmp_path / "second", archive)
    assert cache.loaded == 0 and len(cache.notes) == 1 and "ignored" in cache.notes[0]
    left = sorted(str(p.relative_to(cache.folder)) for p in cache.folder.rglob("*"))
    assert left == [LOADED]
    assert not (tmp_path / "evil").exists()


def _tar(files: dict[str, bytes]) -> bytes:
    """An archive of these files, with a header of this key first unless `files` is the one without it."""
    buffer = io.BytesIO()
    header = json.dumps({"format": FORMAT, "key": KEY}).encode()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (({HEADER: header} if "fx/entry" not in files else {}) | files).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_folder_that_cannot_be_made_leaves_torch_its_own_with_a_note(tmp_path: Path):
    (tmp_path / "a file").write_text("")
    cache = loading(tmp_path / "a file" / "study")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "unset by the test"
    assert len(cache.notes) == 1 and "torch's own is used" in cache.notes[0]
    assert cache.close(None).archive is None


def test_a_process_that_compiled_nothing_is_neither_cold_nor_warm(tmp_path: Path):
    figures = loading(tmp_path / "study").close(None)
    assert figures.graphs == 0 and not figures.compiled
