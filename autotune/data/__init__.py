"""Bundled texts: training corpus of the demo model, evaluation text, and prompts."""

import json
from pathlib import Path

DATA_DIR = Path(__file__).parent
CORPUS = DATA_DIR / "corpus.txt"
EVAL_TEXT = DATA_DIR / "eval.txt"
PROMPTS = DATA_DIR / "prompts.jsonl"


def load_prompts(path: Path = PROMPTS) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
