"""What the study process and the trial worker say to each other: a task spec in, a result out.

Both are plain dataclasses written as JSON files; neither side needs the other's imports.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from autotune.figures.capacity import Capacity
from autotune.for_tests import Fault
from autotune.process.ceiling import Ceiling, CeilingSpec
from autotune.space.plan import Plan
from autotune.specs import EvalSpec, ModelSpec, QualitySpec, WorkloadSpec
from autotune.traffic.shape import TrafficShape
from autotune.workloads import KindDetails, details_of, details_written

TaskKind = Literal["prepare", "trial", "ceiling", "evaluate"]


class Outcome(StrEnum):
    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    UNSUPPORTED = "unsupported"
    CRASHED = "crashed"
    ERROR = "error"
    BUDGET = "budget"  # stopped because the study's budget ran out
    BROKEN = "broken"  # ran, but its output is unusable (NaN/inf logits, one token repeated, empty)
    INTERRUPTED = "interrupted"  # SIGINT or SIGTERM stopped the search or worker while it ran


@dataclass
class Candidate:
    """A configuration together with the plan it turns into, built once in the study process (a trial's, in
    search/trial.py) and read once from the task spec by the worker."""

    config: dict[str, Any]
    plan: Plan

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "plan": self.plan.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Candidate:
        return cls(data["config"], Plan.from_json(data["plan"]))


@dataclass
class CompileCacheSpec:
    """Where a study's trial compiles and what it loads first (autotune/worker/compile_cache.py)."""

    folder: str  # the study's compile folder on this machine; the worker compiles in the subfolder its key names
    archives: list[str] = field(default_factory=list)  # the study's archives of compiled code, fetched to this machine
    archive_to: str | None = None  # where the worker writes the archive of what it compiled anew


COLD, WARM = "cold", "warm"


