"""C++ extensions a quantization library compiles on first use (optimum-quanto's quanto_cpp and quanto_cuda).

torch.utils.cpp_extension guards such a build with a lock file in its build folder, and a builder killed mid-build
(a trial at its timeout, the budget's end, Ctrl-C) leaves that file behind: every later build, even of an extension
already built, then waits on it forever, so every later trial of that library hangs until its timeout (seen in CI:
a trial killed while quanto_cpp compiled, then quantization=quanto-int4 timing out at 5 minutes). Here the build runs
under an fcntl lock, which the kernel releases when its holder dies: whoever holds it and finds torch's lock file
knows that no autotune process is building, so the file is stale and is removed before building.

torch runs the first `ninja` on PATH, and ninja 1.11 and 1.13 log a command under different hashes: each takes what
the other built for another command and compiles it all again (80 core-seconds for quanto_cpp on 2 cores). A search
run from an activated venv (its bin, with the ninja package optimum-quanto requires, first on PATH) and one run
without it, or two trials launched with different PATHs, rebuilt it in turn (seen in CI: three builds in one venv).
A trial's process puts the ninja of this Python's environment, where the ninja package is installed, first on its
PATH before anything can build (a build quanto starts by itself, unguarded, as a quantized KV cache of another backend
did, included), and the guarded build does so too.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Any

QUANTO_EXTENSIONS = {"cpu": "quanto_cpp", "cuda": "quanto_cuda"}
TORCH_LOCK = "lock"  # the file torch.utils.cpp_extension's FileBaton creates in the build folder
GUARD = ".autotune-build.lock"


def build_library_extensions(device: str) -> None:
    """Build, or load when built, the extension optimum-quanto uses on this device, if quanto is in use; either way,
    any later build of this process runs this environment's ninja."""
    put_this_environments_ninja_first()
    if "optimum.quanto" not in sys.modules:
        return
    from optimum.quanto.library.extensions import get_extension, is_extension_available

    name = QUANTO_EXTENSIONS.get(device.split(":")[0])
    if name is not None and is_extension_available(name):
        build_guarded(get_extension(name))


def build_guarded(extension: Any) -> None:
    """`extension.lib` (which builds or loads it) under the guard, after removing a lock file a dead builder left."""
    build = Path(extension.build_directory)
    build.mkdir(parents=True, exist_ok=True)
    put_this_environments_ninja_first()
    with (build.parent / GUARD).open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build / TORCH_LOCK).unlink(missing_ok=True)
        extension.lib  # noqa: B018 - the property builds or loads the library


def put_this_environments_ninja_first() -> None:
    """The ninja package's binary first on this process's PATH (its children inherit it), where the package is
    installed."""
    try:
        import ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != ninja.BIN_DIR:
        os.environ["PATH"] = os.pathsep.join(filter(None, [ninja.BIN_DIR, path]))
