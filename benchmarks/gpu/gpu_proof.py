"""One-command proof of autotune on a GPU: build the model, search, pick, measure, and summarise.

    python benchmarks/gpu/gpu_proof.py --model llama-1b --device cuda --out proof [--budget 20m] [--gpu h100]
    python benchmarks/gpu/gpu_proof.py --model demo --device cpu --out /tmp/proof --budget 5m   # the same on a CPU

Everything runs through the real `autotune` command line, each command in its own process, logged
in OUT/commands.log (the commands, exit statuses and durations) and OUT/<step>.log (their output):

1. `--model llama-1b` builds a 1.1B Llama offline (benchmarks/gpu/llama_1b.py, in a subprocess) and uses
   its folder; `demo` is autotune's built-in model; anything else is passed to autotune as is.
2. `autotune search --dry-run --json` (OUT/plan.json: the trials the search plans first, in order, with
   why), then `autotune search` with the budget on one study (OUT/study.db, report OUT/report.html):
   the reference, the baseline, the stacks the guides recommend, then the strategy's ranked order.
   Its summary (OUT/search.log) says when the best of each objective was found.
3. `autotune best --format json` (OUT/best.json), then `autotune measure --workload latency --json`
   of that configuration and of the baseline (OUT/measure-best.json, OUT/measure-baseline.json):
   batch-1 figures.
4. `autotune ceiling` at the search's batch and at batch 1, in the best configuration's dtype
   (OUT/ceiling.json): the hand-written decode loop, stored with the study; then `autotune report` renders
   the report again, with the ceiling beside the best trial.
5. OUT/SUMMARY.md, generated from the study's storage and those JSON files alone.

The exit status is 1 when an `autotune search` failed, else 0. This process never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune and benchmarks, run as a script

from autotune import study as studies
from autotune.figures.metrics import KL_DIVERGENCE, PEAK_MEMORY, THROUGHPUT
from autotune.paths import PACKAGED_SPACE, default_cache_dir
from autotune.space import Config, SearchSpace, config_key, load_space
from autotune.strategy.queue import ruled_out, warm_up_set
from autotune.study import StudySettings, TrialRecord
from autotune.study.ceilings import ceilings
from autotune.units import format_bytes, format_duration, parse_duration
from benchmarks.gpu.llama_1b import DEFAULT_TRAIN_STEPS, model_folder

REPO = Path(__file__).resolve().parents[2]
STUDY = "proof"
DEFAULT_SPACE = PACKAGED_SPACE
DEMO_BUILD = (  # the demo model and its speculative-decoding draft, which the search's prepare step would build
    "from autotune.paths import default_cache_dir; from autotune.worker.demo_model import ensure_demo_draft; "
    "from autotune.paths import demo_model_path; ensure_demo_draft(default_cache_dir()); "
    "print(demo_model_path(default_cache_dir()))"
)
# The outcome column's first word, for every trial state (tests read it).
OUTCOME_WORDS = ("works", "unsupported", "oom", "error", "timeout", "broken", "crashed", "budget", "skipped", "not run")


# ----------------------------------------------------------------------------------------- commands


@dataclass
class Step:
    name: str
    command: list[str]
    code: int
    seconds: float
    log: str  # file name in the output folder


@dataclass
class Runner:
    """Runs commands in the output folder, each logged in commands.log with its output in <name>.log."""

    out: Path
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def run(self, name: str, command: list[str], stdout_file: Path | None = None) -> Step:
        log = self.out / f"{name}.log"
        where = f"output in {log.name}" + (f", stdout in {stdout_file.name}" if stdout_file else "")
        self._log(f"$ {shlex.join(command)}\n  ({where})")
        started = time.monotonic()
        with log.open("w") as sink:
            if stdout_file is None:
                code = _stream(command, sink, name, self.out)
            else:
                with stdout_file.open("w") as stdout:
                    code = subprocess.run(command, stdout=stdout, stderr=sink, cwd=self.out, env=_env()).returncode
        step = Step(name, command, code, time.monotonic() - started, log.name)
        self._log(f"  exit status {code} after {format_duration(step.seconds)}")
        self.steps.append(step)
        return step

    def note(self, text: str) -> None:
        self.notes.append(text)
        self._log(f"note: {text}")

    def _log(self, text: str) -> None:
        print(text, flush=True)
        with (self.out / "commands.log").open("a") as log:
            log.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")


def _env() -> dict[str, str]:
    """The children find autotune from this checkout, and print as they go."""
    given = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *given]), "PYTHONUNBUFFERED": "1"}


def _stream(command: list[str], sink: Any, label: str, cwd: Path) -> int:
    """Run a command, copying its output (stderr included) to `sink` and, prefixed, to this process's stdout."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=_env()
    )
    assert process.stdout is not None
    for line in process.stdout:
        sink.write(line)
        print(f"  [{label}] {line}", end="", flush=True)
    return process.wait()


