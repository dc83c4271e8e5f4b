"""serve: the configuration as deployed, `transformers serve` under a load of concurrent requests (`--load`), judged
by latency percentiles and goodput under an SLO (`--slo`): each listed load level, or the highest level a range holds
within the SLO (its capacity, found by a bracket: autotune/figures/capacity.py). A trial's own details
(`ServeDetails`: the command that ran, each level's figures) are its type, rendered here: the card's sentences and
command, the report's table of latency against load."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

from autotune.errors import UserError
from autotune.extras import SERVE
from autotune.figures.capacity import Capacity, Probe, bisections, doubling, extent
from autotune.figures.metrics import (
    E2E_P95,
    ENERGY_PER_TOKEN,
    ERRORS,
    GOODPUT,
    GOODPUT_TOKENS,
    IN_FLIGHT_PEAK,
    ITL_P95,
    OUTPUT_TOK_S,
    PEAK_MEMORY_BYTES,
    REQUESTS_PER_S,
    TTFT_P50,
    TTFT_P95,
)
from autotune.figures.metrics import SLO_SHARE as SHARE_WITHIN_SLO
from autotune.figures.slo import describe_slo
from autotune.specs import KindOptions, WorkloadSpec
from autotune.units import format_bytes
from autotune.workloads.base import SLO, DetailsTable, Flag, KindDetails, WorkloadKind, register

MIN_LEVEL_S = 2.0  # the least a rate level sends for
CLIENT_ROUNDS = 4  # requests per client at a concurrency level, at least
LOAD_FORM = (
    "rate=2,4,8 (Poisson arrivals, requests/s) or concurrency=1,8,32 (clients), each measured; or a range searched "
    "for the highest level within the SLO, rate=1-64"
)

LoadMode = Literal["rate", "concurrency"]


@dataclass
class ServeSpec(KindOptions, kind="serve"):
    """The load a `serve` trial puts on `transformers serve`: the serve kind's own options, kept typed in the workload
    spec (`WorkloadSpec.serve`), written as JSON by `to_json`, read back by `from_json`.

    rate: requests arrive as a Poisson process at each rate (requests/s); concurrency: that many clients,
    each sending its next request when the last one ends. `levels`: the levels measured, each of them; `bracket`:
    (lowest, highest) of the levels a capacity probe may try, climbing by doubling from the lowest while the workload's
    `slo_share` of a level's requests meet the SLO, then narrowing by bisection (autotune/figures/capacity.py).
    """

    mode: LoadMode = "concurrency"
    levels: list[float] = field(default_factory=lambda: [1.0, 4.0])
    bracket: list[float] | None = None
    requests_per_level: int = 16  # at least: a level may send more (level_requests)
    warmup_requests: int = 2
    port: int | None = None  # None: a free port chosen by the system
    request_timeout_s: float = 120.0

    @classmethod
    def of(cls, spec: WorkloadSpec) -> ServeSpec:
        """The load of a serve workload (`Serve.as_run` gives every serve trial's spec one)."""
        assert isinstance(spec.serve, ServeSpec), "a serve workload carries its load"
        return spec.serve

    @property
    def probes_capacity(self) -> bool:
        """A bracket of loads: the highest level within the SLO is searched for."""
        return bool(self.bracket)

    def to_json(self) -> dict[str, Any]:
        """Plain data, as studies store it: without a bracket where the levels are listed."""
        data = asdict(self)
        if data["bracket"] is None:
            del data["bracket"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServeSpec:
        return cls(**data)

    def as_flag(self) -> str:
        """ "concurrency=1,4": the load as --load takes it (listed levels)."""
        return f"{self.mode}={','.join(f'{level:g}' for level in self.levels)}"


LOAD = Flag(
    "--load",
    "serve: rate=2,4,8 (Poisson arrivals/s) or concurrency=1,8,32, each measured; or a range, rate=1-64, searched for "
    f"the highest level that keeps --slo-share of requests within --slo. {ServeSpec().as_flag()} if not given.",
)
SLO_SHARE = Flag(
    "--slo-share",
    "serve: the share of requests that must meet --slo at a load: 95%, 0.9.",
    show_default=f"{WorkloadSpec.slo_share:.0%}",
)
SERVE_PORT = Flag("--serve-port", "serve: port of the server; a free one if not given.", int, 1, 65535, port=True)


_COLUMNS = (
    ("completed req/s", REQUESTS_PER_S.name, 1.0, "{:.2f}"),
    ("goodput req/s", GOODPUT.name, 1.0, "{:.2f}"),
    ("output tok/s", OUTPUT_TOK_S, 1.0, "{:.1f}"),
    ("TTFT p50 ms", TTFT_P50, 1000.0, "{:.1f}"),
    ("TTFT p95 ms", TTFT_P95, 1000.0, "{:.1f}"),
    ("ITL p95 ms", ITL_P95, 1000.0, "{:.2f}"),
    ("e2e p95 ms", E2E_P95, 1000.0, "{:.0f}"),
    ("in flight at most", IN_FLIGHT_PEAK, 1.0, "{:.0f}"),
    ("errors", ERRORS.name, 1.0, "{:.0f}"),
    ("within the SLO", SHARE_WITHIN_SLO, 100.0, "{:.1f}%"),
)


@dataclass
class ServeDetails(KindDetails):
    """What a serve trial returns of its own: the command that ran (with its host and port), the load's mode, the SLO,
    the bracket of a capacity probe (None: the levels listed), each level's figures (serving/latency.py's, with its
    peak memory and, with an SLO, its verdict and reason), and the cores the server and the load client ran on."""

    command: str
    argv: list[str]
    mode: str
    slo: dict[str, float] = field(default_factory=dict)
    bracket: list[float] | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)  # one row of figures per load level
    server_cores: list[int] = field(default_factory=list)
    client_cores: list[int] = field(default_factory=list)
    server_pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServeDetails:
        known = {known.name for known in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def facts(self, figures: Mapping[str, float]) -> list[str]:
        """Goodput under the SLO, errors, energy where measured."""
        slo = describe_slo(self.slo) or "no SLO given: every completed request counts"
        goodput, failed = figures.get(GOODPUT.name, 0.0), figures.get(ERRORS.name, 0)
        facts = [f"goodput {goodput:.2f} req/s ({slo}), {failed:.0f} failed"]
        if ENERGY_PER_TOKEN.name in figures:
            facts.append(f"{figures[ENERGY_PER_TOKEN.name]:.3g} J per generated token (GPU energy counter)")
        return facts

    def deployed_command(self, capacity: Capacity | None) -> str:
        """The command that ran, then, as comments, the load it was measured to sustain within the SLO and what the
        server held there: requests in flight, continuous batching's tokens per forward pass."""
        if capacity is None:
            return self.command
        lines = [self.command, f"# capacity within {describe_slo(capacity.slo)}: {capacity.found()}"]
        chosen = capacity.chosen
        if chosen is not None:
            lines.append(f"# at {capacity.unit.name} {chosen.size:g}: {_held(chosen.figures, self.argv)}")
        return "\n".join(lines)

    def table(self) -> DetailsTable:
        """One row per load level: what was offered and the latency the server answered with."""
        offered = "requests/s offered" if self.mode == "rate" else "concurrent clients"
        headings = (offered, *(column[0] for column in _COLUMNS), "peak memory", "SLO met")
        caption = "latency against load (transformers serve, warm-up requests excluded)"
        return DetailsTable("load", caption, headings, [_level_cells(level) for level in self.levels])


def _level_cells(level: Mapping[str, Any]) -> tuple[str, ...]:
    cells = [f"{level['load']:g}"]
    cells += [_cell(level.get(key), scale, form) for _, key, scale, form in _COLUMNS]
    memory = level.get(PEAK_MEMORY_BYTES)
    cells.append(format_bytes(memory) if memory else "-")
    cells.append(_verdict(level))
    return tuple(cells)


def _verdict(level: Mapping[str, Any]) -> str:
    """A level judged by its share of requests within the SLO (a capacity), else by its percentiles."""
    if "verdict" not in level:
        return "yes" if level.get("slo_met") else "no"
    return "sustained" if level["verdict"] == "met" else f"refused: {level.get('reason', '')}"


def _held(figures: Mapping[str, float], argv: list[str]) -> str:
    served = f"{figures.get(REQUESTS_PER_S.name, 0.0):.2f} req/s and {figures.get(OUTPUT_TOK_S, 0.0):.1f} output tok/s"
    in_flight = f"at most {figures.get(IN_FLIGHT_PEAK, 0.0):.0f} requests in flight at once"
    return f"{served}, {in_flight}; {_batching(argv)}"


def _batching(argv: list[str]) -> str:
    """What bounded the batch: continuous batching's tokens per forward pass, or one generate() at a time."""
    if "--continuous-batching" not in argv:
        return "no --continuous-batching: requests queue for one generate() at a time"
    if "--cb-max-batch-tokens" in argv:
        return f"continuous batching, max_batch_tokens {argv[argv.index('--cb-max-batch-tokens') + 1]}"
    return "continuous batching, transformers' default max_batch_tokens (no --cb-max-batch-tokens)"


def _cell(value: float | None, scale: float, form: str) -> str:
    return "-" if value is None else form.format(value * scale)


def _arriving(spec: WorkloadSpec) -> str:
    """How a trace's requests reach the server under this load: at rates, by the trace's arrivals where it has them."""
    if ServeSpec.of(spec).mode != "rate":
        return "as many in flight as each concurrency level"
    assert spec.traffic is not None
    if spec.traffic.timed:
        return "arriving as the trace's arrivals scaled to each rate"
    return "arriving as a Poisson process at each rate"


@register
class Serve(WorkloadKind):
    name = "serve"
    help = "transformers serve under load (--load, --slo)"
    flags = (LOAD, SLO, SLO_SHARE, SERVE_PORT)
    probes = "load"
    metrics = frozenset({GOODPUT.name, REQUESTS_PER_S.name, ERRORS.name})  # latency percentiles: every kind's
    without_a_trace = frozenset({GOODPUT_TOKENS.name})  # goodput in tokens, of every request sent
    # Continuous batching first: it keeps the GPU busy under concurrent requests; then what a single batch wants.
    aims: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "speed": ("serve", "throughput"),
        "time": ("serve", "throughput"),
        "memory": ("memory",),
    }
    needs_servable_plan = True
    times_generate = False  # requests through a server: no decode ceiling compares with them
    packages = SERVE
    runner = "autotune.worker.serve_trial:run"
    details = ServeDetails

    def describe(self, spec: WorkloadSpec) -> str:
        if spec.traffic is not None:
            return f"{spec.traffic.describe()} sent to transformers serve, each with its own lengths, {_arriving(spec)}"
        prompts = "1 prompt" if spec.batch_size == 1 else f"{spec.batch_size} prompts"
        return f"{prompts} sent to transformers serve, {spec.input_len} tokens in, {spec.output_len} out"

    def as_run(self, spec: WorkloadSpec) -> WorkloadSpec:
        return spec if spec.serve is not None else replace(spec, serve=ServeSpec())

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        fields = super().options(given)  # the SLO
        if share := given.get(SLO_SHARE.name):
            fields["slo_share"] = parse_share(share, SLO_SHARE.name)
        return {**fields, "serve": _load(given)}

    def probe_allowance_s(self, spec: WorkloadSpec) -> float:
        """A bracket of rates: the most seconds of requests a course can send less the least (open loop: a level of n
        requests at rate r sends for (n - 1) / r s whatever the server does); 0 for listed levels or concurrencies."""
        if spec.serve is None:
            return 0.0
        load = ServeSpec.of(spec)
        if not load.bracket or load.mode != "rate":
            return 0.0
        probe_cost = extent(level_probe(spec), lambda rate: sending_seconds(spec, rate))
        return probe_cost.most_cost - probe_cost.least_cost

    def describe_probe(self, spec: WorkloadSpec) -> str | None:
        if spec.serve is None:
            return None
        load = ServeSpec.of(spec)
        if not load.bracket:
            return None
        probe = level_probe(spec)
        cost = extent(probe, lambda rate: sending_seconds(spec, rate))
        ladder = ", ".join(f"{level:g}" for level in probe.sizes)
        said = (
            f"each trial measures up to {cost.most_points} load levels ({_level_length(spec)}): "
            f"{load.mode} {ladder} while {spec.slo_share:.0%} of a level's requests meet the SLO, then up to "
            f"{probe.refine} bisections between the highest level sustained and the lowest refused"
        )
        if load.mode == "rate":
            sending = f"the requests take {cost.least_cost:.0f}-{cost.most_cost:.0f} s to send (open loop)"
            more = cost.most_cost - cost.least_cost
            return f"{said}; {sending}, so a trial's at-most duration allows {more:.0f} s more than an alike one took"
        return f"{said}; how long a level takes depends on the server (closed loop)"


def _load(given: Mapping[str, Any]) -> ServeSpec:
    """The load --load and --serve-port ask for; ServeSpec's default levels where --load is not given."""
    spec = ServeSpec(port=given.get(SERVE_PORT.name))
    if load := given.get(LOAD.name):
        spec.mode, levels = parse_load(load)  # type: ignore[assignment]
        if "-" in load:
            if not given.get(SLO.name):
                raise UserError(f"--load {load}: a range is searched for the highest load within --slo; give --slo")
            spec.levels, spec.bracket = [], levels
        else:
            spec.levels = levels
    return spec


def parse_share(text: str, flag: str) -> float:
    """`95%` or `0.95` -> 0.95; above 0 and at most 100%."""
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a share: write it like 95% or 0.95") from None
    if not 0 < value <= 1:
        raise UserError(f"{flag} {text!r} must be above 0% and at most 100%")
    return value


def parse_load(text: str) -> tuple[str, list[float]]:
    """`rate=2,4,8` -> ("rate", [2, 4, 8]); `concurrency=1,8` -> ("concurrency", [1, 8]); a range `rate=1-64` -> its
    two ends, ("rate", [1, 64])."""
    mode, separator, values = text.strip().partition("=")
    mode = mode.strip().lower()
    if not separator or mode not in ("rate", "concurrency"):
        raise UserError(f"--load {text!r} is not a load: write {LOAD_FORM}")
    try:
        levels = [float(value) for value in values.split("-" if "-" in values else ",")]
    except ValueError:
        raise UserError(f"--load {text!r}: every level must be a number, as in {LOAD_FORM}") from None
    if "-" in values and (len(levels) != 2 or not levels[0] < levels[1]):
        raise UserError(f"--load {text!r}: a range is its lowest and highest level, lowest first, as in rate=1-64")
    if not levels or any(not level > 0 for level in levels):
        raise UserError(f"--load {text!r}: every level must be above 0, as in {LOAD_FORM}")
    if mode == "concurrency" and any(level != int(level) for level in levels):
        raise UserError(f"--load {text!r}: a concurrency is a whole number of clients")
    return mode, sorted(set(levels))


def level_probe(spec: WorkloadSpec) -> Probe:
    """The levels a serve trial measures: each listed one, or a bracket from the range's lowest level, doubling while
    the level is sustained (`slo_share` of its requests within the SLO), then bisected (capacity.bisections)."""
    load = ServeSpec.of(spec)
    if not load.bracket:
        return Probe(list(load.levels), spec.slo, share=spec.slo_share, every=True)
    low, high = load.bracket
    refine = bisections(load.requests_per_level)
    return Probe(doubling(low, high), spec.slo, refine=refine, whole=load.mode == "concurrency", share=spec.slo_share)


def level_requests(spec: WorkloadSpec, level: float) -> int:
    """How many requests a level sends: at least the load's `requests_per_level`, and a trace's whole window (a level
    sends its requests in order, from its first again when it needs more). A rate level sends for at least
    `level_seconds`, long enough that a server short of the rate by the bracket's last step builds a queue as long as
    the SLO's bound, so that a burst it drains within the bound does not pass for a rate it sustains; a concurrency
    level sends `CLIENT_ROUNDS` requests per client, so that every client keeps one in flight."""
    load = ServeSpec.of(spec)
    whole_trace = spec.traffic.requests if spec.traffic is not None else 0  # a trace's window, each of its requests
    if load.mode == "rate":
        return max(load.requests_per_level, math.ceil(level * level_seconds(spec)), whole_trace)
    return max(load.requests_per_level, CLIENT_ROUNDS * int(level), whole_trace)


def level_seconds(spec: WorkloadSpec) -> float:
    """The least a rate level sends for: 2^bisections times the SLO's TTFT or end-to-end bound (the queue a server
    25% short of the rate builds meanwhile, after 2 bisections, is as long as the bound), and `MIN_LEVEL_S` at least.
    At 16 requests a level, 16 requests at 128/s were 0.12 s of load, which continuous batching on the 2-core VM
    drained within 300 ms: a burst, not a rate."""
    load = ServeSpec.of(spec)
    queued = [bound for name, bound in spec.slo.items() if name.startswith(("ttft_", "e2e_"))]
    return max(MIN_LEVEL_S, 2 ** bisections(load.requests_per_level) * max(queued, default=0.0))


def sending_seconds(spec: WorkloadSpec, rate: float) -> float:
    """How long a level at this rate takes to send its requests (the expected last of its Poisson arrivals)."""
    return (level_requests(spec, rate) - 1) / rate


def _level_length(spec: WorkloadSpec) -> str:
    load = ServeSpec.of(spec)
    if load.mode == "rate":
        return f"each at least {load.requests_per_level} requests and {level_seconds(spec):g} s of arrivals"
    return f"each at least {load.requests_per_level} requests and {CLIENT_ROUNDS} per client"
