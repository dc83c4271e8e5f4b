"""A study's compile cache, in its trial's process.

torch.compile's caches (inductor's FX-graph and AOTAutograd entries, its C++ and Triton kernels) live in
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, which torch reads each time something compiles. Set here before anything
does, they name a folder the study owns on this machine, named by what invalidates what it holds: the torch, Triton,
transformers and Python versions, the device and the model. Whatever calls torch.compile in the trial (generate()'s
compiled forward, a decode loop's own step, flex attention's kernel) compiles into it and finds there what the study's
earlier trials compiled. They win over the variables the process inherited: the study's archives are made from this
folder, and its trials are called cold or warm against it.

Before the trial, the study's archives of compiled code (fetched to this machine by the study process) are unpacked
into the folder, each once. An archive of another key (another torch, device, model...) or one that cannot be read is
ignored, with a note, and the trial compiles without it: it never fails a trial. After the trial, the files it added to
the folder become its archive, for the study to store.

Portable "mega-cache" artifacts (torch.compiler.save_cache_artifacts) were measured against this and left: on a CPU
they hold the FX graph but not its C++ kernels, which the loading process compiles again (the demo's compiled first
call: 22.3 s cold, 13.6 s with them loaded, 2.8 s with this folder's files; docs/measurement.md).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

import torch

from autotune.process.results import CompileCacheSpec, CompileFigures, ModelSpec, write_json_atomically
from autotune.worker.environment import cpu_name
from autotune.worker.tensor_parallel import is_rank

log = logging.getLogger(__name__)

FORMAT = "autotune-compile-cache/1"
HEADER = "autotune-compile-cache.json"  # an archive's first member: its format and key
LOADED = "archives.json"  # the folder's record of the archives unpacked in it, and of those ignored with why
NOT_ARCHIVED = (LOADED, "locks")  # our record; the lock files inductor leaves
UNREADABLE = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, ValueError, KeyError, TypeError, IndexError,
              AttributeError)  # fmt: skip
COMPILE_TIME = "_compile.compile_inner"  # torch's name for one frame's compile (Dynamo, then the backend)


def cache_key(model: ModelSpec, device: str) -> dict[str, str]:
    """What invalidates compiled code: a folder holds the code of one key, an archive is loaded only under its own."""
    return {
        "torch": torch.__version__,
        "triton": _version("triton") or _version("pytorch-triton") or "none",
        "transformers": _version("transformers") or "none",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "device": _device_name(device),
        "model": _model_name(model),
    }


def folder_name(key: dict[str, str]) -> str:
    """The key, readable, then a hash of all of it (a name cut short never merges two keys)."""
    parts = [key["model"], f"torch-{key['torch']}", f"triton-{key['triton']}", f"transformers-{key['transformers']}",
             f"py{key['python']}", key["device"]]  # fmt: skip
    readable = re.sub(r"[^A-Za-z0-9.+-]+", "-", "_".join(parts)).strip("-")[:150]
    return f"{readable}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]}"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        properties = torch.cuda.get_device_properties(index)
        return f"{properties.name} sm{properties.major}{properties.minor}"
    return f"{platform.machine()} {cpu_name()}"


def _model_name(model: ModelSpec) -> str:
    """The model by its id and revision, and the hash of its config where it is a local folder (its shapes)."""
    name = model.id + (f"@{model.revision}" if model.revision else "")
    config = Path(model.path or model.id) / "config.json"
    with contextlib.suppress(OSError):
        name += f"-{hashlib.sha256(config.read_bytes()).hexdigest()[:8]}"
    return name


class CompileCache:
    """The study's compile folder for this process: in use from construction, archived by close()."""

    def __init__(self, spec: CompileCacheSpec, key: dict[str, str]) -> None:
        started = time.perf_counter()
        self.spec = spec
        self.key = key
        self.folder = Path(spec.folder) / folder_name(key)
        self.notes: list[str] = []
        self.loaded = 0
        self.before: set[str] = set()
        self.usable = self._use()
        if self.usable:
            for archive in spec.archives:
                self._load(Path(archive))
            self.before = self._files()
        self.seconds = time.perf_counter() - started  # unpacking, then archiving (close)

    def _use(self) -> bool:
        """Point torch's caches at the folder; False (torch's own folder kept, and a note) where it cannot be made."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self.notes.append(f"cannot make the compile folder {self.folder} ({error.strerror}): torch's own is used")
            return False
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.folder)
        os.environ["TRITON_CACHE_DIR"] = str(self.folder / "triton")
        return True

    # ------------------------------------------------------------------------------------------- load

    def _load(self, archive: Path) -> None:
        record = self._record()
        if archive.name in record:
            return
        try:
            data = gzip.decompress(archive.read_bytes())  # whole: a truncated or altered archive fails its CRC here
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                members = tar.getmembers()
                header = json.loads(tar.extractfile(members[0]).read()) if members[0].name == HEADER else {}  # type: ignore[union-attr]
                why = self._refusal(header)
                if why is None:
                    self._unpack(tar, members[1:])
        except UNREADABLE as error:  # gzip's BadGzipFile is an OSError too: first
            why = f"it cannot be read ({type(error).__name__}: {str(error)[:120]})"
        except OSError as error:  # this machine's disk: the archive may load in a later trial
            self.notes.append(f"compile archive {archive.name} not loaded: {error.strerror or error}")
            return
        if why is not None:
            self.notes.append(f"compile archive {archive.name} ignored: {why}; compiling without it")
        else:
            self.loaded += 1
        self._remember(archive.name, why or "loaded")

    def _refusal(self, header: dict) -> str | None:
        """Why an archive with this header must not be loaded here, or None."""
        if header.get("format") != FORMAT:
            return f"it is not an archive of compiled code ({FORMAT})"
        theirs = header.get("key") or {}
        differ = [f"{k} {theirs.get(k)} (here {ours})" for k, ours in self.key.items() if theirs.get(k) != ours]
        return f"compiled for another {', '.join(differ)}" if differ else None

    def _unpack(self, tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> None:
        """Every file into a folder of its own first, then each moved into place: a failure leaves no file half
        written in the cache, and a file the folder holds already is kept. Only plain files with relative paths
        that stay inside the folder are taken."""
        incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.folder))
        try:
            for member in members:
                relative = Path(member.name)
                if not member.isfile() or relative.is_absolute() or ".." in relative.parts:
                    raise ValueError(f"it holds {member.name!r}, not a file of the folder")
                (incoming / relative).parent.mkdir(parents=True, exist_ok=True)
                (incoming / relative).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
                (incoming / relative).chmod(member.mode & 0o755)
            for path in sorted(p for p in incoming.rglob("*") if p.is_file()):
                target = self.folder / path.relative_to(incoming)
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    path.replace(target)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    def _record(self) -> dict[str, str]:
        try:
            return json.loads((self.folder / LOADED).read_text())
        except (OSError, ValueError):
            return {}

    def _remember(self, name: str, what: str) -> None:
        with contextlib.suppress(OSError):
            write_json_atomically(self.folder / LOADED, {**self._record(), name: what})

    # ------------------------------------------------------------------------------------------ close

    def close(self, reported: CompileFigures | None) -> CompileFigures:
        """What this process compiled (or, for a trial its tensor-parallel ranks ran, what rank 0 reported), with the
        archive of what the folder gained meanwhile; a rank archives nothing (the trial's own process does)."""
        started = time.perf_counter()
        figures = counted()
        if not figures.compiled and reported is not None:
            figures = CompileFigures(reported.graphs, reported.missed, reported.seconds)
        figures.loaded, figures.notes = self.loaded, self.notes
        if self.usable and not is_rank() and self.spec.archive_to:
            figures.archive = self._archive(Path(self.spec.archive_to))
        self.seconds += time.perf_counter() - started
        return figures

    def _archive(self, path: Path) -> str | None:
        """The files the folder gained since the trial began, as one archive at `path`; None when it gained none."""
        added = sorted(self._files() - self.before)
        if not added:
            return None
        header = json.dumps({"format": FORMAT, "key": self.key, "files": len(added)}).encode()
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(temporary, mode="w:gz") as tar:
                info = tarfile.TarInfo(HEADER)
                info.size = len(header)
                tar.addfile(info, io.BytesIO(header))
                for name in added:
                    tar.add(self.folder / name, arcname=name, recursive=False)
            temporary.replace(path)
        except OSError as error:  # a full disk costs the archive, never the trial
            self.notes.append(f"the trial's compiled code could not be archived: {error.strerror or error}")
            temporary.unlink(missing_ok=True)
            return None
        return str(path)

    def _files(self) -> set[str]:
        """The folder's files, relative, but for our record and inductor's locks."""
        found = set()
        for root, folders, files in os.walk(self.folder):
            folders[:] = [f for f in folders if not f.startswith(".incoming-")]
            relative = Path(root).relative_to(self.folder)
            if relative.parts and relative.parts[0] in NOT_ARCHIVED:
                continue
            found.update(str(relative / name) for name in files if str(relative / name) not in NOT_ARCHIVED)
        return found


def counted() -> CompileFigures:
    """What torch compiled in this process so far, as its counters say."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    inductor = counters["inductor"]
    return CompileFigures(
        graphs=counters["stats"]["unique_graphs"],
        missed=inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"],
        seconds=float(sum(compilation_time_metrics.get(COMPILE_TIME, ()))),
    )
