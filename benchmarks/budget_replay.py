"""Replay searches on recorded trial durations, on a simulated clock, for several budgets: the share of each budget
spent in trials cut at the deadline, and the objectives reached, under the budget rule before issue 39 and after.

- before (autotune 03bc740, copied here): a trial starts when its expected duration fits the budget left. The
  strategy expects the median of the trials alike (every compile mode alike), else a plain trial times the priors'
  time factors; the loop, the median of the trials alike, else of all. A queued trial that does not fit there
  stops the search.
- after (search/durations.py): a trial starts when its at-most duration fits; a planned trial that does not fit is
  passed over for the next that fits, in the strategy's order.

A recording is a CPU grid (benchmarks/results/grid-demo-cpu*.json: every configuration measured once; once the
strategy has nothing left to plan, Optuna's sampler proposes) or the study of a real search (a study.db: only its
trials can be replayed; a configuration it did not measure is skipped, having no duration to charge). The clock
starts with the search's preparation and charges each trial its recorded duration plus the time the search spent
between trials (both as the study recorded them; a grid records neither: 0). A trial still running at the deadline
is cut there: that time is the cut share.

    python benchmarks/budget_replay.py reports/gpu/2026-11-26-h200/proof-llama-1b/study.db --budgets 60,90,120,150,180
    python benchmarks/budget_replay.py benchmarks/results/grid-demo-cpu.json --budgets 30,60,120,240 --seeds 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # autotune and benchmarks, run as a script

from autotune import study as studies
from autotune.analysis.pareto import raw_losses
from autotune.figures.metrics import KL_DIVERGENCE, OBJECTIVES, PEAK_MEMORY, THROUGHPUT
from autotune.process.results import Outcome
from autotune.search.durations import Duration, Durations, Ended
from autotune.search.forecast import Forecaster
from autotune.search.loop import overrun_reason
from autotune.search.strategy import (
    Planned,
    Situation,
    _stacks_first,
    next_planned,
    next_queued,
    ruled_out,
    warm_up_set,
)
from autotune.space import KNOBS, Config, SearchSpace, config_key
from autotune.study import make_sampler
from tests.replay import Grid, sampled

optuna.logging.set_verbosity(optuna.logging.ERROR)


@dataclass(frozen=True)
class Recording:
    name: str
    grid: Grid  # the recorded trials, as the strategy replay reads them
    prepare_s: float  # before the first trial
    between_s: float  # between two trials (sampling, storing), on average
    complete: bool  # every configuration of the space recorded: the sampler can take over


def load(path: Path) -> Recording:
    if path.suffix == ".json":
        return Recording(str(path), Grid.load(path), 0.0, 0.0, complete=True)
    return _from_study(path)


def _from_study(path: Path) -> Recording:
    """A real search's trials: the space, the anchors and the run's preparation as its study stored them."""
    storage = studies.open_storage(f"sqlite:///{path}")
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    settings = studies.stored_settings(study)
    launched = [r for r in studies.records(study) if r.launched and r.duration_s is not None]
    trials = {config_key(r.config): _entry(r.config, r.outcome, r.metrics, r.duration_s) for r in launched}
    role = lambda name: next(r.config for r in launched if name in r.roles)  # noqa: E731
    ok = [t["metrics"] for t in trials.values() if t["outcome"] == Outcome.OK]
    raw = raw_losses(ok)
    grid = Grid(
        SearchSpace.from_json(settings.space), trials, role("reference"), role("baseline"),
        settings.profile["kind"], raw.min(axis=0), raw.max(axis=0),
    )  # fmt: skip
    (run,) = studies.search_runs(study)
    between = run["spent_s"].get("between trials (sampling, storing)", 0.0) / max(len(launched), 1)
    return Recording(str(path), grid, run["spent_s"]["preparing"], between, complete=False)


def _entry(config: Config, outcome: str | None, metrics: dict, seconds: float | None) -> dict:
    return {"config": config, "outcome": outcome, "metrics": metrics, "duration_s": seconds}


# ------------------------------------------------------------------------------------------------ the rules


def _old_kind(config: Config) -> tuple:
    """03bc740's duration kind: every compile mode alike."""
    return tuple(
        config.get(name) not in (None, "off") if name == "compile" else knob.duration_group(config.get(name))
        for name, knob in KNOBS.items()
    )


