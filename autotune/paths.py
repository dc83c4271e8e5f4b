"""Where autotune keeps things: its cache (demo model, reference outputs, compile caches) and the default space."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGED_SPACE = Path(__file__).parent / "space" / "default.yaml"  # the default space: one file, in the package
DEMO_VERSION = "demo-v1"
DRAFT_VERSION = "demo-draft-v1"  # the demo's speculative-decoding draft: same tokenizer, far smaller
DEMO_MAX_POSITIONS = 512  # the demo model's context (max_position_embeddings)


def default_cache_dir() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE_DIR") or Path.home() / ".cache" / "autotune")


def default_space_path() -> Path:
    return PACKAGED_SPACE


def demo_model_path(cache_dir: Path) -> Path:
    return cache_dir / "models" / DEMO_VERSION


def demo_draft_path(cache_dir: Path) -> Path:
    return cache_dir / "models" / DRAFT_VERSION


def compile_cache_dir(cache_dir: Path, study_name: str) -> Path:
    """A study's torch.compile caches on this machine; inside, one folder per key of what invalidates them (the
    worker names it: autotune/worker/compile_cache.py) and the study's archives fetched here."""
    return cache_dir / "compile" / study_name
