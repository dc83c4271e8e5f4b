"""Compare two studies (say last night's and tonight's): how each front configuration's figures moved,
and whether the best throughput at equal-or-better memory and quality regressed.

Each figure has its own tolerance, larger than its run-to-run noise, so that noise alone never raises a
regression: a later configuration "fits" a level of the earlier front when its memory and KL are
within their tolerances of the level's, and the level regressed when the best throughput that fits
is lower by more than the throughput tolerance, or when nothing fits at all.

Where both studies were evaluated on a task (tier 1, --eval), each configuration evaluated in both has its answers set
against each other item by item (analysis/task_changes.py): answering fewer right, or flipping more, beyond chance and
its tolerance, is a regression too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autotune.analysis.capacity import AtCapacity, at_capacity
from autotune.analysis.task_changes import TaskComparison, compare_tasks
from autotune.analysis.tolerances import DEFAULT_TOLERANCES, GivenTolerances, Tolerances
from autotune.errors import UserError
from autotune.figures.capacity import SloTarget
from autotune.figures.metrics import KL_DIVERGENCE, KL_FLOOR, METRICS, PEAK_MEMORY, THROUGHPUT, compared
from autotune.figures.quality import ON_THE_PATH
from autotune.study import DEFAULT_WAITING, TrialRecord, Waiting
from autotune.study.evaluations import TaskAnswers, task_answers
from autotune.study.opened import OpenedStudy, Terms

__all__ = [
    "DEFAULT_TOLERANCES",
    "Comparison",
    "GivenTolerances",
    "Level",
    "Miss",
    "Movement",
    "Tolerances",
    "compare",
    "compare_studies",
]

MOVED = tuple(metric.name for metric in compared())  # each metric says whether compare follows it


@dataclass(frozen=True)
class Movement:
    """One configuration of either front: its figures in both studies, and their relative change."""

    config: dict
    on_front: tuple[str, ...]  # "A", "B" or both
    before: dict[str, float] | None
    after: dict[str, float] | None
    change: dict[str, float]  # (after - before) / before, for figures measured in both


@dataclass(frozen=True)
class Miss:
    """The later configuration nearest to fitting a level: its figures and the bounds it exceeds."""

    config: dict
    throughput: float
    memory_gb: float
    kl: float
    over: dict[str, float]  # "memory" / "KL" -> how far over the level's own value, as a share of it


@dataclass(frozen=True)
class Level:
    """A service level of study A's front: its memory and quality, and the best throughput B gives there."""

    config: dict
    throughput_before: float
    memory_gb: float
    kl: float
    best_after: float | None  # B's best throughput at equal-or-better memory and quality (within tolerance)
    config_after: dict | None
    nearest_miss: Miss | None = None  # when nothing of B fits: what came nearest, and by how much it missed
    at_capacity_before: AtCapacity | None = None  # where the level's configuration probed its capacity
    at_capacity_after: AtCapacity | None = None  # and B's best there

    def change(self) -> float | None:
        """(after - before) / before of the best throughput that fits; None when nothing fits."""
        if self.best_after is None:
            return None
        return (self.best_after - self.throughput_before) / self.throughput_before

    def regression(self) -> float:
        """Share of throughput lost at this level; 1.0 when B has no configuration that meets it."""
        change = self.change()
        return 1.0 if change is None else max(0.0, -change)

    def regressed_figure(self, tolerances: Tolerances) -> str | None:
        """What regressed here: "throughput", or the bounds nothing of B meets ("memory", "KL"); None if fine."""
        if self.best_after is None:
            missed = self.nearest_miss.over if self.nearest_miss else {}
            return " and ".join(missed) or "throughput"  # no complete trial in B at all
        return "throughput" if self.regression() > tolerances.throughput else None


