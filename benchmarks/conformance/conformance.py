"""Version conformance: every knob value the cpu profile can run, measured once through the real worker and held to
the outcome written down for the installed transformers.

    python benchmarks/conformance/conformance.py [--space SPACE] [--cases all|version-dependent] [--case LABEL]
        [--write-expected]
    python benchmarks/conformance/conformance.py --gpu h100 --table OUT/conformance-h100.md   # a GPU: its CUDA values

For the installed transformers, measures the demo model on the transformers defaults (the baseline) and on the
baseline with one knob changed, for every value of the space that the cpu profile does not prune (the strategy's
warm-up set). Each case runs in the trial worker the search uses (the library call behind `autotune measure`, one
fork server for all cases): a batch of two prompts, or one prompt at a time for a value no batch can run (speculative
decoding); plus the refusal of a batch that one of those values meets. Speculative decoding and tensor parallelism
run in float32, so that the reference's greedy tokens are the check of their exactness. A value that changes
something only where requests share prefixes (prefix_reuse) replays the demo trace's first requests.

Each case's outcome must be the one written in benchmarks/conformance/expected-<transformers version>.yaml: `ok`, or
`{unsupported: words}` where the words must be in the message. An ok run must also show the figures its knob
promises (see `figure_problems`: greedy agreement 1 for speculative decoding and tensor parallelism, two ranks for
tp_size=2, quality figures for quantized values) and leave no process behind. Any difference is one line naming the
case, the transformers version, the outcome and the message, and the exit status is 1.

`--cases version-dependent` runs only the cases whose path depends on the transformers version or its packages
(`autotune.space.rules.depends_on_version`): CI runs those on the lowest supported transformers on every run, and
all of them when the sources that decide it changed (Makefile: conformance-floor). `--write-expected` writes the file
of the installed version from this run (read it before committing it).

`--gpu PROFILE` runs the same cases for a GPU profile on its device: every value that profile does not prune. Their
expected outcomes live in expected-<version>-<profile>.yaml; where none is written down, the run records the outcomes
(the table, exit status 1 only for a case that ended neither ok nor unsupported). `--table FILE` writes the results as
a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

from autotune.data import DEMO_TRACE
from autotune.errors import UserError
from autotune.measure.configuration import measure as measure_configuration
from autotune.measure.prepare import baseline_config
from autotune.paths import PACKAGED_SPACE
from autotune.process import fork_client
from autotune.profiles import PROFILES
from autotune.space import Config, load_space
from autotune.space.knobs import KNOBS, Target
from autotune.space.rules import depends_on_version, workload_problem
from autotune.specs import BudgetSpec, HardwareSpec, ModelSpec, SearchRequest, WorkloadSpec
from autotune.strategy.queue import warm_up_set
from autotune.traffic import TrafficRef, read_trace
from autotune.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
EXPECTED_DIR = REPO / "benchmarks" / "conformance"
DEMO_CHECKPOINT_DTYPE = "bfloat16"
BATCH = 2
SHAPE = {"input_len": 32, "output_len": 16}
# Conformance asks whether a value runs and what it shows, not how fast: a short measuring phase will do.
TIMING = {"min_iterations": 3, "min_seconds": 0.2}
RANK_MODULE = "autotune.worker.tensor_parallel"
TRACE_WINDOW = 16  # the demo trace's first requests: one of them is a conversation's turn that continues another


@dataclass(frozen=True)
class Case:
    label: str
    config: Config
    on_a_batch: bool = False  # run on a batch even where a knob refuses one: its refusal is what is checked
    device_type: str = "cpu"

    @property
    def replays_a_trace(self) -> bool:
        """A value of this configuration changes something only where requests share prefixes (prefix_reuse): it
        replays the demo trace's first requests, a conversation's turn among them."""
        return any(
            refusal.shared_prefixes and value in refusal.values
            for name, value in self.config.items()
            if name in KNOBS
            for refusal in KNOBS[name].refused
        )

    @property
    def one_prompt_at_a_time(self) -> bool:
        """A value of this configuration is never run on a batch (its knob says why)."""
        if self.on_a_batch:
            return False
        batch = Target(device_type=self.device_type, requests=BATCH, shared_prefixes=self.replays_a_trace)
        return any(name in KNOBS and workload_problem(name, value, batch) for name, value in self.config.items())

    @property
    def workload(self) -> WorkloadSpec:
        traffic = TrafficRef.of(read_trace(DEMO_TRACE), TRACE_WINDOW) if self.replays_a_trace else None
        if self.one_prompt_at_a_time:
            return WorkloadSpec("latency", batch_size=1, **SHAPE, **TIMING, traffic=traffic)
        return WorkloadSpec("throughput", batch_size=BATCH, **SHAPE, **TIMING, traffic=traffic)

    @property
    def depends_on_version(self) -> bool:
        return depends_on_version(self.config)


@dataclass(frozen=True)
class Expected:
    outcome: str  # ok or unsupported
    words: str = ""  # what an unsupported message must contain

    @classmethod
    def from_yaml(cls, value: Any) -> Expected:
        if value == "ok":
            return cls("ok")
        if isinstance(value, dict) and list(value) == ["unsupported"] and isinstance(value["unsupported"], str):
            return cls("unsupported", value["unsupported"])
        raise ValueError(f"{value!r}: write ok, or {{unsupported: words of its message}}")

    def to_yaml(self) -> Any:
        return "ok" if self.outcome == "ok" else {"unsupported": self.words}

    def __str__(self) -> str:
        return "ok" if self.outcome == "ok" else f"unsupported ({self.words!r})"


@dataclass(frozen=True)
class Result:
    case: Case
    outcome: str
    message: str
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def summary(self) -> str:
        if self.outcome != "ok":
            return self.message
        shape = ", one prompt at a time" if self.case.one_prompt_at_a_time else ""
        return f"{self.metrics.get('throughput_tok_s', 0):.0f} tok/s{shape}"


def cases(space_path: Path, profile_name: str = "cpu") -> list[Case]:
    """The baseline, then the baseline with one knob changed for each value the profile runs, then the batch
    refusal of speculative decoding."""
    profile = PROFILES[profile_name]
    space = load_space(space_path).prune(profile.why_not_value)
    baseline = baseline_config(space, DEMO_CHECKPOINT_DTYPE, profile, "throughput")
    on = profile.device_type
    changed = [_exact(Case(planned.why.removeprefix("warm-up: "), planned.config, device_type=on))
               for planned in warm_up_set(space, baseline)]  # fmt: skip
    refused = [case for case in changed if case.label.startswith("speculative=prompt_lookup")][:1]
    on_a_batch = [replace(case, label=f"{case.label} on a batch of {BATCH}", on_a_batch=True) for case in refused]
    return [Case("baseline (transformers defaults)", baseline, device_type=on), *changed, *on_a_batch,
            *_loops_compiled(changed)]  # fmt: skip


def _loops_compiled(changed: list[Case]) -> list[Case]:
    """Each decoding loop again on the compiled static cache: a compiled step is its other path."""
    compiled = next((case for case in changed if case.label == "compile=default"), None)
    loops = [case for case in changed if case.label.startswith("decode_loop=")]
    if compiled is None:
        return []
    return [_exact(Case(f"{loop.label.removesuffix(' (float32)')} on compile=default",
                        {**compiled.config, "decode_loop": loop.config["decode_loop"]}, device_type=loop.device_type))
            for loop in loops]  # fmt: skip


def _exact(case: Case) -> Case:
    """A case of speculative decoding, tensor parallelism or a decoding loop runs in float32: exact against the
    reference's tokens."""
    lossless = ("speculative", "none"), ("tp_size", 1), ("decode_loop", "generate")
    if all(case.config.get(knob, usual) == usual for knob, usual in lossless):
        return case
    return replace(case, label=f"{case.label} (float32)", config={**case.config, "dtype": "float32"})


