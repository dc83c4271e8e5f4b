"""What a run (search, worker or measure) is asked to do: small specs, each built once from the flags, and the model,
workload and quality specs a trial task carries to the worker (autotune.process.results).

Light to import: the CLI builds them before the study's libraries (optuna, sqlalchemy) are loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.paths import default_cache_dir
from autotune.traffic.requests import TrafficRef
from autotune.units import parse_duration

if TYPE_CHECKING:
    from autotune.figures.constraints import Constraint


class KindOptions:
    """A workload kind's own options (serve: its load), a type its kind owns, as a kind's results are (KindDetails):
    kept typed in the workload spec under the kind's name, written there as JSON, and read back by the type the kind's
    module registered under that name (`class ServeSpec(KindOptions, kind="serve")`; importing autotune.workloads
    registers every kind's)."""

    types: ClassVar[dict[str, type[KindOptions]]] = {}  # kind -> the type of its options

    def __init_subclass__(cls, kind: str, **rest: Any) -> None:
        super().__init_subclass__(**rest)
        KindOptions.types[kind] = cls

    @property
    def probes_capacity(self) -> bool:
        """A trial looks for the highest level the options allow within the SLO, not at each level they list."""
        return False

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KindOptions:
        raise NotImplementedError

    @staticmethod
    def read(kind: str, data: Mapping[str, Any]) -> KindOptions:
        """The options of `kind` from their JSON, typed by the type its module registered."""
        if kind not in KindOptions.types:
            raise ValueError(f"no type of options for workload {kind!r}: import autotune.workloads first")
        return KindOptions.types[kind].from_json(data)


@dataclass
class WorkloadSpec:
    """The workload every trial of a study runs: its kind (autotune/workloads/: what a trial runs and measures) and
    its shape. The spec says what runs: a kind fixes what it decides itself (latency: batch 1) in the spec it stores
    (`WorkloadKind.as_run`). Bundled prompts are brought to exactly `input_len` tokens with context from the bundled
    corpus; prompts from a file keep their own length, truncated to `input_len`. With a request trace (`traffic`,
    --traffic), each request brings its own input and output length instead: `input_len` and `output_len` then only
    shape the teacher-forced quality check.
    """

    kind: str = "throughput"  # a kind of autotune.workloads.KINDS
    batch_size: int = 8  # with batch_sizes: the largest of them
    input_len: int = 128
    output_len: int = 64
    prompts_path: str | None = None
    min_iterations: int = 5
    min_seconds: float = 3.0
    max_iterations: int = 200
    warmup_iterations: int = 2
    # The serve kind's own options (its load): autotune.workloads.serve.ServeSpec.
    serve: KindOptions | None = None
    # A capacity probe's batch sizes, ascending (--batch-size 1-128 or 1,8,32): a throughput trial measures the
    # largest that meets the SLO and fits in memory. Empty: batch_size alone.
    batch_sizes: list[int] = field(default_factory=list)
    # The latency target every figure that depends on it is judged by (--slo): a figure such as `itl_p95_s` -> its
    # bound in seconds. A trial that meets it at no batch or rate is off the front.
    slo: dict[str, float] = field(default_factory=dict)
    slo_share: float = 0.95  # serve: the share of requests that must meet the SLO at a rate it sustains
    # The request trace every trial replays (--traffic): which requests of which file, named by their checksum.
    traffic: TrafficRef | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        """From its JSON: to_json's, as a task carries it or a study stores it today (the forms studies stored before:
        autotune.study.migrations); a kind's own options typed by their kind, a trace by its reference."""
        data = dict(data)
        if data.get("serve") is not None:
            data["serve"] = KindOptions.read("serve", data["serve"])
        if data.get("traffic") is not None:
            data["traffic"] = TrafficRef.from_json(data["traffic"])
        return cls(**data)

    @property
    def probes_capacity(self) -> bool:
        """A trial looks for the largest batch or rate within the SLO and the memory, not one fixed shape."""
        return len(self.batch_sizes) > 1 or bool(self.serve and self.serve.probes_capacity)

    def to_json(self) -> dict[str, Any]:
        """Plain data; without what a workload leaves at its default and studies stored before it existed (the serve
        load of other kinds, a probe's batch sizes, an SLO), so that those studies resume."""
        data = asdict(self) | {
            "serve": self.serve.to_json() if self.serve else None,
            "traffic": self.traffic.to_json() if self.traffic else None,
        }
        for name in ("serve", "batch_sizes", "slo", "slo_share", "traffic"):
            if data[name] == _WORKLOAD_DEFAULTS[name]:
                del data[name]
        return data


_WORKLOAD_DEFAULTS = asdict(WorkloadSpec())


@dataclass
class QualitySpec:
    """Teacher-forced comparison with the reference configuration on a bundled evaluation text, through each
    configuration's own decoding path (autotune/worker/measurement/quality/)."""

    positions: int = 256  # decoded positions judged at least (whole batches of the workload's output length)
    top_k: int = 1024  # reference probabilities kept per position (the rest is one bucket)


@dataclass(frozen=True)
class EvalSpec:
    """Tier 1 (`search --eval`): the task the front's finalists and the reference are evaluated on, through
    lm-evaluation-harness: `demo`, a task of the harness's, or a folder of task YAML files; and how many of its items
    (None: all)."""

    task: str
    limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "limit": self.limit}