@dataclass
class Comparison:
    movements: list[Movement] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    tolerances: Tolerances = DEFAULT_TOLERANCES["cuda"]
    target: SloTarget | None = None  # the SLO both studies were searched within
    not_compared: str | None = None  # why their figures do not compare (another SLO); nothing else is set then
    quality_apart: str | None = None  # why their quality figures do not compare (measured on other paths)
    task: TaskComparison | None = None  # where both were evaluated on a task: each configuration's answers, paired
    traffic_apart: str | None = None  # compared anyway (--across-traffic): the different traffic each replayed

    @property
    def threshold(self) -> float:
        return self.tolerances.throughput

    @property
    def regressed(self) -> list[Level]:
        return [level for level in self.levels if level.regressed_figure(self.tolerances)]

    @property
    def regression(self) -> bool:
        """Whether anything regressed: a level of the earlier front, or a configuration's answers on the task."""
        return bool(self.regressed_figures())

    def regressed_figures(self) -> list[str]:
        """What regressed: "throughput", "memory", "KL" at some level of the earlier front, then "task accuracy",
        "task flips" on some configuration, in that order."""
        named = " and ".join(level.regressed_figure(self.tolerances) or "" for level in self.regressed)
        on_task = self.task.regressed(self.tolerances) if self.task else []
        return [figure for figure in ("throughput", "memory", "KL") if figure in named] + on_task


def compare_studies(
    before: OpenedStudy, after: OpenedStudy, given: GivenTolerances, across_traffic: bool = False
) -> Comparison:
    """`autotune compare`: the earlier study against the later, with the tolerances given, else those of the earlier
    study's device; a UserError when their figures at capacity do not compare (searched within other SLOs), or when
    they replayed other traffic, unless asked to compare across it."""
    apart = traffic_apart(before, after)
    if apart is not None and not across_traffic:
        raise UserError(f"{apart}; their figures measure other requests: pass --across-traffic to compare them anyway")
    tolerances = given.on(before.settings.device_type)
    tasks = (task_answers(before.study.user_attrs), task_answers(after.study.user_attrs))
    comparison = compare(before.records, before.front_numbers, after.records, after.front_numbers, tolerances,
                         (before.terms, after.terms), tasks)  # fmt: skip
    if comparison.not_compared:
        why = f"{before.name} and {after.name} do not compare: {comparison.not_compared}"
        raise UserError(f"{why}; compare studies searched with the same --slo (autotune best prints each one's)")
    return replace(comparison, traffic_apart=apart)


def traffic_apart(before: OpenedStudy, after: OpenedStudy) -> str | None:
    """How the traffic two studies replayed differs (--traffic, or one shape of requests); None where it is the same."""
    ours, theirs = before.settings.workload.traffic, after.settings.workload.traffic
    if ours == theirs:
        return None
    described = [t.describe() if t else "one shape of requests (no --traffic)" for t in (ours, theirs)]
    return f"{before.name} replayed {described[0]}, {after.name} {described[1]}"


def compare_stored(
    study_a: str,
    storage_a: str,
    study_b: str,
    storage_b: str,
    given: GivenTolerances,
    waiting: Waiting = DEFAULT_WAITING,
    across_traffic: bool = False,
) -> Comparison:
    """compare_studies of two stored studies, each by its name and storage URL."""
    before, after = OpenedStudy.open(study_a, storage_a, waiting), OpenedStudy.open(study_b, storage_b, waiting)
    return compare_studies(before, after, given, across_traffic)


def compare(before: list[TrialRecord], front_before: set[int], after: list[TrialRecord], front_after: set[int],
            tolerances: Tolerances, terms: tuple[Terms, Terms] | None = None,
            tasks: tuple[TaskAnswers | None, TaskAnswers | None] = (None, None)) -> Comparison:  # fmt: skip
    """Compare study A (before) with study B (after); `terms`: what each study's figures at capacity hold under;
    `tasks`: each one's answers on its task, where it was evaluated on one."""
    if terms is not None and (why := terms[0].target.differs(terms[1].target)):
        return Comparison(tolerances=tolerances, not_compared=f"{why}: figures at capacity do not compare")
    complete_before = {_key(r): r for r in before if r.complete}
    complete_after = {_key(r): r for r in after if r.complete}
    on_front: dict[str, list[str]] = {}
    for label, records, front in (("A", before, front_before), ("B", after, front_after)):
        for record in records:
            if record.number in front:
                on_front.setdefault(_key(record), []).append(label)
    apart = quality_apart(list(complete_before.values()), list(complete_after.values()))
    target = terms[0].target if terms and terms[0].target.slo else None
    comparison = Comparison(tolerances=tolerances, target=target, quality_apart=apart)
    if apart:  # levels are matched on memory alone, and no quality figure is said to have moved
        tolerances = replace(tolerances, kl=math.inf)
    for key, labels in on_front.items():
        a, b = complete_before.get(key), complete_after.get(key)
        config = (a or b).config
        changes = {name: c for name, c in _changes(a, b).items() if not (apart and name in ON_THE_PATH)}
        comparison.movements.append(Movement(config, tuple(labels), _figures(a), _figures(b), changes))
    for record in (r for r in before if r.number in front_before and r.complete):
        level = _level(record, list(complete_after.values()), tolerances)
        comparison.levels.append(_at_capacity(level, record, complete_after, terms) if terms else level)
    comparison.task = _on_the_task(tasks, on_front, complete_before, complete_after)
    return comparison


