"""The figures of `autotune measure --traffic ... --json` documents side by side, one row each: what each configuration
served of the trace's requests and how fast. benchmarks/gpu_session.sh's traffic phase prints it.

    python benchmarks/traffic/replays_table.py MEASURE.json [MEASURE.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (
    ("goodput tok/s", "goodput_tok_s", "{:.1f}"),
    ("wasted", "wasted_share", "{:.1%}"),
    ("requests", "requests_served", "{:.0f}"),
    ("tokens", "tokens_generated", "{:.0f}"),
    ("ttft p95", "ttft_p95_s", "{:.4f} s"),
    ("itl p95", "itl_p95_s", "{:.5f} s"),
    ("memory", "peak_memory_gb", "{:.2f} GB"),
)


def row(path: Path) -> str:
    """One measurement's row; a run that wrote no document, or failed, says so."""
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return f"| {path.stem} | no result (see {path.with_suffix('.log').name}) |" + " |" * (len(COLUMNS) - 1)
    if document["outcome"] != "ok":
        return f"| {path.stem} | {document['outcome']}: {document['message'][:80]} |" + " |" * (len(COLUMNS) - 1)
    metrics = document["metrics"]
    cells = [form.format(metrics[name]) if name in metrics else "-" for _, name, form in COLUMNS]
    return f"| {path.stem} | " + " | ".join(cells) + " |"


def main(paths: list[str]) -> None:
    print("| configuration | " + " | ".join(title for title, _, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for path in paths:
        print(row(Path(path)))


if __name__ == "__main__":
    main(sys.argv[1:])
