"""Writing a page: whole or not at all."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import OutputError


def write_page(text: str, path: Path, again: str) -> Path:
    """Write a page whole or not at all (a file beside it, renamed over it); `again`: how to write it later.
    A previous page at `path` stays as it was when this one cannot be written."""
    staging = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(text, encoding="utf-8")
        staging.replace(path)
    except OSError as error:
        staging.unlink(missing_ok=True)
        raise OutputError(f"{path} could not be written: {error.strerror}; {again}") from None
    return path
