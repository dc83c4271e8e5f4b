"""Checks of everything that can be checked before work starts: each bad input is one UserError line.

Runs in the study process before anything is written, so it never imports torch: the device is
looked up through NVML, the model's context is read from its config.json (a local folder, the
demo, or a hub id already in the local cache), and paths are probed where they would be written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import UserError
from autotune.extras import why_storage_missing
from autotune.paths import DEMO_MAX_POSITIONS, demo_model_path
from autotune.specs import WorkloadSpec
from autotune.traffic import counted_lengths

if TYPE_CHECKING:
    from autotune.specs import SearchRequest

# Names transformers configs give their position limit, most common first.
POSITION_LIMIT_NAMES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def check_search_inputs(request: SearchRequest, report: Path | None) -> None:
    """`autotune search`: every flag that can be wrong, before a folder or a database is created."""
    check_study_name(request.storage.study_name)
    check_device(request.hardware.device)
    if request.storage.url:
        check_storage(request.storage.url)
    else:
        check_directory(request.storage.studies_dir, "the studies folder")
    if report is not None:
        check_output_file(report, "--report")
    else:
        check_directory(Path("reports"), "the reports folder")
    check_measure_inputs(request)


def check_measure_inputs(request: SearchRequest) -> None:
    """`autotune measure` (and search): the device, the cache folder, the workload against the model's context."""
    model, cache_dir = request.model, request.storage.cache_dir
    check_device(request.hardware.device)
    check_revision(model.id, model.revision)
    check_directory(cache_dir, "the cache folder (AUTOTUNE_CACHE_DIR)")
    check_context(model.id, model.revision, request.workload, cache_dir)


def check_study_name(name: str | None) -> None:
    if name is None:
        return
    if not name.strip():
        raise UserError("--study must not be empty; give a name, or leave --study out for <model>-<profile>")
    if "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise UserError(f"--study {name!r} cannot name a file: use letters, digits, '-', '_' and '.' (not first)")


def check_revision(model: str, revision: str | None) -> None:
    """A revision picks a commit of a hub repository; from_pretrained ignores it for a folder."""
    if revision is not None and (model == "demo" or Path(model).expanduser().is_dir()):
        raise UserError(f"--revision {revision} applies to hub models only; {model} has none: leave --revision out")


def check_device(device: str | None) -> None:
    """A CUDA device must exist here (torch would only find out in the worker, after the prepare step)."""
    if device is None or not device.startswith("cuda"):
        return
    from autotune.profiles import detect_gpu, device_index

    suffix = device.removeprefix("cuda").removeprefix(":")
    if suffix and not suffix.isdigit():
        raise UserError(f"--device {device!r} is not a device: use cpu, cuda or cuda:N")
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or detect_gpu(device_index(device)) is None:
        raise UserError(f"--device {device}: no such CUDA GPU here; pick one `autotune gpus` lists, or --device cpu")


def check_storage(url: str) -> None:
    """An SQLite storage must be a file this process can create or write; a PostgreSQL one needs its driver
    here; other URLs are opened later."""
    missing = why_storage_missing(url)
    if missing:
        raise UserError(missing)
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///"))
    if path.is_dir():
        raise UserError(f"--storage {url}: {path} is a directory; name a database file, e.g. sqlite:///{path}/s.db")
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise UserError(f"--storage {url}: {path} is not writable here; check its permissions or pass another file")
        return
    problem = _cannot_create_in(path.parent)
    if problem:
        raise UserError(f"--storage {url}: cannot create {path} ({problem}); pass a writable location")


def check_output_file(path: Path, flag: str) -> None:
    """A file autotune will write later (the report): its folder must be creatable and writable now."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory; name a file, e.g. {path / 'report.html'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path} is not writable here; check its permissions or pass another path")
    problem = _cannot_create_in(path.parent)
    if problem:
        raise UserError(f"{flag} {path}: cannot write there ({problem}); pass a writable path")


def check_directory(path: Path, what: str) -> None:
    """A folder autotune will write in: it must exist and be writable, or be creatable."""
    problem = _cannot_create_in(path)
    if problem:
        raise UserError(f"{what} {path} cannot be written ({problem}); point it at a writable folder")


def _cannot_create_in(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (created if missing), tried for real and undone, or None."""
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:  # root passes os.access everywhere: only creating something tells (read-only mounts, /proc)
        Path(tempfile.mkdtemp(dir=existing, prefix=".autotune-probe-")).rmdir()
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


# -------------------------------------------------------------------------------- model context


def check_context(model: str, revision: str | None, workload: WorkloadSpec, cache_dir: Path) -> None:
    """Prompt + generated tokens must fit in the model's positions; unknown here: the prepare step checks."""
    config = _local_config(model, revision, cache_dir)
    limit = position_limit(config) if config is not None else None
    if model == "demo" and limit is None:
        limit = ("max_position_embeddings", DEMO_MAX_POSITIONS)
    if limit is not None and (problem := context_problem(limit, workload)):
        raise UserError(problem)


def context_problem(limit: tuple[str, int], workload: WorkloadSpec) -> str | None:
    """The error line for a workload longer than the model's context, or None when it fits: its shape, or the first
    request of its trace whose length the trace says in tokens (text is the prepare step's to count)."""
    name, positions = limit
    carried = workload.traffic.carried() if workload.traffic is not None else None
    for number, counted in enumerate(counted_lengths(carried or []), 1):
        if counted is not None and sum(counted) > positions:
            return trace_too_long(workload.traffic.file, number, counted, limit)  # type: ignore[union-attr]
    needed = workload.input_len + workload.output_len
    if needed <= positions:
        return None
    return (
        f"--input-len {workload.input_len} + --output-len {workload.output_len} = {needed} tokens, but the model "
        f"has {positions} positions ({name} in its config); lower --input-len or --output-len to fit {positions}"
    )


def trace_too_long(file: str, number: int, lengths: tuple[int, int], limit: tuple[str, int]) -> str:
    """The error line for a request of a trace longer than the model's context."""
    (tokens_in, tokens_out), (name, positions) = lengths, limit
    return (
        f"traffic file {file}, request {number}: {tokens_in} tokens in + {tokens_out} out = {tokens_in + tokens_out} "
        f"tokens, but the model has {positions} positions ({name} in its config); shorten that request or drop it "
        "from the trace"
    )


def position_limit(config: dict[str, Any]) -> tuple[str, int] | None:
    """(attribute, value) of the model's position limit in a config.json, text part first."""
    for section in (config.get("text_config"), config):
        if not isinstance(section, dict):
            continue
        for name in POSITION_LIMIT_NAMES:
            value = section.get(name)
            if isinstance(value, int) and value > 0:
                return name, value
    return None


def _local_config(model: str, revision: str | None, cache_dir: Path) -> dict[str, Any] | None:
    if model == "demo":
        path: Path | None = demo_model_path(cache_dir) / "config.json"
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser() / "config.json"
    else:
        path = _cached_hub_config(model, revision)
    try:
        return json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None  # unreadable here: the prepare step reports it


def _cached_hub_config(model: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:  # not a valid repo id, or no cache: nothing to read before the worker runs
        return None
    return Path(found) if isinstance(found, str) else None
