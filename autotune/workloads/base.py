"""A workload kind: everything the rest of autotune needs to know about one kind of trial, said in one place.

What a kind reads of the workload spec and which flags are its own, the figures only its trials report, the
recipes its objectives call for, what it needs of a plan, how long its trials take against a throughput trial,
and the worker code that measures it (named, not imported: this module runs in the study process too).
docs/adding-a-workload.md walks through adding one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.errors import UserError
from autotune.extras import Package
from autotune.figures.capacity import SloTarget
from autotune.figures.objectives import ON_A_TRACE
from autotune.figures.slo import describe_slo, parse_slo
from autotune.specs import WorkloadSpec

if TYPE_CHECKING:
    from autotune.figures.capacity import Capacity


@dataclass(frozen=True)
class Flag:
    """A command-line flag of some workload kinds, as plain data: the CLI makes it an option of every command that
    takes a workload (autotune/cli/flags.py), refuses it under a kind that does not declare it, and hands its value
    to the kind's `options` (None when not given)."""

    name: str  # "--load"
    help: str
    value_type: type[str] | type[int] | type[float] = str  # what the CLI converts the value to
    min_value: float | None = None  # the least and the most a number may be
    max_value: float | None = None
    show_default: str | None = None  # what the help says it defaults to, where not given means a default
    port: bool = False  # a port a trial's server binds: it must be free on this machine before anything runs

    @property
    def parameter(self) -> str:
        """The name the CLI gives its value: "--serve-port" -> "serve_port"."""
        return self.name.removeprefix("--").replace("-", "_")


# The latency target (WorkloadSpec.slo), a flag of the kinds that judge their figures by it.
SLO = Flag(
    "--slo",
    'The latency target, "ttft_p95<=300ms,itl_p95<=50ms" (itl: the time per output token). A configuration that '
    "meets it at no batch (throughput) or load (serve) is off the front.",
)

# How long a trial times its generations (WorkloadSpec.min_seconds), a flag of the kinds that time it in a loop.
MIN_SECONDS = Flag(
    "--min-seconds",
    "Seconds of timed generations at least, per trial (per batch size of a capacity probe): less fits more "
    "trials in a budget, with noisier speed figures.",
    value_type=float,
    min_value=0,
    show_default=f"{WorkloadSpec.min_seconds:g}",
)

# What the objectives of each family call for on most kinds (an objective's family: autotune/strategy/forecast.py).
GENERATION_AIMS: Mapping[str, tuple[str, ...]] = {"speed": ("throughput",), "time": ("latency",), "memory": ("memory",)}


@dataclass(frozen=True)
class DetailsTable:
    """A kind's details as a table of a configuration's card in the report: its class, caption, headings and cells,
    as text (the report escapes and lays it out)."""

    css_class: str
    caption: str
    headings: tuple[str, ...]
    rows: list[tuple[str, ...]]


