"""What a study optimises: `--objective` presets, `--objectives` lists, and whether a device can produce them.

A preset is what a user means by one word: the objectives (in the order Optuna stores their values;
the first one sorts the front and leads the strategy), the workload that measures them, and the
constraints that keep quality. Flags the user gives override the preset's: `--workload` its workload,
`--constraint` its constraints, `--objectives` its objectives. docs/usage.md ("Objectives") says why each is so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autotune.errors import UserError
from autotune.figures.constraints import ALIASES
from autotune.figures.metrics import (
    GOODPUT_TOKENS,
    METRICS,
    OBJECTIVES,
    PREFIX_HIT_RATE,
    THROUGHPUT,
    WASTED_SHARE,
    Metric,
)


@dataclass(frozen=True)
class Preset:
    name: str
    objectives: tuple[str, ...]  # metric names
    workload: str  # the workload kind that measures them
    constraints: tuple[str, ...]  # as `--constraint` reads them


# Measured through each configuration's own decoding path (docs/usage.md, "Objectives", says why these bounds):
# KL in nats/token, where lower-precision dtypes stay far under it; the share of the reference's greedy tokens
# the configuration puts first, each after the reference's own prefix; and (tier 0) the share of its own free-running
# generations that are degenerate where the reference's are not.
QUALITY_KEPT = ("kl<=0.01", "tokens>=0.95", "degenerate<=0.25")

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("latency", ("tpot_s", "ttft_s"), "latency", QUALITY_KEPT),
        Preset("throughput", ("throughput_tok_s", "peak_memory_gb"), "throughput", QUALITY_KEPT),
        Preset("balanced", tuple(metric.name for metric in OBJECTIVES), "throughput", ()),
        Preset("memory", ("peak_memory_gb", "kl_divergence", "throughput_tok_s"), "throughput", ()),
    )
}

ENERGY = "energy_j_per_token"


def preset_named(name: str) -> Preset:
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise UserError(f"--objective {name!r} is not a preset: use {', '.join(PRESETS)}") from None


def parse_objectives(text: str) -> tuple[str, ...]:
    """`goodput,memory,kl` -> metric names, in the order given; UserError for an unknown or repeated one."""
    names: list[str] = []
    for word in (part.strip().lower() for part in text.split(",")):
        name = ALIASES.get(word, (word, ""))[0]
        metric = METRICS.get(name)
        if metric is None or metric.direction is None:
            known = ", ".join(sorted({*_objective_aliases(), *(n for n, m in METRICS.items() if m.direction)}))
            raise UserError(f"--objectives: {word!r} is not an objective; use a comma-separated list of {known}")
        if name in names:
            raise UserError(f"--objectives names {name} twice; give each objective once")
        names.append(name)
    return tuple(names)


def _objective_aliases() -> list[str]:
    return [alias for alias, (name, _) in ALIASES.items() if METRICS[name].direction is not None]


# Figures of a request trace's replay (--traffic): a kind's trials measure them on a trace, or where the kind says it
# measures them without one (workloads/: WorkloadKind.without_a_trace).
ON_A_TRACE = (GOODPUT_TOKENS.name, WASTED_SHARE.name, PREFIX_HIT_RATE.name)


def why_unavailable(
    metric: Metric,
    workload: str,
    of_one_kind: Mapping[str, str],
    device_type: str,
    has_energy_counter: bool,
    untraced: frozenset[str] = frozenset(),
) -> str | None:
    """Why trials of this study could not produce the figure, or None when they can.

    `of_one_kind`: figure -> the one workload kind whose trials report it (autotune.workloads.metrics_of_one_kind);
    `untraced`: the figures of a trace's replay this study's trials cannot measure (it replays none).
    """
    owner = of_one_kind.get(metric.name)
    if owner is not None and owner != workload:
        return f"{metric.name} is measured under --workload {owner} only (this study's workload is {workload})"
    if metric.name in untraced:
        return f"{metric.name} is measured on a request trace only (give --traffic)"
    if metric.name == ENERGY and not has_energy_counter:
        where = "a CPU" if device_type == "cpu" else "this GPU (NVML reports no energy counter)"
        return f"{metric.name} needs NVML's GPU energy counter, and {where} has none"
    return None


def check_available(
    objectives: Sequence[str],
    workload: str,
    of_one_kind: Mapping[str, str],
    device_type: str,
    has_energy_counter: bool,
    untraced: frozenset[str] = frozenset(),
) -> None:
    """One UserError line for the first objective no trial of this study could produce."""
    for name in objectives:
        reason = why_unavailable(METRICS[name], workload, of_one_kind, device_type, has_energy_counter, untraced)
        if reason is not None:
            raise UserError(f"objective {reason}; choose other --objectives")


@dataclass(frozen=True)
class SearchGoal:
    """What a search optimises and under which bounds, after a preset and the user's own flags."""

    objectives: tuple[str, ...]  # empty: none asked (a new study gets the default three, a resumed one its own)
    workload: str | None  # the preset's workload kind, None where the user chose it or no preset was given
    constraints: tuple[str, ...]
    preset_guard: bool = False  # the constraints are the preset's, not the user's
    objectives_given: bool = False  # the user listed them (--objectives)

    def on_a_trace(self) -> SearchGoal:
        """The goal of a search that replays a request trace (--traffic): where the objectives are a preset's or the
        default three, goodput in tokens (the tokens the requests asked for, per second of the replay) takes the
        place of decode throughput, which counts no time a request waited or was prefilled."""
        if self.objectives_given:
            return self
        chosen = self.objectives or tuple(metric.name for metric in OBJECTIVES)
        return replace(self, objectives=tuple(GOODPUT_TOKENS.name if n == THROUGHPUT.name else n for n in chosen))


def search_goal(
    preset: str | None, objectives: str | None, workload_given: bool, constraints: Sequence[str]
) -> SearchGoal:
    """The preset's choices, each replaced by what the user gave explicitly."""
    chosen = preset_named(preset) if preset is not None else None
    names = parse_objectives(objectives) if objectives is not None else ()
    if chosen is None:
        return SearchGoal(names, None, tuple(constraints), objectives_given=bool(names))
    return SearchGoal(
        names or chosen.objectives,
        None if workload_given else chosen.workload,
        tuple(constraints) if constraints else chosen.constraints,
        preset_guard=not constraints and bool(chosen.constraints),
        objectives_given=bool(names),
    )