def figure_problems(case: Case, metrics: dict[str, float]) -> list[str]:
    """What an ok run of this case must show beyond its outcome; each problem in words."""
    config, problems = case.config, []

    def require(name: str, holds: Any, wanted: str) -> None:
        value = metrics.get(name)
        if value is None or not holds(value):
            problems.append(f"{name} is {value}, wanted {wanted}")

    require("throughput_tok_s", lambda v: v > 0, "> 0")
    if config.get("speculative", "none") != "none":  # lossless under greedy decoding, on its own decoding path
        require("greedy_agreement", lambda v: v == 1.0, "1.0 (the reference's greedy tokens)")
        require("token_agreement", lambda v: v == 1.0, "1.0 (the reference's greedy tokens)")
        require("kl_divergence", lambda v: v < 1e-6, "< 1e-6")
        require("top1_agreement", lambda v: v == 1.0, "1.0")
    if config.get("decode_loop", "generate") != "generate":  # generate()'s tokens, on the loop's own path
        require("greedy_agreement", lambda v: v == 1.0, "1.0 (the reference's greedy tokens)")
        require("token_agreement", lambda v: v == 1.0, "1.0 (the reference's greedy tokens)")
        require("kl_divergence", lambda v: v < 1e-6, "< 1e-6")
        require("top1_agreement", lambda v: v == 1.0, "1.0")
    if config.get("tp_size", 1) > 1:  # every rank reports; sharded matmuls keep the greedy tokens
        require("tp_ranks", lambda v: v == config["tp_size"], f"{config['tp_size']} ranks")
        require("greedy_agreement", lambda v: v == 1.0, "1.0 (the reference's greedy tokens)")
    if config.get("quantization", "none") != "none" or config.get("cache_implementation") == "quantized":
        require("kl_divergence", lambda v: math.isfinite(v) and v >= 0, "a finite KL >= 0")
        require("top1_agreement", lambda v: 0 < v <= 1, "in (0, 1]")
        require("perplexity", lambda v: math.isfinite(v) and v > 0, "a finite perplexity")
    if config.get("batching") == "continuous":
        require("greedy_agreement", lambda v: 0 <= v <= 1, "in [0, 1]")
    if config.get("prefix_reuse", "auto") != "auto":  # the trace's requests, each to its own length
        require("requests_served", lambda v: v == TRACE_WINDOW, f"{TRACE_WINDOW}")
        if config["prefix_reuse"] == "on":  # a conversation's turn read its history from the prompt cache
            require("prefix_hit_rate", lambda v: 0 < v <= 1, "in (0, 1]")
        else:
            require("prefix_hit_rate", lambda v: v == 0, "0: nothing shared")
    require("token_agreement", lambda v: 0 < v <= 1, "in (0, 1]")  # every trial, on some decoding path
    return problems


