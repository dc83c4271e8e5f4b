"""A study compiles once: what its first worker compiled, a second worker of its PostgreSQL study with a cache folder of
its own loads from the study's artifacts, and so does a study warm-started from it, which ignores, with a note, an
archive of another torch and one that cannot be read. Real searches and workers on the demo model, a real server."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import optuna
import pytest
from optuna.artifacts import download_artifact, upload_artifact

from autotune.study import TrialRecord, artifacts, records
from autotune.study.compile_archives import ARCHIVE_SUFFIX
from autotune.worker.compile_cache import HEADER
from autotune.worker.demo_model import ensure_demo_model
from tests.conftest import BRIEF
from tests.postgres import postgres_url  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

STUDY = "compiled-once"
# One compiled graph, whether generate() runs under no_grad or inference_mode (measured: 2.9 s warm against 17.4 s cold)
SPACE = """
knobs:
  dtype: [bfloat16]
  attn_implementation: [sdpa]
  cache_implementation: [static]
  compile:
    values: [default]
    when: {cache_implementation: static}
  execution_mode: [no_grad, inference_mode]
"""
SMALL = ["--batch-size", "2", "--input-len", "32", "--output-len", "16", *BRIEF]
COMPILED = {"dtype": "bfloat16", "attn_implementation": "sdpa", "cache_implementation": "static", "compile": "default"}


class Machine:
    """A machine of its own: an autotune cache folder that holds only the demo model."""

    def __init__(self, root: Path, models: Path) -> None:
        self.cache = root / "autotune-cache"
        self.cache.mkdir(parents=True)
        (self.cache / "models").symlink_to(models)
        self.env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(self.cache)}

    def run(self, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, env=self.env, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def compiled_files(self, study: str) -> list[Path]:
        return [p for p in (self.cache / "compile" / study).rglob("*") if p.is_file() and "fxgraph" in p.parts]


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, postgres_url: str) -> tuple[Path, Machine, str]:  # noqa: F811
    """The study's first worker: a search whose third trial compiles, cold; the study's artifacts in a shared folder."""
    ensure_demo_model(cache_dir)
    folder = tmp_path_factory.mktemp("compile-cache")
    (folder / "space.yaml").write_text(SPACE)
    machine = Machine(folder / "first", cache_dir / "models")
    places = ["--study", STUDY, "--storage", postgres_url, "--artifacts", str(folder / "artifacts")]
    search = ["search", "--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--trials", "3", *SMALL]
    machine.run([*search, *places], folder)
    return folder, machine, postgres_url


def compiled(study_records: list[TrialRecord]) -> list[TrialRecord]:
    return [r for r in study_records if r.compiled is not None and r.compiled.compiled]


def test_a_second_worker_with_a_cache_of_its_own_loads_what_the_first_compiled(first):
    folder, first_machine, url = first
    study = optuna.load_study(study_name=STUDY, storage=url)
    [cold] = compiled(records(study))
    assert cold.compiled.cache == "cold" and cold.compiled.artifact  # type: ignore[union-attr]
    assert first_machine.compiled_files(STUDY)
    study.enqueue_trial({**COMPILED, "execution_mode": "inference_mode"}, user_attrs={"roles": ["the same graph"]})
    second = Machine(folder / "second", first_machine.cache / "models")
    done = second.run(["worker", "--study", STUDY, "--storage", url, "--artifacts", str(folder / "artifacts"),
                       "--trials", "1", "--device", "cpu"], folder)  # fmt: skip
    [warm] = [r for r in compiled(records(study)) if r.number != cold.number]
    assert warm.config["execution_mode"] == "inference_mode" and warm.outcome == "ok"
    assert warm.compiled.cache == "warm" and warm.compiled.artifact is None, done.stdout  # type: ignore[union-attr]
    assert f"compiling {warm.compiled.seconds:.1f}s warm" in done.stdout  # type: ignore[union-attr]
    assert second.compiled_files(STUDY)  # in its own folder, from the study's archive


def test_a_warm_started_study_loads_what_its_source_compiled_and_ignores_a_stale_and_a_corrupt_archive(first):
    folder, first_machine, url = first
    source = optuna.load_study(study_name=STUDY, storage=url)
    store = artifacts.open_store(str(folder / "artifacts"), url)
    [cold, *_] = compiled(records(source))
    real = folder / "real.tar.gz"
    download_artifact(artifact_store=store, file_path=str(real), artifact_id=cold.compiled.artifact)  # type: ignore[union-attr]
    (folder / f"stale{ARCHIVE_SUFFIX}").write_bytes(_with_torch(real.read_bytes(), "2.0.0"))
    (folder / f"corrupt{ARCHIVE_SUFFIX}").write_bytes(real.read_bytes()[:-100])
    planted = {  # stored with the source study, as a warm start takes them
        name: upload_artifact(
            artifact_store=store, file_path=str(folder / f"{name}{ARCHIVE_SUFFIX}"), study_or_trial=source
        )
        for name in ("stale", "corrupt")
    }
    tonight = Machine(folder / "tonight", first_machine.cache / "models")
    # Five trials: the anchors (the throughput recipe's compiled configuration among them) whatever the source's front
    # holds on this machine (with three, a machine where float32 decodes fastest queued its front, uncompiled, first)
    done = tonight.run(["search", "--model", "demo", "--gpu", "cpu", "--study", "tonight", "--storage", url,
                        "--artifacts", str(folder / "artifacts"), "--warm-start", STUDY, "--space", "space.yaml",
                        "--trials", "5", *SMALL], folder)  # fmt: skip
    stale, corrupt = (f"compile archive {planted[name]}{ARCHIVE_SUFFIX} ignored" for name in ("stale", "corrupt"))
    assert f"{stale}: compiled for another torch 2.0.0 (here " in done.stdout
    assert f"{corrupt}: it cannot be read (" in done.stdout
    study = optuna.load_study(study_name="tonight", storage=url)
    assert [r.outcome for r in records(study) if r.launched] == ["ok"] * 5
    ran = compiled(records(study))
    assert ran and all(r.compiled.cache == "warm" for r in ran), done.stdout  # type: ignore[union-attr]
    assert f"({len(ran)} warm)" in next(line for line in done.stdout.splitlines() if line.startswith("time spent"))


def _with_torch(archive: bytes, version: str) -> bytes:
    """The archive as another torch would have made it: its header's key names that version."""
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive))) as source,
        tarfile.open(fileobj=buffer, mode="w:gz") as made,
    ):
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == HEADER:
                header = json.loads(data)
                header["key"]["torch"] = version
                data = json.dumps(header).encode()
                member.size = len(data)
            made.addfile(member, io.BytesIO(data))
    return buffer.getvalue()
