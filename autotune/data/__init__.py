"""Bundled texts: training corpus of the demo model, evaluation text, prompts, and the demo trace."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import UserError

DATA_DIR = Path(__file__).parent
CORPUS = DATA_DIR / "corpus.txt"
EVAL_TEXT = DATA_DIR / "eval.txt"
PROMPTS = DATA_DIR / "prompts.jsonl"
DEMO_TRACE = DATA_DIR / "demo-trace.jsonl"  # --traffic demo: benchmarks/traffic/make_demo_trace.py writes it


def load_prompts(path: Path | None = None) -> list[str]:
    """Prompts from a .jsonl file ({"prompt": ...} or {"text": ...} per line) or a text file (one per line)."""
    path = path or PROMPTS
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(
            f"cannot read prompts file {path}: {error}; pass --prompts with a .jsonl or .txt file"
        ) from None
    prompts = (
        [_jsonl_prompt(line, path, number) for number, line in enumerate(lines, 1)]
        if path.suffix == ".jsonl"
        else lines
    )
    if not prompts:
        raise UserError(f"prompts file {path} has no prompts; write one prompt per line")
    return prompts


def _jsonl_prompt(line: str, path: Path, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"prompts file {path}, line {number}: not JSON ({error.msg})") from None
    text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise UserError(f'prompts file {path}, line {number}: expected {{"prompt": "..."}}')
    return text
