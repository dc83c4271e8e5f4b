"""A small real disk for the tests: a tmpfs mounted over a folder, which a test fills to the last byte.

Mounting needs root (CI runs as root); where the mount is refused, the test that asks for one is skipped
with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "4m") -> Iterator[Path]:
    """`folder`, on a tmpfs of `size` of its own for the duration of the block."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small disk here (a tmpfs needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True)


def fill(disk: Path) -> Path:
    """Write a file on `disk` until the disk refuses a byte more; the file (remove it to free the disk)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as file:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    file.write(b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    return filler