def _on_the_task(
    tasks: tuple[TaskAnswers | None, TaskAnswers | None],
    on_front: dict[str, list[str]],
    before: dict[str, TrialRecord],
    after: dict[str, TrialRecord],
) -> TaskComparison | None:
    """The configurations on either front that both studies measured, their answers on the task set side by side."""
    both = [key for key in on_front if key in before and key in after]
    return compare_tasks(*tasks, [(before[key].config, before[key].number, after[key].number) for key in both])


def quality_apart(before: list[TrialRecord], after: list[TrialRecord]) -> str | None:
    """Why two studies' quality figures do not compare: their trials measured them on other paths (a study written
    before quality was measured on the decoding path, 2026-11-27, against one after)."""
    paths = [sorted({record.quality_path for record in records}) for records in (before, after)]
    if not all(paths) or paths[0] == paths[1]:
        return None
    said = [" and ".join(found) for found in paths]
    return f"quality measured on other paths (A: {said[0]}; B: {said[1]}): KL and agreements are not compared"


def _at_capacity(level: Level, record: TrialRecord, after: dict[str, TrialRecord], terms: tuple[Terms, Terms]) -> Level:
    """The level with the figures at capacity of its configuration and of B's best there, where they probed one."""
    best = next((r for r in after.values() if r.config == level.config_after), None) if level.config_after else None
    return replace(
        level,
        at_capacity_before=at_capacity(record, terms[0]),
        at_capacity_after=at_capacity(best, terms[1]) if best else None,
    )


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
        if floor := METRICS[name].log_floor:  # below its floor (KL's), equal
            old, new = max(old, floor), max(new, floor)
        if old:
            changes[name] = (new - old) / old
    return changes


def _excess(level: TrialRecord, candidate: TrialRecord, tolerances: Tolerances) -> dict[str, float]:
    """The bounds of the level that the candidate exceeds beyond tolerance: name -> share over the level."""
    memory, kl = level.metrics[PEAK_MEMORY.name], max(level.metrics[KL_DIVERGENCE.name], KL_FLOOR)
    over = {
        "memory": candidate.metrics[PEAK_MEMORY.name] / memory - 1,
        "KL": max(candidate.metrics[KL_DIVERGENCE.name], KL_FLOOR) / kl - 1,
    }
    allowed = {"memory": tolerances.memory, "KL": tolerances.kl}
    return {name: share for name, share in over.items() if share > allowed[name]}


def _level(record: TrialRecord, candidates: list[TrialRecord], tolerances: Tolerances) -> Level:
    excesses = [(candidate, _excess(record, candidate, tolerances)) for candidate in candidates]
    fitting = [candidate for candidate, over in excesses if not over]
    best = max(fitting, key=lambda c: c.metrics[THROUGHPUT.name], default=None)
    return Level(
        config=record.config,
        throughput_before=record.metrics[THROUGHPUT.name],
        memory_gb=record.metrics[PEAK_MEMORY.name],
        kl=record.metrics[KL_DIVERGENCE.name],
        best_after=best.metrics[THROUGHPUT.name] if best else None,
        config_after=best.config if best else None,
        nearest_miss=None if best else _nearest_miss(excesses),
    )


def _nearest_miss(excesses: list[tuple[TrialRecord, dict[str, float]]]) -> Miss | None:
    """The candidate that misses by the least (largest excess), the faster one on a tie."""
    if not excesses:
        return None
    candidate, over = min(excesses, key=lambda pair: (max(pair[1].values()), -pair[0].metrics[THROUGHPUT.name]))
    m = candidate.metrics
    return Miss(candidate.config, m[THROUGHPUT.name], m[PEAK_MEMORY.name], m[KL_DIVERGENCE.name], over)
