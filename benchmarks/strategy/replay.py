"""Replay search strategies against a measured grid and print the table: the hypervolume each finds, as a share of
the whole grid's, after a share of the grid's trials, and the trial time to 95% of it (the harness:
autotune/testing/replay.py).

    python benchmarks/strategy/replay.py benchmarks/results/grid-demo-cpu.json --seeds 20

`--strategies` takes random, tpe, nsga2, gp, autotune, and the variants autotune-warm-up-only and autotune-tpe-default.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

from autotune.testing.replay import SAMPLERS, Curve, Grid, ahead_at_every_budget, compared_trials, replay

# Optuna's GPSampler takes minutes per replay once it has seen ~100 trials (a 300-configuration grid):
# its replays stop at the table's last column, so its time to 95% shows only for seeds that reach it there.
SLOW_STRATEGIES = ("gp",)
DEFAULT_STRATEGIES = ("random", "tpe", "nsga2", "gp", "autotune")


def summarize(
    grid: Grid,
    curves: dict[str, list[Curve]],
    shares: tuple[float, ...] = (0.10, 0.25, 0.50),
    minutes: tuple[float, ...] = (),
) -> str:
    """The table: hypervolume found after a share of the grid's trials, and after minutes of trial time."""
    n = len(grid.trials)
    ran = sum(t["outcome"] == "ok" for t in grid.trials.values())
    total = sum(t["duration_s"] for t in grid.trials.values()) / 60
    lines = [f"grid: {n} configurations, {ran} ran, {total:.1f} min of trials in all", ""]
    head = "".join(f"  at {share:.0%} ({math.ceil(share * n)} trials)   " for share in shares)
    head += "".join(f"  after {minute:g} min              " for minute in minutes)
    lines.append(f"{'strategy':<10}{head}  time to 95% of the grid's hypervolume")
    for name, runs in curves.items():
        cells = []
        for share in shares:
            values = [curve.at_trials(math.ceil(share * n)) for curve in runs]
            cells.append(f"  {statistics.median(values):6.1%} [{min(values):.1%}-{max(values):.1%}]")
        for minute in minutes:
            values = [curve.at_seconds(minute * 60) for curve in runs]
            cells.append(f"  {statistics.median(values):6.1%} [{min(values):.1%}-{max(values):.1%}]")
        times = [curve.time_to(0.95) for curve in runs]
        finite = [t for t in times if math.isfinite(t)]
        reach = f"{statistics.median(times) / 60:5.1f} min" if len(finite) * 2 > len(times) else "   never"
        spread = f" [{min(finite) / 60:.1f}-{max(finite) / 60:.1f}]" if finite else ""
        lines.append(f"{name:<10}{''.join(cells)}  {reach}{spread} ({len(finite)}/{len(times)} seeds reach it)")
    return "\n".join(lines)


def _replays(grid: Grid, strategy: str, seeds: int, least: int) -> list[Curve]:
    if strategy in SLOW_STRATEGIES:
        return [replay(grid, strategy, seed, budget=least) for seed in range(seeds)]
    return [replay(grid, strategy, seed, enough=least) for seed in range(seeds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), help=f"of {', '.join(SAMPLERS)}")
    parser.add_argument("--budgets", default="10,25,50", help="the table's columns: percentages of the grid's trials")
    parser.add_argument("--gp-seeds", type=int, help="seeds for gp (default: --seeds); see SLOW_STRATEGIES")
    parser.add_argument("--minutes", default="", help="more columns: the share found after these minutes of trials")
    args = parser.parse_args()
    grid = Grid.load(args.grid)
    shares = tuple(int(percent) / 100 for percent in args.budgets.split(","))
    least = math.ceil(max(shares) * len(grid.trials))
    names = args.strategies.split(",")
    seeds = {name: args.gp_seeds if name == "gp" and args.gp_seeds else args.seeds for name in names}
    curves = {name: _replays(grid, name, seeds[name], least) for name in names}
    minutes = tuple(float(minute) for minute in args.minutes.split(",") if minute)
    print(summarize(grid, curves, shares, minutes))
    if "autotune" in curves:
        print()
        for other in [name for name in curves if not name.startswith("autotune")]:
            verdict = ahead_at_every_budget(grid, curves["autotune"], curves[other])
            upto = compared_trials(curves["autotune"] + curves[other])
            print(f"autotune ahead of {other} (mean over seeds) after every number of trials up to {upto}: {verdict}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