class KindDetails:
    """What a trial of one kind returns of its own beside its figures (serve: the command that ran, each load level):
    a type its kind owns (`WorkloadKind.details`), written as JSON under the kind's name in a task's result and in the
    trial's user attributes, and rendered by it for the card, the report and `measure --json`."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KindDetails:
        raise NotImplementedError

    def facts(self, metrics: Mapping[str, float]) -> list[str]:
        """Sentences of the configuration's card, in the place of the energy per token's."""
        return []

    def deployed_command(self, capacity: Capacity | None) -> str | None:
        """The command that ran, as a deployment runs it (the card's serve command); None: the plan's."""
        return None

    def table(self) -> DetailsTable | None:
        """A table of the configuration's card in the report; None: none."""
        return None


class WorkloadKind:
    """The handler of one workload kind (`--workload NAME`, and a value of the `workload` knob)."""

    name: ClassVar[str]
    help: ClassVar[str]
    # The command-line flags only some kinds read, this one among them; given with another kind they are bad input.
    flags: ClassVar[tuple[Flag, ...]] = ()
    # What a capacity probe of its trials climbs: "batch" (--batch-size 1-128), "load" (--load rate=1-64), or
    # nothing (a range is bad input).
    probes: ClassVar[str | None] = None
    # The figures only this kind's trials report (metric names, autotune/figures/metrics/).
    metrics: ClassVar[frozenset[str]] = frozenset()
    # An objective's family (speed, time, memory) -> the recipes it calls for, in order (autotune/space/knobs/).
    aims: ClassVar[Mapping[str, tuple[str, ...]]] = GENERATION_AIMS
    # Its trials run what `transformers serve` runs: a plan with knobs serve has no flag for cannot be measured.
    needs_servable_plan: ClassVar[bool] = False
    packages: ClassVar[tuple[Package, ...]] = ()  # what its trials need beyond the core install (autotune.extras)
    # The worker code that measures one trial: "module:function", called with (task spec, phases).
    runner: ClassVar[str] = "autotune.worker.generation_trial:run"
    # Its trials time generate() on the workload's batch, as the hand-written decode loop does
    # (`autotune ceiling`, worker/ceiling.py): their decode throughput compares with that ceiling.
    times_generate: ClassVar[bool] = True
    # A trial's duration against a throughput trial of the same configuration (the forecast's prior).
    time_factor: ClassVar[float] = 1.0
    # What its trials return of their own beside their figures, typed (None: nothing).
    details: ClassVar[type[KindDetails] | None] = None
    # A trace's requests (--traffic) are all there from the replay's start, each waiting for those before it (its time
    # to first token counts from then); False: they are sent one at a time, each timed from its own start.
    requests_wait: ClassVar[bool] = True
    # Figures of a trace's replay its trials measure without one (figures/objectives.py: ON_A_TRACE).
    without_a_trace: ClassVar[frozenset[str]] = frozenset()

    def untraced(self, spec: WorkloadSpec) -> frozenset[str]:
        """The figures of a trace's replay this workload's trials cannot measure: all of them but the kind's own,
        where it replays no trace."""
        return frozenset() if spec.traffic is not None else frozenset(ON_A_TRACE) - self.without_a_trace

    def requests(self, spec: WorkloadSpec) -> int:
        """How many requests a trial runs at once: it sizes the plan (paged cache) and what a value may run with."""
        return spec.batch_size

    def as_run(self, spec: WorkloadSpec) -> WorkloadSpec:
        """The spec as the trials run it, the one stored with them (a kind may fix a field the flags leave open)."""
        return spec

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The spec fields of this kind's own flags (`given`: flag -> value, None where not given): the SLO where it
        takes --slo, the timing's length where it takes --min-seconds; a kind with more flags adds their fields."""
        fields: dict[str, Any] = {"slo": parse_slo(given.get(SLO.name) or "")} if SLO in self.flags else {}
        if MIN_SECONDS in self.flags and given.get(MIN_SECONDS.name) is not None:
            fields["min_seconds"] = given[MIN_SECONDS.name]
        return fields

    def probe_allowance_s(self, spec: WorkloadSpec) -> float:
        """Seconds a trial may take beyond an alike one that ended, because its capacity probe may take a longer course
        (strategy/durations.py adds them to the at-most duration); 0 where the kind cannot say before anything runs."""
        return 0.0

    def describe_probe(self, spec: WorkloadSpec) -> str | None:
        """What a trial's capacity probe measures at most and what that costs, one line for `--dry-run`; None for a
        trial of one shape."""
        return None

    def plan_problem(self, not_servable: Sequence[str]) -> str | None:
        """Why a plan cannot be measured by this kind (its parts `transformers serve` has no flag for), or None."""
        if self.needs_servable_plan and not_servable:
            return f"transformers serve has no flag for: {', '.join(not_servable)}"
        return None

    def describe(self, spec: WorkloadSpec) -> str:
        """The shape of a trial, for summaries: "8 prompts at a time, 128 tokens in, 64 out"; with a trace, "the 48
        requests of demo-trace.jsonl (jsonl, sha256 6208a949), 8 requests at a time through generate() (continuous
        batching: all at once), each with its own lengths"."""
        at_once = f"{_prompts(self.requests(spec))} at a time"
        if len(spec.batch_sizes) > 1:
            sizes = ", ".join(str(size) for size in spec.batch_sizes)
            at_once = f"batches of {sizes} prompts (the largest within the SLO and the memory)"
        if spec.traffic is not None:
            at_once = at_once.replace("prompts", "requests").replace("1 prompt", "1 request")
            if self.requests_wait:  # a kind whose requests wait for their turn: continuous batching takes them whole
                at_once += " through generate() (continuous batching: all at once)"
            return f"{spec.traffic.describe()}, {at_once}, each with its own lengths"
        return f"{at_once}, {spec.input_len} tokens in, {spec.output_len} out"


KINDS: dict[str, WorkloadKind] = {}
DEFAULT_KIND = WorkloadSpec.kind  # --workload's default, and the kind of plans stored before plans named theirs


def register(cls: type[WorkloadKind]) -> type[WorkloadKind]:
    KINDS[cls.name] = cls()
    return cls


def workload_kind(name: str) -> WorkloadKind:
    """The kind of this name; a UserError naming the kinds for any other."""
    try:
        return KINDS[name]
    except KeyError:
        raise UserError(f"--workload {name!r} is not a workload: use {_listed(list(KINDS))}") from None


def workload_as_run(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A workload as its trials run it: what its kind decides itself fixed (`WorkloadKind.as_run`)."""
    spec = WorkloadSpec.from_json(stored)
    return KINDS[spec.kind].as_run(spec).to_json()


def slo_target(spec: WorkloadSpec) -> SloTarget:
    """The SLO a workload's capacities are judged by: under load, a level meets it for a share of its requests."""
    by_share = KINDS[spec.kind].probes == "load"
    return SloTarget(dict(spec.slo), spec.slo_share if by_share else None)


def describe_workload(spec: WorkloadSpec) -> str:
    """One line: the kind and the shape of its trials, "latency, 1 prompt at a time, 128 tokens in, 64 out"."""
    kind = KINDS[spec.kind]
    slo = f"; SLO {describe_slo(spec.slo)}" if spec.slo else ""
    if slo and kind.probes == "load":
        slo += f" for {spec.slo_share:.0%} of requests"
    return f"{spec.kind}, {kind.describe(kind.as_run(spec))}{slo}"


def details_of(written: Mapping[str, Any]) -> KindDetails | None:
    """The details a kind's trial wrote under the kind's name (in a task's result, a trial's user attributes), typed;
    None where no kind's are there."""
    for kind in KINDS.values():
        if kind.details is not None and written.get(kind.name) is not None:
            return kind.details.from_json(written[kind.name])
    return None


def details_written(details: KindDetails | None) -> dict[str, Any]:
    """Each kind that has details -> its trial's, as JSON, or None (how `measure --json` and a result write them)."""
    return {
        kind.name: details.to_json() if details is not None and isinstance(details, kind.details) else None
        for kind in KINDS.values()
        if kind.details is not None
    }


def metrics_of_one_kind() -> dict[str, str]:
    """Figure -> the one kind whose trials report it."""
    return {metric: kind.name for kind in KINDS.values() for metric in kind.metrics}


def kind_flags(kinds: Iterable[WorkloadKind]) -> list[Flag]:
    """Every flag the kinds declare, once, each kind's in its own order (a flag two kinds declare is one flag)."""
    collected: list[Flag] = []
    for kind in kinds:
        for index, flag in enumerate(kind.flags):
            same = next((known for known in collected if known.name == flag.name), None)
            if same is not None:
                if same != flag:
                    raise ValueError(f"workload {kind.name} declares {flag.name} unlike another kind does")
                continue
            later = [known for known in kind.flags[index + 1 :] if known in collected]
            collected.insert(collected.index(later[0]) if later else len(collected), flag)
    return collected


def foreign_flags(kind: WorkloadKind, given: Mapping[str, Any]) -> str | None:
    """Why flags of other kinds, given with this kind, are bad input; None when there are none."""
    owners: dict[str, list[str]] = {}
    for other in KINDS.values():
        for flag in other.flags:
            owners.setdefault(flag.name, []).append(other.name)
    own = {flag.name for flag in kind.flags}
    foreign = [flag for flag, value in given.items() if value is not None and flag not in own and flag in owners]
    if not foreign:
        return None
    kinds = list(dict.fromkeys(name for flag in foreign for name in owners[flag]))
    verb = "applies" if len(foreign) == 1 else "apply"
    return f"{', '.join(foreign)} {verb} only to --workload {_listed(kinds)}"


def _prompts(count: int) -> str:
    return "1 prompt" if count == 1 else f"{count} prompts"


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