def _version_dependent(case: Case, planned: list[Case]) -> bool:
    """The baseline (the version's plain path), and every case whose path depends on the version."""
    return case == planned[0] or case.depends_on_version


def leftovers() -> list[str]:
    """Processes a finished case left behind: children of the fork server, tensor-parallel ranks."""
    found: list[psutil.Process] = []
    server = fork_client.FORK_SERVER.process
    if server is not None and server.poll() is None:
        found += psutil.Process(server.pid).children(recursive=True)
    for process in psutil.process_iter(["cmdline"]):
        if RANK_MODULE in " ".join(process.info["cmdline"] or []):
            found.append(process)
    alive = [process for process in found if process.is_running() and process.status() != psutil.STATUS_ZOMBIE]
    return [f"{process.pid} ({' '.join(process.cmdline()[:4])})" for process in alive]


def measure(case: Case, space_path: Path, timeout_s: float, profile: str = "cpu") -> Result:
    request = SearchRequest(
        ModelSpec("demo"),
        HardwareSpec(profile),
        case.workload,
        budget=BudgetSpec(trial_timeout_s=timeout_s),
        space_path=space_path,
    )
    started = time.monotonic()
    try:
        _, result = measure_configuration(request, case.config)
    except UserError as error:
        return Result(case, "refused", str(error), seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    left = _wait_for_no_leftovers(timeout_s=10)
    if left:
        return Result(case, "left processes", ", ".join(left), result.metrics, seconds)
    problems = figure_problems(case, result.metrics) if result.ok else []
    if problems:
        return Result(case, "wrong figures", "; ".join(problems), result.metrics, seconds)
    return Result(case, result.outcome.value, result.message, result.metrics, seconds)


def _wait_for_no_leftovers(timeout_s: float) -> list[str]:
    """The processes still left once they had `timeout_s` to be reaped (a SIGKILLed group can take a moment)."""
    deadline = time.monotonic() + timeout_s
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def expected_path(transformers: str, profile: str = "cpu") -> Path:
    suffix = "" if profile == "cpu" else f"-{profile}"
    return EXPECTED_DIR / f"expected-{transformers}{suffix}.yaml"


def load_expected(path: Path) -> dict[str, Expected]:
    document = yaml.safe_load(path.read_text()) or {}
    return {label: Expected.from_yaml(value) for label, value in (document.get("cases") or {}).items()}


def mismatch(result: Result, expected: Expected | None, transformers: str, profile: str = "cpu") -> str | None:
    """One line when the outcome is not the one written down, else None."""
    where = f"{result.case.label} on transformers {transformers}"
    got = f"got {result.outcome}: {result.message}" if result.message else f"got {result.outcome}"
    if expected is None:
        file = expected_path(transformers, profile).name
        return f"{where}: no expected outcome written down ({got}); add it to {file}"
    if result.outcome != expected.outcome:
        return f"{where}: expected {expected}, {got}"
    if expected.outcome == "unsupported" and expected.words not in result.message:
        return f"{where}: expected unsupported with {expected.words!r}, {got}"
    return None


def recorded_failure(result: Result) -> str | None:
    """Where no outcome is written down (a GPU profile's first run): only a case that ended neither ok nor
    unsupported, nor was refused before it ran (its package not installed on that machine), is a failure."""
    if result.outcome in ("ok", "unsupported", "refused"):
        return None
    return f"{result.case.label}: {result.outcome}: {result.message}"


def write_table(results: list[Result], path: Path, title: str) -> None:
    """The results as a Markdown table: case, outcome, figures or message, seconds."""
    rows = [f"| {r.case.label} | {r.outcome} | {r.summary.replace('|', '/')} | {r.seconds:.0f} |" for r in results]
    head = [f"# {title}", "", "| case | outcome | throughput or message | s |", "|---|---|---|---|"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head + rows) + "\n")