@dataclass
class CompileFigures:
    """What a trial's process compiled, whichever code called torch.compile, and whether torch's caches held it."""

    graphs: int = 0  # graphs Dynamo compiled or found in the caches
    missed: int = 0  # of them, compiled anew (inductor's FX-graph cache missed or was bypassed)
    seconds: float = 0.0  # torch's own compile time in the process (Dynamo and inductor), cache lookups included
    loaded: int = 0  # archives loaded into the folder before it ran
    notes: list[str] = field(default_factory=list)  # archives ignored, and why
    archive: str | None = None  # the archive of what it compiled anew (a file beside its log)
    artifact: str | None = None  # that archive's artifact id, once stored with the study

    @property
    def compiled(self) -> bool:
        return self.graphs > 0

    @property
    def cache(self) -> str:
        """cold: at least one graph compiled anew; warm: every graph found in the caches."""
        return COLD if self.missed or not self.graphs else WARM

    def to_stored(self) -> dict[str, Any]:
        """What the study keeps of it (a trial's user attribute): no notes, no local path."""
        stored = {"cache": self.cache, "seconds": round(self.seconds, 2), "graphs": self.graphs, "missed": self.missed}
        return stored | ({"artifact": self.artifact} if self.artifact else {})

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> CompileFigures:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class TaskSpec:
    task: TaskKind
    model: ModelSpec
    device: str
    cache_dir: str
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)
    candidate: Candidate | None = None  # trial: what to measure
    reference_candidates: list[Candidate] = field(default_factory=list)  # prepare: most precise first
    reference_path: str | None = None  # trial: the reference log-probabilities to compare with
    greedy_reference_path: str | None = None  # trial: the reference's greedy continuations of the inputs
    memory_cap_bytes: int | None = None  # cap GPU memory to the profile's size
    memory_limit_bytes: float | None = (
        None  # a capacity probe skips a batch predicted to need more (profile, --constraint)
    )
    bandwidth_gb_s: float | None = None  # peak memory bandwidth of the card trials run on, for the roofline
    price_per_hour: float | None = None  # for the cost per million tokens
    fault: Fault | None = None  # tests: what makes the worker fail for real (autotune/for_tests.py)
    ceiling: CeilingSpec | None = None  # ceiling: the hand loop's dtype, compile mode, batches and timing
    evaluation: EvalSpec | None = None  # evaluate: the task (demo, a name or a folder) and how many of its items
    compile_cache: CompileCacheSpec | None = None  # a study's trial: its compile folder and archives; None: torch's own

    def to_json(self) -> dict[str, Any]:
        """Plain data: the typed parts (the workload, the candidates' plans, a test's fault) written by their own."""
        untyped = replace(self, workload=WorkloadSpec(), candidate=None, reference_candidates=[], fault=None)
        return asdict(untyped) | {
            "workload": self.workload.to_json(),
            "candidate": self.candidate.to_json() if self.candidate else None,
            "reference_candidates": [candidate.to_json() for candidate in self.reference_candidates],
            "fault": self.fault.to_json() if self.fault else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskSpec:
        data = dict(data)
        data["model"] = ModelSpec(**data["model"])
        data["workload"] = WorkloadSpec.from_json(data["workload"])
        data["quality"] = QualitySpec(**data["quality"])
        data["candidate"] = Candidate.from_json(data["candidate"]) if data.get("candidate") else None
        data["reference_candidates"] = [Candidate.from_json(c) for c in data.get("reference_candidates", [])]
        data["fault"] = Fault.from_json(data["fault"]) if data.get("fault") else None
        data["ceiling"] = CeilingSpec.from_json(data["ceiling"]) if data.get("ceiling") else None
        data["evaluation"] = EvalSpec(**data["evaluation"]) if data.get("evaluation") else None
        data["compile_cache"] = CompileCacheSpec(**data["compile_cache"]) if data.get("compile_cache") else None
        return cls(**data)


@dataclass
class FoundReference:
    """The reference outputs a prepare task computed, or found cached, for its most precise configuration."""

    config: dict[str, Any]
    path: str  # its log-probabilities on the evaluation text
    greedy_path: str  # its greedy continuations of the workload's inputs
    perplexity: float


@dataclass
class Answers:
    """What an evaluate task returns: the task, the metric that judged its items, each item's answer right or wrong
    by "<task>/<item>", and the path its generations took (autotune.figures.quality)."""

    task: str
    metric: str
    answers: dict[str, bool]
    path: str


@dataclass
class TaskDetails:
    """What a task returns besides its figures; each field belongs to one kind of task, None elsewhere."""

    model_path: str | None = None  # prepare: the folder the model loads from
    model: dict[str, Any] | None = None  # prepare: parameters, checkpoint dtype, default attention, position limit
    reference: FoundReference | None = None  # prepare
    traffic: TrafficShape | None = None  # prepare with a trace: its replayed requests in the model's tokens
    plan: Plan | None = None  # trial: the plan that ran, when this installation changed the planned one
    # a trial of a kind with details of its own (serve: the command that ran, each load level), its kind's type
    workload: KindDetails | None = None
    capacity: Capacity | None = None  # a trial with an SLO or a capacity probe: its unit, target, points and stop
    quality_path: str | None = None  # trial: the path its quality figures came from (autotune.figures.quality)
    ceilings: list[Ceiling] | None = None  # ceiling: the hand loop's figures per batch
    evaluation: Answers | None = None  # evaluate: the task, its metric, each item's answer right or wrong, path
    compile: CompileFigures | None = None  # a study's trial: what it compiled, cold or warm, and its archive

    def to_json(self) -> dict[str, Any]:
        written = {
            "model_path": self.model_path,
            "model": self.model,
            "reference": asdict(self.reference) if self.reference else None,
            "traffic": self.traffic.to_json() if self.traffic else None,
            "plan": self.plan.to_json() if self.plan else None,
            **(details_written(self.workload) if self.workload is not None else {}),
            "capacity": self.capacity.to_json() if self.capacity else None,
            "quality_path": self.quality_path,
            "ceilings": None if self.ceilings is None else [asdict(ceiling) for ceiling in self.ceilings],
            "evaluation": asdict(self.evaluation) if self.evaluation else None,
            "compile": asdict(self.compile) if self.compile else None,
        }
        return {key: value for key, value in written.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskDetails:
        reference, capacity, ceilings = data.get("reference"), data.get("capacity"), data.get("ceilings")
        evaluation, compiled, plan = data.get("evaluation"), data.get("compile"), data.get("plan")
        traffic = data.get("traffic")
        known = {known.name for known in fields(cls)}
        return cls(
            **{
                **{key: value for key, value in data.items() if key in known},
                "reference": FoundReference(**reference) if reference else None,
                "traffic": TrafficShape.from_json(traffic) if traffic else None,
                "plan": Plan.from_json(plan) if plan else None,
                "workload": details_of(data),
                "capacity": Capacity.from_json(capacity) if capacity else None,
                "ceilings": None if ceilings is None else [Ceiling(**ceiling) for ceiling in ceilings],
                "evaluation": Answers(**evaluation) if evaluation else None,
                "compile": CompileFigures(**compiled) if compiled else None,
            }
        )


@dataclass(frozen=True)
class Blame:
    """The knob value a failed task points at: `certain` where a typed refusal says it can never run in this
    environment (the study excludes it), else only the words of the error point at it (the study suspects it)."""

    knob: str
    value: Any  # the configuration's value of the knob
    certain: bool

    def to_json(self) -> dict[str, Any]:
        return {"knob": self.knob, "value": self.value, "certain": self.certain}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Blame:
        return cls(data["knob"], data["value"], bool(data.get("certain")))


@dataclass
class TaskResult:
    outcome: Outcome
    message: str = ""
    phase: str | None = None  # where it failed: start, load, warmup, measure, quality, ...
    metrics: dict[str, float] = field(default_factory=dict)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)  # spread of each timed figure
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    environment: dict[str, Any] = field(default_factory=dict)
    details: TaskDetails = field(default_factory=TaskDetails)
    blame: Blame | None = None  # failed: the knob value its failure points at, for certain or suspected
    pid: int | None = None
    exit_code: int | None = None
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK

    def to_json(self) -> dict[str, Any]:
        data = {known.name: getattr(self, known.name) for known in fields(self)}
        blame = self.blame.to_json() if self.blame else None
        return data | {"outcome": self.outcome.value, "details": self.details.to_json(), "blame": blame}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskResult:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["outcome"] = Outcome(values["outcome"])
        values["details"] = TaskDetails.from_json(values.get("details") or {})
        values["blame"] = Blame.from_json(values["blame"]) if values.get("blame") else None
        return cls(**values)


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file beside `path` and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(data, file)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