@dataclass
class ModelSpec:
    id: str  # what the user passed: "demo", a hub id or a local path
    path: str = ""  # where it loads from (filled in by the prepare task)
    revision: str | None = None
    trust_remote_code: bool = False
    assistant: str | None = None  # the draft model of speculative=assistant: a hub id or folder (--assistant-model)


@dataclass(frozen=True)
class HardwareSpec:
    """The hardware profile trials are judged against, and where they run."""

    gpu: str = "auto"  # a profile name, or auto: detect
    device: str | None = None  # None: the profile's
    price_per_hour: float | None = None  # None: the profile's


# The defaults of the durations a user may give, as --trial-timeout and --storage-patience show them.
DEFAULT_TRIAL_TIMEOUT = "20m"  # a trial still running is killed
DEFAULT_STORAGE_PATIENCE = "10m"  # a storage outage is waited out this long (study/patience.py)
DEFAULT_STORAGE_PATIENCE_S = parse_duration(DEFAULT_STORAGE_PATIENCE)


@dataclass(frozen=True)
class BudgetSpec:
    """When a run stops (a wall-clock budget, a number of trials, or neither) and when one trial is killed."""

    budget_s: float | None = None
    max_trials: int | None = None
    trial_timeout_s: float = parse_duration(DEFAULT_TRIAL_TIMEOUT)

    def deadline(self, started: float) -> float | None:
        return started + self.budget_s if self.budget_s else None


@dataclass(frozen=True)
class StorageSpec:
    """Where a study, its trial logs and the cached models and references are kept."""

    study_name: str | None = None  # None: <model>-<profile>
    url: str | None = None  # None: an SQLite file in studies_dir
    artifacts: str | None = None  # where trial logs and reports go (autotune.study.artifacts); None: beside SQLite
    studies_dir: Path = Path("studies")
    cache_dir: Path = field(default_factory=default_cache_dir)
    patience_s: float = DEFAULT_STORAGE_PATIENCE_S  # how long a storage outage is waited out (study/patience.py)


@dataclass(frozen=True)
class SearchRequest:
    """What a search, a worker or a measurement is asked to do; built once from the flags, never changed.

    A worker joining a study gets a new request with the study's model, workload and quality.
    """

    model: ModelSpec
    hardware: HardwareSpec = HardwareSpec()
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)
    budget: BudgetSpec = BudgetSpec()
    storage: StorageSpec = field(default_factory=StorageSpec)
    space_path: Path | None = None  # None: the packaged default space
    seed: int | None = None
    constraints: tuple[Constraint, ...] = ()  # passed to Optuna with trial.set_constraint
    preset_guard: bool = False  # the constraints are an --objective preset's: a study searched under others keeps its
    objectives: tuple[str, ...] = ()  # metric names; empty: the study's own, or the default three for a new one
    devices: tuple[str, ...] = ()  # one worker per device, sharing the study
    warm_start: str | None = None  # a study of the same storage whose front is measured first
    run_id: str | None = None  # tags the trials of one run, across the workers of `--devices`
    evaluation: EvalSpec | None = None  # tier 1: the task the front's finalists are evaluated on after the search


@dataclass(frozen=True)
class WorkerRequest:
    """`autotune worker`: which study to join and what this worker brings; the rest comes from the study.

    `search --devices` hands each worker it starts its request as JSON (`to_json`, `from_json`: `autotune join`).
    """

    storage: StorageSpec
    device: str | None = None
    budget: BudgetSpec = BudgetSpec()
    trust_remote_code: bool = False
    run_id: str | None = None  # tags the trials of one `search --devices` run
    traffic: str | None = None  # a copy of the trace the study replays (--traffic), where its artifacts are not at hand

    def to_json(self) -> dict[str, Any]:
        """Plain data, paths as text."""
        data = asdict(self)
        data["storage"] |= {"studies_dir": str(self.storage.studies_dir), "cache_dir": str(self.storage.cache_dir)}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerRequest:
        storage = data["storage"] | {"studies_dir": Path(data["storage"]["studies_dir"])}
        storage["cache_dir"] = Path(storage["cache_dir"])
        budget = BudgetSpec(**data["budget"])
        return cls(
            StorageSpec(**storage),
            data["device"],
            budget,
            data["trust_remote_code"],
            data["run_id"],
            data.get("traffic"),
        )