def write_expected(results: list[Result], transformers: str, profile: str = "cpu") -> Path:
    path = expected_path(transformers, profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {r.case.label: Expected(r.outcome, r.message if r.outcome == "unsupported" else "") for r in results}
    where = "CPU, the cpu profile" if profile == "cpu" else f"the {profile} profile"
    header = (
        f"# Conformance on transformers {transformers} (torch {version('torch')}, {where}): what each\n"
        "# case of benchmarks/conformance/conformance.py must end as. ok, or {unsupported: words its message must contain}.\n"  # noqa: E501
        "# Any other outcome fails CI. Written by --write-expected; trimmed to the words that matter by hand.\n"
    )
    cases_yaml = yaml.safe_dump({label: e.to_yaml() for label, e in kept.items()}, sort_keys=False, width=1000,
                                default_flow_style=None)  # fmt: skip
    body = "cases:\n" + "".join(f"  {line}\n" for line in cases_yaml.splitlines())
    path.write_text(header + body)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", type=Path, default=PACKAGED_SPACE)
    parser.add_argument("--timeout", default="5m", help="per configuration (default 5m)")
    parser.add_argument("--cases", choices=("all", "version-dependent"), default="all")
    parser.add_argument("--case", action="append", default=[], help="run this case only (repeatable)")
    parser.add_argument("--write-expected", action="store_true", help="write the expected outcomes from this run")
    parser.add_argument("--gpu", default="cpu", choices=sorted(PROFILES), help="the hardware profile (default cpu)")
    parser.add_argument("--table", type=Path, help="also write the results to this Markdown file")
    args = parser.parse_args()
    timeout_s = parse_duration(args.timeout, "--timeout")
    transformers = version("transformers")
    planned = cases(args.space, args.gpu)
    unknown = [label for label in args.case if label not in {case.label for case in planned}]
    if unknown:
        print(f"conformance: no case named {', '.join(map(repr, unknown))}", file=sys.stderr)
        return 2
    wanted = [case for case in planned if not args.case or case.label in args.case]
    selected = wanted if args.cases == "all" else [case for case in wanted if _version_dependent(case, planned)]
    path = expected_path(transformers, args.gpu)
    recording = args.gpu != "cpu" and not path.exists() and not args.write_expected
    expected = {} if args.write_expected or not path.exists() else load_expected(path)
    where = "not checked (writing them)" if args.write_expected else str(path.relative_to(REPO))
    where = f"none written for {args.gpu} ({path.name}): recording them" if recording else where
    which = ", ".join(filter(None, ["named by --case" if args.case else "", args.cases if args.cases != "all" else ""]))
    which = which or "all"
    print(f"conformance: transformers {transformers}, torch {version('torch')}, {args.gpu} profile, "
          f"{len(selected)} of {len(planned)} cases ({which}); expected outcomes: {where}")  # fmt: skip
    started = time.monotonic()
    print(f"demo model and draft ready ({build_demo_models():.0f} s)", flush=True)
    results, failures = [], []
    for case in selected:
        result = measure(case, args.space, timeout_s, args.gpu)
        results.append(result)
        if args.table:
            write_table(results, args.table, f"Conformance: transformers {transformers}, {args.gpu} profile")
        if recording:
            wrong = recorded_failure(result)
        else:
            wrong = None if args.write_expected else mismatch(result, expected.get(case.label), transformers, args.gpu)
        failures += [wrong] if wrong else []
        mark = "!!" if wrong else "  "
        print(f"{mark} {case.label:<44} {result.outcome:<12} {result.summary}  ({result.seconds:.0f} s)", flush=True)
    if args.write_expected:
        return _written(results, transformers, args.gpu)
    if len(selected) == len(planned):  # a full run also finds expectations of cases that no longer exist
        labels = {case.label for case in planned}
        stale = [label for label in expected if label not in labels]
        failures += [f"{label} on transformers {transformers}: expected {expected[label]}, but there is no such "
                     f"case; remove it from {path.name}" for label in stale]  # fmt: skip
    fork_client.FORK_SERVER._stop()
    for line in failures:
        print(f"!! {line}")
    print(f"conformance: {len(results) - len(failures)} of {len(results)} cases as expected on transformers "
          f"{transformers} ({time.monotonic() - started:.0f} s)")  # fmt: skip
    return 1 if failures else 0


def _written(results: list[Result], transformers: str, profile: str) -> int:
    fork_client.FORK_SERVER._stop()
    failed = [result for result in results if result.outcome not in ("ok", "unsupported")]
    for result in failed:
        print(f"!! {result.case.label} on transformers {transformers}: {result.outcome}: {result.message}")
    if failed:
        print("conformance: nothing written: every case must end ok or unsupported")
        return 1
    print(f"conformance: wrote {write_expected(results, transformers, profile).relative_to(REPO)}")
    return 0


def build_demo_models() -> float:
    """The demo model and its draft, trained once before any case (not inside a trial's timeout), in a process of
    their own (this one never imports torch); the seconds it took (0 when cached)."""
    started = time.monotonic()
    build = (
        "from autotune.paths import default_cache_dir; from autotune.worker.demo_model import ensure_demo_draft; "
        "ensure_demo_draft(default_cache_dir())"
    )
    subprocess.run([sys.executable, "-c", build], cwd=REPO, check=True)
    return time.monotonic() - started


if __name__ == "__main__":
    sys.exit(main())