# 03bc740's priors for a compiled trial's time, where they differ from today's: (device, mode) -> factor
_OLD_COMPILE_TIME = {
    ("cpu", "default"): 2.5,
    ("cuda", "max-autotune"): 6.0,
    ("cuda", "max-autotune-no-cudagraphs"): 6.0,
}


class MedianDurations(Durations):
    """03bc740's Forecaster.seconds: the median of the trials alike, else a plain trial's times the priors' factors;
    a trial fit the budget when that fit."""

    def _time(self, name: str, value: object) -> float:
        old = _OLD_COMPILE_TIME.get((self.device, value)) if name == "compile" else None  # type: ignore[call-overload]
        return old if old is not None else super()._time(name, value)

    def of(self, config: Config) -> Duration:
        alike = [s for c, s in self.ended if _old_kind(c) == _old_kind(config)]
        if alike:
            return Duration(statistics.median(alike), statistics.median(alike), alike=True)
        plain = [s for c, s in self.ended if _old_kind(c) == _old_kind(self.baseline)]
        expected = (statistics.median(plain) if plain else 1.0) * self.factor(config)
        return Duration(expected, expected, alike=False)


def _median_overruns(config: Config, durations: Durations, seconds_left: float) -> bool:
    """03bc740's loop.expected_duration_s against the budget left: the median of the trials alike, else of all."""
    ended = durations.ended
    alike = [s for c, s in ended if _old_kind(c) == _old_kind(config)] or [s for _, s in ended]
    return bool(alike) and statistics.median(alike) > seconds_left


def _at_most_overruns(config: Config, durations: Durations, seconds_left: float) -> bool:
    """TrialLoop's check now (loop.overrun_reason)."""
    return overrun_reason(config, durations, seconds_left) is not None


@dataclass(frozen=True)
class Rule:
    name: str
    durations: type[Durations]  # what the strategy's ranking and its passing over read
    overruns: Callable[[Config, Durations, float], bool]  # the loop's check before it launches a trial
    passes_over: bool  # a queued trial the loop finds too long: passed over (after) or the search stops (before)


RULES = (
    Rule("before", MedianDurations, _median_overruns, passes_over=False),
    Rule("after", Durations, _at_most_overruns, passes_over=True),
)


# -------------------------------------------------------------------------------------------- one search


@dataclass
class Run:
    """One simulated search: what ran, what was cut at the deadline, what the budget passed over."""

    budget: float
    launched: list[str] = field(default_factory=list)  # keys of the trials that ended
    cut_s: float = 0.0  # seconds of a trial stopped at the deadline
    cut: str | None = None  # that trial's role
    passed_over: dict[str, float] = field(default_factory=dict)  # role -> at-most seconds
    stop: str = ""
    ratios: list[tuple[bool, float]] = field(default_factory=list)  # per trial: estimated alike?, duration / expected

    @property
    def cut_share(self) -> float:
        return self.cut_s / self.budget


def simulate(recording: Recording, rule: Rule, budget: float, seed: int = 0) -> Run:
    """A search on the recording, with this budget, under this rule (see the module's docstring)."""
    grid = recording.grid
    sampler = optuna.create_study(directions=[m.direction for m in OBJECTIVES], sampler=make_sampler(seed))
    situation = Situation(grid.space, grid.baseline, grid.device)  # type: ignore[arg-type]
    warm_up, rng, run = warm_up_set(grid.space, grid.baseline), random.Random(seed), Run(budget)
    queue = [Planned(c, why) for c, why in ((grid.reference, "reference"), (grid.baseline, "baseline"))]
    ended: list[Ended] = []
    history: list[tuple[int, Config, str]] = []
    clock = recording.prepare_s
    while clock < budget:
        left = budget - clock
        durations = rule.durations(ended, grid.baseline, grid.device)  # type: ignore[arg-type]
        picked = _pick(recording, rule, sampler, queue, run, history, durations, left, warm_up, situation, rng)
        if picked is None:
            return run
        trial, planned = picked
        if rule.overruns(planned.config, durations, left):
            sampler.tell(trial, state=optuna.trial.TrialState.PRUNED)
            if rule.passes_over and planned.why != "sampler":
                run.passed_over.setdefault(planned.why, durations.of(planned.config).at_most or 0.0)
                continue
            run.stop = f"{planned.why} does not fit"
            return run
        entry = grid.trials[config_key(planned.config)]
        if clock + entry["duration_s"] > budget:
            run.cut_s, run.cut, run.stop = budget - clock, planned.why, "cut at the deadline"
            return run
        if ended:  # a scale to expect from
            estimate = durations.of(planned.config)
            run.ratios.append((estimate.alike, entry["duration_s"] / estimate.expected))
        clock += entry["duration_s"] + recording.between_s
        run.passed_over.pop(planned.why, None)  # passed over earlier, it fit later (as TrialLoop._measure)
        run.launched.append(config_key(planned.config))
        ended.append((planned.config, entry["duration_s"]))
        history.append((trial.number, planned.config, entry["outcome"]))
        _tell(sampler, trial, entry)
    run.stop = run.stop or "budget used up"
    return run


