"""What tier 0 (the degenerate share, autotune/worker/measurement/quality/degenerate.py) costs a trial: it runs no
generation (the timed rows, cut at the model's first end-of-sequence token), so its cost is judging the rows, timed
here on the rows of the demo's reference at the default workload (8 rows of 64 tokens), against themselves and
against looping rows.

    python benchmarks/figures/tier0_cost.py
"""

from __future__ import annotations

import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.worker.measurement.quality.degenerate import degenerate_figures

ROWS, TOKENS, EOS = 8, 64, frozenset({2})


def main() -> None:
    rng = random.Random(0)
    reference = [[rng.randrange(3, 1024) for _ in range(TOKENS)] for _ in range(ROWS)]
    looping = [row[:16] + row[16:20] * 12 for row in reference]
    for name, rows in (("the reference's own rows", reference), ("rows that loop", looping)):
        runs = 2000
        seconds = timeit.timeit(lambda rows=rows: degenerate_figures(rows, reference, EOS), number=runs) / runs
        print(f"{name}: {seconds * 1e6:.0f} us per trial ({ROWS} rows of {TOKENS} tokens)")


if __name__ == "__main__":
    main()