def autotune(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


# ------------------------------------------------------------------------------------------- model


def resolve_model(args: argparse.Namespace, runner: Runner) -> str | None:
    """The --model to give autotune; None if building it failed."""
    cache = default_cache_dir()
    if args.model == "llama-1b":
        folder = model_folder(cache, args.train_steps)
        builder = [sys.executable, str(REPO / "benchmarks" / "gpu" / "llama_1b.py"), "--device", args.device]
        step = runner.run("build", [*builder, "--train-steps", str(args.train_steps), "--out", str(folder)])
        return str(folder) if step.code == 0 else None
    if args.model == "demo":
        step = runner.run("build", [sys.executable, "-c", DEMO_BUILD])
        return "demo" if step.code == 0 else None
    return args.model


# ---------------------------------------------------------------------------------------- planning


def _existing_study(url: str) -> optuna.Study | None:
    """The proof's study, if stored (an SQLite file that does not exist is not created)."""
    if studies.sqlite_file_missing(url):
        return None
    study = studies.find_study(studies.open_storage(url), STUDY)
    return study if study is not None and studies.has_settings(study) else None


# ---------------------------------------------------------------------------------------- the steps


def search_command(args: argparse.Namespace, model: str, url: str) -> list[str]:
    return autotune(
        "search", "--model", model, "--device", args.device, "--gpu", args.gpu, "--study", STUDY,
        "--storage", url, "--report", str(args.out / "report.html"), "--space", str(args.space),
        "--trial-timeout", args.trial_timeout, *_shape(args, "--batch-size"), *_timing(args),
    )  # fmt: skip


def measure_command(args: argparse.Namespace, model: str, config: Config) -> list[str]:
    overrides = [item for name, value in config.items() for item in ("--set", f"{name}={value}")]
    return autotune(
        "measure", "--model", model, "--device", args.device, "--gpu", args.gpu, "--space", str(args.space),
        "--workload", "latency", "--trial-timeout", args.trial_timeout, *_shape(args), *_timing(args), "--json",
        *overrides,
    )  # fmt: skip


def _shape(args: argparse.Namespace, *extra: str) -> list[str]:
    flags = {"--batch-size": args.batch_size, "--input-len": args.input_len, "--output-len": args.output_len}
    return [item for flag in (*extra, "--input-len", "--output-len") for item in (flag, str(flags[flag]))]


def _timing(args: argparse.Namespace) -> list[str]:
    return ["--min-seconds", str(args.min_seconds)] if args.min_seconds is not None else []


def run_searches(args: argparse.Namespace, runner: Runner, model: str) -> list[Step]:
    """The plan the search makes before it runs (a dry run), then the search with the budget."""
    url = storage_url(args.out)
    runner.run("plan", [*search_command(args, model, url), "--dry-run", "--json"], args.out / "plan.json")
    return [runner.run("search", [*search_command(args, model, url), *_limits(parse_duration(args.budget))])]


def _limits(budget_s: float, trials: int | None = None) -> list[str]:
    return ["--budget", f"{budget_s:.0f}s", *(["--trials", str(trials)] if trials else [])]


def storage_url(out: Path) -> str:
    return f"sqlite:///{out / 'study.db'}"


def pick_and_measure(args: argparse.Namespace, runner: Runner, model: str) -> None:
    """The fastest configuration of the study, then batch-1 figures of it and of the baseline."""
    best_file = args.out / "best.json"
    url = storage_url(args.out)
    runner.run("best", autotune("best", "--study", STUDY, "--storage", url, "--format", "json"), best_file)
    best = load_json(best_file)
    if best is not None:
        runner.run("measure-best", measure_command(args, model, best["config"]), args.out / "measure-best.json")
    else:
        runner.note("no best configuration (see best.log): the best configuration is not measured at batch 1")
    runner.run("measure-baseline", measure_command(args, model, {}), args.out / "measure-baseline.json")


def measure_ceiling(args: argparse.Namespace, runner: Runner, model: str) -> None:
    """The hand-written decode loop at the search's batch and at batch 1, stored with the study; the report again."""
    best = load_json(args.out / "best.json")
    dtype = best["config"].get("dtype", "bfloat16") if best else "bfloat16"
    batches = [flag for batch in sorted({1, args.batch_size}) for flag in ("--batch-size", str(batch))]
    url = storage_url(args.out)
    command = autotune(
        "ceiling", "--model", model, "--device", args.device, "--gpu", args.gpu, "--dtype", dtype, *batches,
        *_shape(args), *_timing(args), "--study", STUDY, "--storage", url, "--json",
        *(["--compile", args.ceiling_compile] if args.ceiling_compile else []),
    )  # fmt: skip
    if runner.run("ceiling", command, args.out / "ceiling.json").code == 0:
        runner.run(
            "report", autotune("report", "--study", STUDY, "--storage", url, "--out", str(args.out / "report.html"))
        )


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ evidence


@dataclass
class Evidence:
    """What the summary is written from: the study's storage and the JSON files the tool wrote."""

    settings: StudySettings
    records: list[TrialRecord]
    exclusions: dict[str, dict[str, str]]
    runs: list[dict[str, Any]]
    space_path: Path
    best: dict[str, Any] | None
    latency: dict[str, dict[str, Any] | None]  # "best", "baseline": `autotune measure --json` documents
    ceilings: list[dict[str, Any]]  # `autotune ceiling`'s figures, stored with the study

    @property
    def baseline_config(self) -> Config:
        return self.settings.prepared.baseline_config

    @property
    def baseline(self) -> TrialRecord | None:
        return next((r for r in self.records if "baseline" in r.roles and r.complete), None)

    @property
    def complete(self) -> list[TrialRecord]:
        return [r for r in self.records if r.complete]


def load_evidence(out: Path, space_path: Path) -> Evidence | None:
    study = _existing_study(storage_url(out))
    if study is None:
        return None
    return Evidence(
        settings=studies.stored_settings(study),
        records=sorted(studies.records(study), key=lambda r: r.number),
        exclusions=studies.exclusions(study),
        runs=studies.search_runs(study),
        space_path=space_path,
        best=load_json(out / "best.json"),
        latency={name: load_json(out / f"measure-{name}.json") for name in ("best", "baseline")},
        ceilings=ceilings(study),
    )


# ---------------------------------------------------------------------------------------- headlines


def headlines(ev: Evidence) -> list[str]:
    return [
        compile_speedup(ev),
        weight_ratio(ev, ("bfloat16", "none"), ("float32", "none"), "about half"),
        weight_ratio(ev, ("bfloat16", "bnb-4bit"), ("bfloat16", "none"), "about a quarter"),
        best_speedup(ev),
        roofline_at_batch(ev),
        roofline_at_batch_1(ev),
        *against_the_ceiling(ev),
    ]


def compile_speedup(ev: Evidence) -> str:
    label = "Static cache + compile vs the baseline, nothing else changed (decode throughput)"
    compiled = [r for r in ev.records if r.config.get("compile", "off") != "off" and r.launched and _only_cache(r, ev)]
    fastest = max((r for r in compiled if r.complete), key=_throughput, default=None)
    if fastest is None or ev.baseline is None:
        tried = "; ".join(f"#{r.number} {_change(r, ev)}: {_outcome(r)}" for r in compiled) or "no compiled trial ran"
        why = "the baseline did not complete" if ev.baseline is None else f"no such compiled trial completed ({tried})"
        return f"{label}: cannot be computed: {why}. Guides: up to about 4x."
    speedup = _throughput(fastest) / _throughput(ev.baseline)
    return (
        f"{label}: {speedup:.2f}x (trial #{fastest.number}, {_change(fastest, ev)}: "
        f"{_throughput(fastest):.1f} vs {_throughput(ev.baseline):.1f} tok/s). Guides: up to about 4x."
    )


def _only_cache(record: TrialRecord, ev: Evidence) -> bool:
    """The trial differs from the baseline in its cache and compilation alone (the guides' comparison)."""
    changed = {name for name, value in record.config.items() if ev.baseline_config.get(name) != value}
    return changed <= {"cache_implementation", "compile"}


def weight_ratio(ev: Evidence, numerator: tuple[str, str], denominator: tuple[str, str], expected: str) -> str:
    """Weight memory of (dtype, quantization) against another, from complete trials' `weight_bytes`."""
    label = f"{_weights_label(numerator)} vs {_weights_label(denominator)} weight memory"
    top, bottom = _weights_trial(ev, *numerator), _weights_trial(ev, *denominator)
    missing = [_weights_label(key) for key, trial in ((numerator, top), (denominator, bottom)) if trial is None]
    if top is None or bottom is None:
        return f"{label}: cannot be computed: no complete trial with {' nor '.join(missing)}. Guides: {expected}."
    ratio = top.metrics["weight_bytes"] / bottom.metrics["weight_bytes"]
    return (
        f"{label}: {ratio:.1%} ({format_bytes(top.metrics['weight_bytes'])} in trial #{top.number} vs "
        f"{format_bytes(bottom.metrics['weight_bytes'])} in trial #{bottom.number}). Guides: {expected}."
    )


def _weights_label(key: tuple[str, str]) -> str:
    dtype, quantization = key
    return dtype if quantization == "none" else f"{quantization} ({dtype})"


def _weights_trial(ev: Evidence, dtype: str, quantization: str) -> TrialRecord | None:
    """Weights depend on dtype and quantization only: the first complete trial with both."""
    return next(
        (
            r
            for r in ev.complete
            if r.config.get("dtype") == dtype
            and r.config.get("quantization") == quantization
            and "weight_bytes" in r.metrics
        ),
        None,
    )


def best_speedup(ev: Evidence) -> str:
    label = "Best configuration (autotune best) vs the baseline"
    if ev.best is None:
        return f"{label}: cannot be computed: autotune best chose no configuration (see best.log)."
    speedup = ev.best.get("speedup_vs_baseline")
    if speedup is None:
        return f"{label}: cannot be computed: the baseline has no throughput (trial #{ev.best['trial']} was chosen)."
    changed = _describe_change(ev.best["config"], ev.baseline_config)
    return (
        f"{label}: {speedup:.2f}x decode throughput (trial #{ev.best['trial']}, {changed}: "
        f"{ev.best['metrics'][THROUGHPUT.name]:.1f} tok/s, KL {ev.best['metrics'][KL_DIVERGENCE.name]:.2e})."
    )


def roofline_at_batch(ev: Evidence) -> str:
    batch = ev.settings.workload.batch_size
    label = f"Memory-bandwidth roofline share at batch {batch} (the search's workload)"
    if ev.best is None:
        return f"{label}: cannot be computed: autotune best chose no configuration."
    best = _share(ev.best["metrics"].get("roofline_fraction"))
    baseline = _share(ev.baseline.metrics.get("roofline_fraction") if ev.baseline else None)
    peak = ev.settings.profile.bandwidth_gb_s
    return f"{label}: best configuration (trial #{ev.best['trial']}) {best}; baseline {baseline}; of {peak} GB/s peak."


def roofline_at_batch_1(ev: Evidence) -> str:
    label = "Memory-bandwidth roofline share at batch 1 (autotune measure --workload latency)"
    parts = [f"{name} configuration {_latency_share(ev.latency[name], name)}" for name in ("best", "baseline")]
    return f"{label}: {'; '.join(parts)}. gpt-fast reaches about 80% at batch 1."


def against_the_ceiling(ev: Evidence) -> list[str]:
    """The best configuration's decode throughput as a fraction of the hand loop's, at the search's batch and at 1."""
    label = "Best configuration against the hand-written decode loop (autotune ceiling)"
    workload = ev.settings.workload
    search = (workload.batch_size, workload.input_len, workload.output_len)
    lines = []
    for batch, best_tok_s, source in (
        (search[0], ev.best["metrics"][THROUGHPUT.name] if ev.best else None, "the search's trial"),
        (1, _latency_tok_s(ev.latency["best"]), "autotune measure --workload latency"),
    ):
        figure = next((f for f in ev.ceilings if (f["batch_size"], f["input_len"], f["output_len"]) ==
                       (batch, *search[1:])), None)  # fmt: skip
        if figure is None or best_tok_s is None:
            missing = "no figure of the hand loop was stored (see ceiling.log)" if figure is None else "no best figure"
            lines.append(f"{label}, batch {batch}: cannot be computed: {missing}.")
            continue
        lines.append(
            f"{label}, batch {batch}: {best_tok_s / figure['decode_tok_s']:.2f}x ({best_tok_s:.1f} tok/s, {source}, "
            f"vs {figure['decode_tok_s']:.1f} tok/s for the loop in {figure['dtype']}, compile {figure['compile']}, "
            f"{figure['roofline_fraction']:.1%} of the roofline). Goal: 0.9x."
        )
        if batch == 1:
            break
    return lines


def _latency_tok_s(document: dict[str, Any] | None) -> float | None:
    if document is None or document.get("outcome") != "ok":
        return None
    return document["metrics"][THROUGHPUT.name]


def _share(fraction: float | None) -> str:
    return "cannot be computed (no roofline figure)" if fraction is None else f"{fraction:.1%}"


def _latency_share(document: dict[str, Any] | None, name: str) -> str:
    if document is None:
        return f"cannot be computed: no measurement was written (see measure-{name}.log)"
    if document.get("outcome") != "ok":
        return f"cannot be computed: {document.get('outcome')}: {_first_line(document.get('message') or '')}"
    metrics = document["metrics"]
    return f"{_share(metrics.get('roofline_fraction'))} ({metrics[THROUGHPUT.name]:.1f} tok/s)"


# ------------------------------------------------------------------------------------------- tables


def duplicates(ev: Evidence) -> list[TrialRecord]:
    """Skipped proposals of a configuration that a trial measured or an earlier skip already shows (the
    sampler repeats itself)."""
    seen = {config_key(r.config) for r in ev.records if r.launched}
    repeated = []
    for record in (r for r in ev.records if r.skipped):
        key = config_key(record.config)
        if key in seen:
            repeated.append(record)
        seen.add(key)
    return repeated


def trial_rows(ev: Evidence) -> list[list[str]]:
    """One row per trial of the study in order, skipped proposals included, but for duplicates."""
    repeated = {r.number for r in duplicates(ev)}
    return [
        [
            str(r.number),
            ", ".join(r.roles) or "sampler",
            _change(r, ev),
            _outcome(r),
            _figure(r.metrics.get(THROUGHPUT.name), "{:.1f}"),
            _figure(r.metrics.get("ttft_s"), "{:.1f}", 1000),
            _figure(r.metrics.get(PEAK_MEMORY.name), "{:.3g}"),
            _figure(r.metrics.get(KL_DIVERGENCE.name), "{:.2e}"),
            _figure(r.metrics.get("weight_bytes"), "{:.3g}", 1e-9),
            _figure(r.metrics.get("roofline_fraction"), "{:.3g}%", 100),
        ]
        for r in ev.records
        if r.number not in repeated
    ]


TRIAL_COLUMNS = ["#", "why it ran", "change vs baseline", "outcome", "tok/s", "TTFT ms", "peak GB", "KL",
                 "weights GB", "roofline"]  # fmt: skip


TRIAL_LEGEND = (
    "Every trial of the study, skipped proposals included. tok/s: decode throughput of the batch; TTFT: time to "
    "first token (p50); peak GB: peak memory; KL: divergence from the reference (nats per token); weights GB: "
    "the loaded model's parameters and buffers; roofline: decode memory bandwidth as a share of the profile's peak."
)


def _outcome(record: TrialRecord) -> str:
    if record.skipped:
        return f"skipped ({_first_line(record.skipped)})"
    if record.outcome is None:
        return f"not run ({record.state.lower()})"
    if record.outcome == "ok":
        return "works"
    return f"{record.outcome} ({_first_line(record.message) or record.phase or 'no message'})"


def _change(record: TrialRecord, ev: Evidence) -> str:
    return _describe_change(record.config, ev.baseline_config)


def _describe_change(config: Config, baseline: Config) -> str:
    return ", ".join(f"{name}={value}" for name, value in config.items() if baseline.get(name) != value) or "none"


def knob_rows(ev: Evidence) -> list[list[str]]:
    """Every value of every knob of the space: what became of it."""
    stored = SearchSpace.from_json(ev.settings.space)
    warm_up = {p.why: p.config for p in warm_up_set(stored, ev.baseline_config)}
    return [
        [spec.name, str(value), _value_status(ev, stored, warm_up, spec.name, value)]
        for spec in load_space(ev.space_path).knobs
        for value in _values(spec.values, stored, spec.name)
    ]


def _values(declared: Iterable[Any], stored: SearchSpace, name: str) -> list[Any]:
    """The declared values, then any the study added (the baseline's dtype, say)."""
    values = list(declared)
    return values + [v for v in stored.knob(name).values if v not in values]


def _value_status(ev: Evidence, stored: SearchSpace, warm_up: dict[str, Config], name: str, value: Any) -> str:
    removed = stored.removed.get(name, {}).get(str(value))
    if removed:
        return f"skipped (removed for profile {ev.settings.profile.name}: {removed})"
    having = [r for r in ev.records if r.config.get(name) == value]
    launched = [r for r in having if r.launched and r.outcome]
    if launched:
        first = next((r for r in launched if f"warm-up: {name}={value}" in r.roles), launched[0])
        others = f" ({len(launched)} trials have it)" if len(launched) > 1 else ""
        return f"{_outcome(first)}: trial #{first.number}{others}"
    excluded = ev.exclusions.get(name, {}).get(str(value))
    if excluded:
        return f"skipped (excluded by the study: {excluded})"
    if having:
        return f"{_outcome(having[0])}: trial #{having[0].number}"
    return "not run (" + _why_not_run(ev, stored, warm_up.get(f"warm-up: {name}={value}")) + ")"


def _why_not_run(ev: Evidence, stored: SearchSpace, config: Config | None) -> str:
    if config is None:
        return "no configuration of the warm-up set has it"
    history = [(r.number, r.config, r.outcome) for r in ev.records if r.outcome]
    reason = stored.forbidding(ev.exclusions).violation(config)
    return reason or ruled_out(config, history) or "the searches ended before it (budget or --trials)"


def _figure(value: float | None, pattern: str, scale: float = 1.0) -> str:
    return "–" if value is None else pattern.format(value * scale)


def _throughput(record: TrialRecord) -> float:
    return record.metrics[THROUGHPUT.name]


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 160 else line[:157] + "..."


def markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    def cells(values: list[str]) -> str:
        return "| " + " | ".join(value.replace("|", "\\|") for value in values) + " |"

    return [cells(columns), "|" + "---|" * len(columns), *(cells(row) for row in rows)]


# ------------------------------------------------------------------------------------------ summary

ENVIRONMENT_KEYS = ("device", "device_name", "driver", "cuda", "compute_capability", "device_memory_bytes",
                    "torch", "transformers", "accelerate", "bitsandbytes", "kernels", "tokenizers", "python",
                    "cpu_threads")  # fmt: skip
ALWAYS_SHOWN = ("driver", "torch", "transformers", "bitsandbytes", "kernels")


def _absent(key: str, environment: dict[str, Any]) -> str:
    """A package the worker looked for and did not find is not installed; anything else was not recorded."""
    return "not installed" if key in environment and key != "driver" else "not recorded"


def environment_rows(ev: Evidence) -> list[list[str]]:
    environment = ev.settings.prepared.environment
    rows = []
    for key in (*ENVIRONMENT_KEYS, *sorted(set(environment) - set(ENVIRONMENT_KEYS))):
        value = environment.get(key)
        if value is None and key not in ALWAYS_SHOWN:
            continue
        if key == "device_memory_bytes" and value is not None:
            value = format_bytes(value)
        rows.append([key, str(value) if value is not None else _absent(key, environment)])
    profile = ev.settings.profile
    rows.append(["profile", f"{profile.name}: {profile.description}, {profile.bandwidth_gb_s} GB/s peak"])
    if ev.settings.prepared.hardware_note:
        rows.append(["note", ev.settings.prepared.hardware_note])
    return rows


def model_rows(ev: Evidence) -> list[list[str]]:
    info = ev.settings.prepared.model_info
    workload = ev.settings.workload
    latency = next((d["workload"] for d in ev.latency.values() if d is not None), None)
    return [
        ["model", f"{ev.settings.model} ({ev.settings.prepared.model_path})"],
        ["architecture", f"{info.get('architecture')}, {info.get('parameters', 0):,} parameters, "
         f"checkpoint {info.get('checkpoint_dtype')}"],
        ["search workload", _workload(workload.to_json())],
        ["batch-1 workload (measure)", _workload(latency) if latency else "not measured"],
        ["reference", _describe_change(ev.settings.prepared.reference_config, {})],
        ["baseline", _describe_change(ev.baseline_config, {})],
    ]  # fmt: skip


def _workload(workload: dict[str, Any]) -> str:
    requests = 1 if workload["kind"] == "latency" else workload["batch_size"]
    return (
        f"{workload['kind']}: {requests} prompt(s) at a time, {workload['input_len']} tokens in, "
        f"{workload['output_len']} generated"
    )


def time_rows(runner: Runner, ev: Evidence | None, wall_s: float) -> list[list[str]]:
    rows = [["wall time of this proof", format_duration(wall_s)]]
    rows += [[f"{step.name}", format_duration(step.seconds)] for step in runner.steps]
    for i, run in enumerate(ev.runs if ev else [], 1):
        limits = f"budget {format_duration(run['budget_s'])}" if run.get("budget_s") else "no budget"
        limits += f", --trials {run['max_trials']}" if run.get("max_trials") else ""
        rows.append([
            f"search run {i} (stored)",
            f"{run.get('launched', 0)} trials in {format_duration(run.get('elapsed_s', 0.0))} ({limits}); "
            f"stopped: {run.get('stop_reason', '?')}",
        ])  # fmt: skip
    return rows


def command_lines(runner: Runner) -> list[str]:
    lines = [
        f"{i}. `{shlex.join(step.command)}`: exit status {step.code}, {format_duration(step.seconds)}, "
        f"output in `{step.log}`"
        for i, step in enumerate(runner.steps, 1)
    ]
    return lines + [f"- note: {note}" for note in runner.notes]


def failure_tails(runner: Runner, lines: int = 12) -> list[str]:
    """The end of each failed command's log."""
    tails = []
    for step in (s for s in runner.steps if s.code != 0):
        text = (runner.out / step.log).read_text(errors="replace").rstrip().splitlines()[-lines:]
        tails += [f"`{step.name}` exited with status {step.code}; the end of `{step.log}`:", ""]
        tails += ["```", *text, "```", ""]
    return tails


def write_summary(args: argparse.Namespace, runner: Runner, wall_s: float) -> tuple[Path, list[str]]:
    """SUMMARY.md from the study's storage and the JSON files; returns its path and the headline lines."""
    ev = load_evidence(args.out, args.space)
    lines = [f"# autotune GPU proof: `{args.model}` on `{args.device}`", ""]
    lines += [f"Generated by `benchmarks/gpu/gpu_proof.py` from `{args.out.name}/study.db` (study `{STUDY}`), "
              "`best.json` and `measure-*.json`: every figure below is one the tool stored.", ""]  # fmt: skip
    if ev is None:
        lines += ["No study was stored: the search failed before its first trial. See the logs below.", ""]
        found: list[str] = []
    else:
        found = headlines(ev)
        lines += ["## Headline figures", "", *(f"- {line}" for line in found), ""]
        lines += ["## Environment", "", *markdown_table(["what", "value"], environment_rows(ev)), ""]
        lines += ["## Model and workload", "", *markdown_table(["what", "value"], model_rows(ev)), ""]
        lines += ["## Trials", "", TRIAL_LEGEND, "", *markdown_table(TRIAL_COLUMNS, trial_rows(ev)), ""]
        if duplicates(ev):
            lines += [f"Not shown: {len(duplicates(ev))} skipped proposal(s) of a configuration that another trial "
                      "above measured or skipped.", ""]  # fmt: skip
        lines += ["## Knob values", "", "Every value of the space: the trial that measured it, or why none did.", ""]
        lines += [*markdown_table(["knob", "value", "outcome"], knob_rows(ev)), ""]
    lines += ["## Time", "", *markdown_table(["what", "time"], time_rows(runner, ev, wall_s)), ""]
    lines += ["## Commands", "", *command_lines(runner), ""]
    lines += failure_tails(runner)
    path = args.out / "SUMMARY.md"
    path.write_text("\n".join(lines))
    return path, found


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="demo, llama-1b (built here), or a path or hub id")
    parser.add_argument("--device", required=True, help="cuda, cuda:N or cpu")
    parser.add_argument("--out", type=Path, required=True, help="folder for the study, report, logs and SUMMARY.md")
    parser.add_argument("--budget", default="20m", help="wall-clock budget of the searches together [20m]")
    parser.add_argument("--gpu", help="hardware profile [cpu on --device cpu, else auto]")
    parser.add_argument("--train-steps", type=int, default=DEFAULT_TRAIN_STEPS, help="llama-1b training steps [60]")
    parser.add_argument("--trial-timeout", default="10m", help="a trial running longer is killed [10m]")
    parser.add_argument("--space", type=Path, help="search-space YAML [autotune/space/default.yaml]")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generation in the search [8]")
    parser.add_argument("--input-len", type=int, default=128, help="tokens per prompt [128]")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per prompt [64]")
    parser.add_argument("--min-seconds", type=float, help="seconds each figure is timed for [autotune's default]")
    parser.add_argument("--ceiling-compile", help="the hand loop's compile mode [autotune ceiling's default]")
    args = parser.parse_args(argv)
    args.gpu = args.gpu or ("cpu" if args.device == "cpu" else "auto")
    args.space = (args.space or DEFAULT_SPACE).absolute()
    args.out = args.out.absolute()
    parse_duration(args.budget)  # a malformed budget fails here, before anything runs
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runner = Runner(args.out)
    resolved = resolve_model(args, runner)
    searches = run_searches(args, runner, resolved) if resolved else []
    if resolved and _existing_study(storage_url(args.out)) is not None:
        pick_and_measure(args, runner, resolved)
        measure_ceiling(args, runner, resolved)
    path, found = write_summary(args, runner, time.monotonic() - started)
    print(f"\nsummary: {path}", *found, sep="\n")
    failed = resolved is None or any(step.code != 0 for step in searches)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