def _pick(
    recording: Recording,
    rule: Rule,
    sampler: optuna.Study,
    queue: list[Planned],
    run: Run,
    history: list[tuple[int, Config, str]],
    durations: Durations,
    left: float,
    warm_up: list[Planned],
    situation: Situation,
    rng: random.Random,
) -> tuple[optuna.Trial, Planned] | None:
    """As TrialLoop._next_trial: the anchors, then the strategy's next that fits, then (a complete grid) the sampler."""
    grid = recording.grid
    taken = set(run.launched)
    tried = taken | {config_key(p.config) for p in queue}
    skip = lambda c: grid.space.violation(c) or ruled_out(c, history) or config_key(c) not in grid.trials  # noqa: E731
    measured = {k: (grid.trials[k]["config"], grid.trials[k]["metrics"]) for k in taken}
    measured = {k: entry for k, entry in measured.items() if grid.trials[k]["outcome"] == Outcome.OK}
    planned = queue.pop(0) if queue else None
    if planned is None and not rule.passes_over:  # 03bc740 started the first recommended stacks whatever their time
        first, _ = _stacks_first(situation, Forecaster(grid.space, grid.baseline, grid.device, measured, durations))
        planned = next_planned(first, tried, skip)
    if planned is None:
        passed = lambda p, at_most: run.passed_over.setdefault(p.why, at_most)  # noqa: E731
        planned = next_queued(situation, warm_up, measured, tried, skip, durations, left, passed)
    if planned is not None:
        sampler.enqueue_trial(planned.config)
        trial = sampler.ask()
        return trial, planned
    if not recording.complete:
        run.stop = "nothing recorded left to run"
        return None
    proposal = sampled(sampler, grid, taken, history, True, rng)
    return None if proposal is None else (proposal[0], Planned(proposal[1], "sampler"))


def _tell(sampler: optuna.Study, trial: optuna.Trial, entry: dict) -> None:
    if entry["outcome"] == Outcome.OK:
        sampler.tell(trial, [entry["metrics"][m.name] for m in OBJECTIVES])
    else:
        sampler.tell(trial, state=optuna.trial.TrialState.FAIL)


# ------------------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Reached:
    """What one run found: the best of each objective, and the share of the recording's hypervolume."""

    throughput: float | None
    memory_gb: float | None
    kl: float | None
    hypervolume: float


def reached(recording: Recording, run: Run) -> Reached:
    grid = recording.grid
    ok = [grid.trials[k]["metrics"] for k in run.launched if grid.trials[k]["outcome"] == Outcome.OK]
    best = lambda name, pick: pick(m[name] for m in ok) if ok else None  # noqa: E731
    whole = grid.hypervolume(list(grid.trials))
    share = grid.hypervolume(run.launched) / whole if whole else 0.0
    return Reached(best(THROUGHPUT.name, max), best(PEAK_MEMORY.name, min), best(KL_DIVERGENCE.name, min), share)


def row(recording: Recording, runs: list[Run]) -> str:
    """One budget under one rule: medians over seeds (the mean for the cut share)."""
    found = [reached(recording, run) for run in runs]
    cut = statistics.fmean(run.cut_share for run in runs)
    trials = statistics.median(len(run.launched) for run in runs)
    tok = _median([f.throughput for f in found])
    memory = _median([f.memory_gb for f in found])
    hv = statistics.median(f.hypervolume for f in found)
    cut_roles = sorted({_short(run.cut) for run in runs if run.cut})
    passed = sorted({f"{_short(why)} ({at_most:.0f}s)" for run in runs for why, at_most in run.passed_over.items()})
    notes = "; ".join([*(f"cut: {why}" for why in cut_roles), *(f"passed over: {p}" for p in passed[:4])])
    more = f" and {len(passed) - 4} more" if len(passed) > 4 else ""
    return (
        f"{runs[0].budget:>7.0f}s  {trials:>6.0f}  {cut:>6.1%}  {_figure(tok, '{:.0f}'):>10}  "
        f"{_figure(memory, '{:.3f} GB'):>10}  {hv:>6.1%}  {notes}{more}"
    )


