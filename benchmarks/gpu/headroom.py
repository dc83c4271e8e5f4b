"""The headroom phase of benchmarks/gpu_session.sh, summarised: autotune's measured best stack against the hand loop.

Reads OUT/measure-b1.json and OUT/measure-b8.json (`autotune measure --json`) and OUT/ceiling.json
(`autotune ceiling --json`), prints a Markdown table; a figure that is missing says so.

    python benchmarks/gpu/headroom.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rows(out: Path) -> list[str]:
    ceilings = {figure["batch_size"]: figure for figure in _load(out / "ceiling.json") or []}
    lines = [
        "| batch | autotune measure (static + reduce-overhead) | hand loop | fraction | roofline: autotune, loop |",
        "|---|---|---|---|---|",
    ]
    for batch in (1, 8):
        measured, ceiling = _load(out / f"measure-b{batch}.json"), ceilings.get(batch)
        if measured is None or measured.get("outcome") != "ok" or ceiling is None:
            why = "no ceiling figure (ceiling.log)" if ceiling is None else f"measure-b{batch} did not complete"
            lines.append(f"| {batch} | – | – | cannot be computed: {why} | – |")
            continue
        tok_s, loop_tok_s = measured["metrics"]["throughput_tok_s"], ceiling["decode_tok_s"]
        share = measured["metrics"].get("roofline_fraction")
        lines.append(
            f"| {batch} | {tok_s:.1f} tok/s | {loop_tok_s:.1f} tok/s | {tok_s / loop_tok_s:.2f}x "
            f"| {'–' if share is None else f'{share:.1%}'}, {ceiling['roofline_fraction']:.1%} |"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]))))
