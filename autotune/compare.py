"""Compare two studies (say last night's and tonight's): how each front configuration's figures moved,
and whether the best throughput at equal-or-better memory and quality regressed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.metrics import KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT
from autotune.pareto import KL_FLOOR  # KL values below it are noise around zero: compare as equal
from autotune.study import TrialRecord

MOVED = (THROUGHPUT.name, "ttft_s", "tpot_s", PEAK_MEMORY.name, KL_DIVERGENCE.name)


@dataclass(frozen=True)
class Movement:
    """One configuration of either front: its figures in both studies, and their relative change."""

    config: dict
    on_front: tuple[str, ...]  # "A", "B" or both
    before: dict[str, float] | None
    after: dict[str, float] | None
    change: dict[str, float]  # (after - before) / before, for figures measured in both


@dataclass(frozen=True)
class Level:
    """A service level of study A's front: its memory and quality, and the best throughput B gives there."""

    config: dict
    throughput_before: float
    memory_gb: float
    kl: float
    best_after: float | None  # B's best throughput at equal-or-better memory and quality (within tolerance)
    config_after: dict | None

    def regression(self) -> float:
        """Share of throughput lost at this level; 1.0 when B has no configuration that meets it."""
        if self.best_after is None:
            return 1.0
        return max(0.0, (self.throughput_before - self.best_after) / self.throughput_before)


@dataclass
class Comparison:
    movements: list[Movement] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    threshold: float = 0.05

    @property
    def regressed(self) -> list[Level]:
        return [level for level in self.levels if level.regression() > self.threshold]


def compare(before: list[TrialRecord], front_before: set[int], after: list[TrialRecord], front_after: set[int],
            threshold: float) -> Comparison:  # fmt: skip
    """Compare study A (before) with study B (after); tolerance for memory and KL is the threshold too."""
    complete_before = {_key(r): r for r in before if r.complete}
    complete_after = {_key(r): r for r in after if r.complete}
    on_front: dict[str, list[str]] = {}
    for label, records, front in (("A", before, front_before), ("B", after, front_after)):
        for record in records:
            if record.number in front:
                on_front.setdefault(_key(record), []).append(label)
    comparison = Comparison(threshold=threshold)
    for key, labels in on_front.items():
        a, b = complete_before.get(key), complete_after.get(key)
        config = (a or b).config
        comparison.movements.append(Movement(config, tuple(labels), _figures(a), _figures(b), _changes(a, b)))
    for record in (r for r in before if r.number in front_before and r.complete):
        comparison.levels.append(_level(record, list(complete_after.values()), threshold))
    return comparison


def _key(record: TrialRecord) -> str:
    return record.config_key or str(sorted(record.config.items()))


def _figures(record: TrialRecord | None) -> dict[str, float] | None:
    if record is None:
        return None
    return {name: record.metrics[name] for name in MOVED if name in record.metrics}


def _changes(a: TrialRecord | None, b: TrialRecord | None) -> dict[str, float]:
    if a is None or b is None:
        return {}
    changes = {}
    for name in MOVED:
        old, new = a.metrics.get(name), b.metrics.get(name)
        if old is None or new is None:
            continue
        if name == KL_DIVERGENCE.name:
            old, new = max(old, KL_FLOOR), max(new, KL_FLOOR)
        if old:
            changes[name] = (new - old) / old
    return changes


def _level(record: TrialRecord, candidates: list[TrialRecord], tolerance: float) -> Level:
    memory, kl = record.metrics[PEAK_MEMORY.name], record.metrics[KL_DIVERGENCE.name]
    fitting = [
        c
        for c in candidates
        if c.metrics[PEAK_MEMORY.name] <= memory * (1 + tolerance)
        and max(c.metrics[KL_DIVERGENCE.name], KL_FLOOR) <= max(kl, KL_FLOOR) * (1 + tolerance)
    ]
    best = max(fitting, key=lambda c: c.metrics[THROUGHPUT.name], default=None)
    return Level(
        config=record.config,
        throughput_before=record.metrics[THROUGHPUT.name],
        memory_gb=memory,
        kl=kl,
        best_after=best.metrics[THROUGHPUT.name] if best else None,
        config_after=best.config if best else None,
    )