def _short(why: str) -> str:
    """A role without its sources: "recommended for memory: 4-bit NF4 weights, bf16 compute"."""
    return why.split(" (", 1)[0]


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def sweep(recording: Recording, budgets: np.ndarray, seeds: int) -> list[str]:
    """Over many budgets: the mean and largest cut share, how many searches cut a trial, the mean hypervolume; and
    at which budgets one rule reached more hypervolume than the other."""
    searches = [(float(budget), seed) for budget in budgets for seed in range(seeds)]
    runs = {rule.name: [simulate(recording, rule, budget, seed) for budget, seed in searches] for rule in RULES}
    volumes = {name: [reached(recording, run).hypervolume for run in found] for name, found in runs.items()}
    lines = []
    for name, found in runs.items():
        shares = [run.cut_share for run in found]
        lines.append(
            f"{name:<7} mean cut share {statistics.fmean(shares):.1%}, largest {max(shares):.1%}, "
            f"{sum(share > 0 for share in shares)} of {len(found)} searches cut a trial; "
            f"mean hypervolume {statistics.fmean(volumes[name]):.1%}"
        )
    for better, worse in (("after", "before"), ("before", "after")):
        ahead = [
            (b, v - w) for (b, _), v, w in zip(searches, volumes[better], volumes[worse], strict=True) if v > w + 1e-9
        ]
        where = ", ".join(f"{b:g}s (+{gain:.1%})" for b, gain in ahead) or "none"
        lines.append(f"{better} reached more hypervolume than {worse} at: {where}")
    return lines


def ratios(run: Run) -> list[str]:
    """How far the trials' durations landed from the expected ones (the margins of search/durations.py)."""
    lines = []
    for alike, label in ((True, "alike"), (False, "extrapolated")):
        seen = np.sort([ratio for estimated_alike, ratio in run.ratios if estimated_alike == alike])
        if len(seen):
            median, p95 = np.quantile(seen, [0.5, 0.95])
            largest = ", ".join(f"{ratio:.2f}" for ratio in seen[::-1][:2])
            spread = f"from {seen[0]:.2f}, median {median:.2f}, 95th percentile {p95:.2f}, the largest {largest}"
            lines.append(f"  {label:<12} {len(seen):>3} trials: {spread}")
    return lines


def report(recording: Recording, budgets: list[float], seeds: int, sweep_budgets: np.ndarray | None) -> str:
    grid = recording.grid
    total = sum(t["duration_s"] for t in grid.trials.values())
    lines = [
        f"recording {recording.name}: {len(grid.trials)} trials, {total:.0f}s of trials; the clock starts at "
        f"{recording.prepare_s:.1f}s (preparing) and adds {recording.between_s:.2f}s between trials",
        "",
        f"{'rule':<7} {'budget':>8}  {'trials':>6}  {'cut':>6}  {'best tok/s':>10}  {'best mem':>10}  {'HV':>6}  notes",
    ]
    for budget in budgets:
        for rule in RULES:
            runs = [simulate(recording, rule, budget, seed) for seed in range(seeds)]
            lines.append(f"{rule.name:<7} {row(recording, runs)}")
    ample = 2 * (recording.prepare_s + sum(t["duration_s"] + recording.between_s for t in grid.trials.values()))
    lines += ["", "duration over expected (after), in a search with twice the recorded trials' time as its budget:"]
    lines += ratios(simulate(recording, RULES[1], ample))
    if sweep_budgets is not None:
        step = sweep_budgets[1] - sweep_budgets[0] if len(sweep_budgets) > 1 else 0
        lines += ["", f"every budget from {sweep_budgets[0]:g}s to {sweep_budgets[-1]:g}s by {step:g}s:"]
        lines += sweep(recording, sweep_budgets, seeds)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path, help="a grid (.json) or a study (.db)")
    parser.add_argument("--budgets", default="60,120,180", help="seconds, comma-separated")
    parser.add_argument("--seeds", type=int, default=1, help="the sampler's seeds (a grid, once the plan runs out)")
    parser.add_argument("--sweep", default="", help="START:STOP:STEP seconds: the cut share over every such budget")
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    sweep_budgets = np.arange(*(float(x) for x in args.sweep.split(":"))) if args.sweep else None
    print(report(load(args.recording), budgets, args.seeds, sweep_budgets))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
