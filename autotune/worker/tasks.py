"""The tasks a worker process runs: `prepare` (model, environment, reference), `trial`, and `ceiling` (the
hand-written decode loop of `autotune ceiling`, in its own module)."""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autotune import for_tests
from autotune.data import EVAL_TEXT
from autotune.extras import why_missing
from autotune.figures.metrics import PERPLEXITY
from autotune.for_tests import Fault
from autotune.paths import demo_model_path
from autotune.process import phases as phase_lines
from autotune.process.results import (
    Blame,
    Candidate,
    FoundReference,
    ModelSpec,
    Outcome,
    TaskDetails,
    TaskResult,
    TaskSpec,
    write_json_atomically,
)
from autotune.space.knobs import AttentionKnob
from autotune.validate import context_problem, position_limit, trace_too_long
from autotune.worker.compile_cache import CompileCache, cache_key
from autotune.worker.demo_model import demo_model_built, ensure_demo_draft
from autotune.worker.environment import environment
from autotune.worker.failures import UnsupportedError, classify
from autotune.worker.generation import OUTPUT_HARNESS, PaddedGeneration, build_inputs
from autotune.worker.loading import load_model, load_tokenizer
from autotune.worker.measurement.quality.forced import eval_rows, reference_rows
from autotune.worker.measurement.quality.reference import compute_reference, load_reference
from autotune.worker.measurement.quality.reference import save_reference as save_reference_file
from autotune.worker.tensor_parallel import is_rank, is_reporting_rank, ranks_of, run_ranks
from autotune.worker.traffic import ReplayRequest, replay_requests, shape_of
from autotune.workloads import KINDS

log = logging.getLogger(__name__)


class Phases:
    """Times the phases of a task and remembers which one is running, for failure reports."""

    def __init__(self, fault: Fault | None) -> None:
        self.timings: dict[str, float] = {}
        self.current = "start"
        self.fault = fault
        self.started = time.perf_counter()

    def announce(self, name: str) -> None:
        """One line in the log (this process's stdout), read by the study process for its progress display."""
        if not is_reporting_rank():
            return
        sys.stdout.write(phase_lines.line(name, time.perf_counter() - self.started))
        sys.stdout.flush()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.current = name
        self.announce(name)
        for_tests.phase_starting(self.fault, name)
        start = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start  # a probe repeats phases


def perform(spec: TaskSpec, startup_s: float) -> TaskResult:
    """Run a task; every failure becomes a result with its outcome, never an exception. A study's trial compiles in
    the study's folder, which holds what its archives brought (autotune/worker/compile_cache.py)."""
    phases = Phases(spec.fault)
    phases.timings["startup"] = startup_s
    compile_cache = _compile_cache(spec, phases)
    try:
        with phases("start"):
            _configure(spec)
        result = _dispatch(spec, phases)
    except BaseException as error:
        classified = classify(error, spec.candidate.config if spec.candidate else None)
        log.exception("task failed in phase %s", phases.current)
        result = TaskResult(classified.outcome, classified.message[:4000], phase=phases.current)
        if classified.knob and spec.candidate and classified.knob in spec.candidate.config:
            result.blame = Blame(classified.knob, spec.candidate.config[classified.knob], classified.certain)
    result.timings = {**phases.timings, **result.timings}
    if compile_cache is not None:
        result.details.compile = compile_cache.close(result.details.compile)
        result.timings[phase_lines.COMPILE_CACHE] = compile_cache.seconds
    return result


def _compile_cache(spec: TaskSpec, phases: Phases) -> CompileCache | None:
    """The study's compile folder in use, its archives loaded; None for a task outside a study."""
    if spec.compile_cache is None:
        return None
    if spec.compile_cache.archives:
        phases.announce(phase_lines.COMPILE_CACHE)
    try:
        cache = CompileCache(spec.compile_cache, cache_key(spec.model, spec.device))
    except Exception as error:  # never the trial's failure: it compiles where torch would
        log.warning("the study's compile folder is not used: %s: %s", type(error).__name__, error)
        return None
    for note in cache.notes:
        log.warning("%s", note)
    return cache


CEILING_RUNNER = "autotune.worker.ceiling:run"
EVALUATION_RUNNER = "autotune.worker.evaluation:run"


def _dispatch(spec: TaskSpec, phases: Phases) -> TaskResult:
    if spec.task == "prepare":
        return _prepare(spec, phases)
    if spec.task == "ceiling":
        return _runner(CEILING_RUNNER)(spec, phases)
    if spec.task == "evaluate":
        return _runner(EVALUATION_RUNNER)(spec, phases)
    return _trial(spec, phases)


def _configure(spec: TaskSpec) -> None:
    torch.manual_seed(0)
    if spec.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {spec.device} requested, but torch sees no CUDA device")
        device = torch.device("cuda", torch.device(spec.device).index or 0)  # set_device refuses a bare cuda
        torch.cuda.set_device(device)
        if spec.memory_cap_bytes:
            total = torch.cuda.get_device_properties(device).total_memory
            if spec.memory_cap_bytes < total:
                torch.cuda.set_per_process_memory_fraction(spec.memory_cap_bytes / total, device)


# ------------------------------------------------------------------------------------------ prepare


def _prepare(spec: TaskSpec, phases: Phases) -> TaskResult:
    with phases("resolve"):
        model = replace(spec.model, path=_resolve_model_path(spec, phases))
        info = _model_info(model)
    with phases("tokenizer"):
        tokenizer = load_tokenizer(model)
    with phases("context"):  # a hub model's config is first seen here; a local one was checked already
        limit = info["position_limit"]
        requests = (
            replay_requests(spec.workload.traffic, Path(spec.cache_dir), tokenizer) if spec.workload.traffic else None
        )
        problem = _context_problem((limit[0], limit[1]), spec, requests) if limit else None
        if problem:
            raise ValueError(problem)
    with phases("reference"):
        reference = _ensure_reference(spec, model, tokenizer, info, requests)
    traffic = shape_of(requests) if requests is not None else None
    details = TaskDetails(model_path=model.path, model=info, reference=reference, traffic=traffic)
    return TaskResult(Outcome.OK, details=details, environment=environment(spec.device))


def _resolve_model_path(spec: TaskSpec, phases: Phases) -> str:
    if spec.model.id == "demo":
        if not demo_model_built(Path(spec.cache_dir)):
            phases.announce("demo-model")
        ensure_demo_draft(Path(spec.cache_dir))  # speculative=assistant's draft, trained beside it
        return str(demo_model_path(Path(spec.cache_dir)))
    return spec.model.path or spec.model.id


def _model_info(model: ModelSpec) -> dict[str, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model.path, revision=model.revision, trust_remote_code=model.trust_remote_code)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=model.trust_remote_code)
    text = config.get_text_config(decoder=True)
    dtype = getattr(config, "dtype", None) or torch.float32
    return {
        "architecture": (config.architectures or [type(skeleton).__name__])[0],
        "parameters": sum(p.numel() for p in skeleton.parameters()),
        "checkpoint_dtype": str(dtype).removeprefix("torch."),
        "vocab_size": text.vocab_size,
        "num_hidden_layers": text.num_hidden_layers,
        "hidden_size": text.hidden_size,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None),
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
        "position_limit": position_limit(config.to_dict()),
        "default_attn_implementation": skeleton.config._attn_implementation,  # what loading without one picks
    }


def reference_key(spec: TaskSpec, model: ModelSpec, candidate: Candidate) -> str:
    """Identifies reference outputs by model (files, revision), evaluation text and configuration."""
    identity = {
        "model": model.id,
        "revision": model.revision,
        "files": _model_files_fingerprint(Path(model.path)),
        "eval_text": hashlib.sha256(EVAL_TEXT.read_bytes()).hexdigest(),
        "quality": spec.quality.__dict__,
        "decoding": {"path": "forced-v3", **_forced_shape(spec)},  # through its own decoding path, these rows
        "threads": torch.get_num_threads(),  # a CPU's sums run in another order with other threads (KL ~2e-7)
        "config": candidate.config,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _model_files_fingerprint(path: Path) -> list[tuple[str, int]]:
    if not path.is_dir():
        return []
    return sorted((item.name, item.stat().st_size) for item in path.iterdir() if item.is_file())


def _context_problem(limit: tuple[str, int], spec: TaskSpec, requests: list[ReplayRequest] | None) -> str | None:
    """Why the workload does not fit in the model's positions: its shape, or the first request of the trace that is
    longer (one line naming it); None when it fits."""
    if requests is None or spec.workload.traffic is None:
        return context_problem(limit, spec.workload)
    for number, request in enumerate(requests, 1):
        if len(request.ids) + request.output_len > limit[1]:
            return trace_too_long(spec.workload.traffic.file, number, (len(request.ids), request.output_len), limit)
    return context_problem(limit, replace(spec.workload, traffic=None))  # the quality check's shape


def _ensure_reference(
    spec: TaskSpec, model: ModelSpec, tokenizer: Any, info: dict[str, Any], requests: list[ReplayRequest] | None
) -> FoundReference:
    """Reference outputs from the most precise candidate that runs, cached across studies.

    Two files: teacher-forced log-probabilities on the evaluation text, and greedy continuations of
    the workload's inputs (a trace's requests, each to its own length), keyed by those inputs too.
    """
    if requests is not None:
        inputs, lengths = [r.ids for r in requests], [r.output_len for r in requests]
    else:  # every prompt any trial may run
        inputs, lengths = build_inputs(tokenizer, spec.workload, spec.workload.batch_size), None
    failures = []
    for planned in spec.reference_candidates:
        candidate = _with_default_attention(planned, info)
        key = reference_key(spec, model, candidate)
        logprobs_path = Path(spec.cache_dir) / "references" / f"{key}.pt"
        outputs = lengths or spec.workload.output_len
        greedy_path = logprobs_path.with_name(f"{key}-greedy-{_inputs_key(inputs, outputs)}.json")
        if not (logprobs_path.exists() and greedy_path.exists()):
            try:
                _compute_reference(
                    spec, model, tokenizer, info, candidate, (inputs, lengths), logprobs_path, greedy_path
                )
            except torch.OutOfMemoryError as error:
                failures.append(f"{candidate.config}: {error}")
                torch.cuda.empty_cache()
                continue
        perplexity = load_reference(logprobs_path)[PERPLEXITY.name]
        return FoundReference(candidate.config, str(logprobs_path), str(greedy_path), perplexity)
    raise RuntimeError(f"no reference configuration fits in memory: {'; '.join(failures)}")


def _with_default_attention(candidate: Candidate, info: dict[str, Any]) -> Candidate:
    """A candidate that leaves the attention to transformers, named by what transformers picks.

    Its plan stays without attn_implementation, so loading picks what the architecture supports.
    """
    if AttentionKnob.name in candidate.config:
        return candidate
    return Candidate({**candidate.config, AttentionKnob.name: info["default_attn_implementation"]}, candidate.plan)


def _inputs_key(inputs: list[list[int]], output_len: int | list[int]) -> str:
    return hashlib.sha256(json.dumps([inputs, output_len, OUTPUT_HARNESS]).encode()).hexdigest()[:16]


def _compute_reference(
    spec: TaskSpec,
    model: ModelSpec,
    tokenizer: Any,
    info: dict[str, Any],
    candidate: Candidate,
    workload_inputs: tuple[list[list[int]], list[int] | None],
    logprobs_path: Path,
    greedy_path: Path,
) -> None:
    """The reference's outputs: forced along the evaluation text, and its greedy continuations of the workload's inputs
    (a trace's requests in batches of the workload's, each to its own length)."""
    inputs, lengths = workload_inputs
    plan = candidate.plan
    loaded = load_model(model, plan, spec.device)
    if not logprobs_path.exists():
        shape = _forced_shape(spec)
        rows = eval_rows(tokenizer, shape["rows"], spec.workload.input_len, spec.workload.output_len)
        batch = min(spec.workload.batch_size, shape["rows"])
        forced = PaddedGeneration(loaded, plan, rows.prompts[:batch].tolist(), spec.workload, tokenizer.pad_token_id)
        top_k, positions = spec.quality.top_k, spec.quality.positions
        save_reference_file(
            compute_reference(forced.forced, batch, rows, loaded.device, top_k, positions), logprobs_path
        )
    batch = KINDS[spec.workload.kind].requests(spec.workload) if lengths else len(inputs)
    generated = []
    for start in range(0, len(inputs), batch):
        rows, wanted = inputs[start : start + batch], lengths[start : start + batch] if lengths else None
        generated += (
            PaddedGeneration(loaded, plan, rows, spec.workload, tokenizer.pad_token_id, wanted).call().generated
        )
    write_json_atomically(greedy_path, {"inputs": inputs, "generated": generated})
    del loaded


def _forced_shape(spec: TaskSpec) -> dict[str, int]:
    """The rows of evaluation text the reference decodes: as many as the largest batch any trial may judge (a trial
    of one prompt at a time judges several)."""
    sizes = {*(spec.workload.batch_sizes or [spec.workload.batch_size]), 1}
    rows = reference_rows(sizes, spec.workload.output_len, spec.quality.positions)
    return {"rows": rows, "prompt_len": spec.workload.input_len, "forced_len": spec.workload.output_len}


# -------------------------------------------------------------------------------------------- trial


def _trial(spec: TaskSpec, phases: Phases) -> TaskResult:
    """The workload kind that measures the plan runs the trial (on every rank, under tensor parallelism)."""
    assert spec.candidate is not None and spec.reference_path is not None
    planned = spec.candidate.plan
    kind = KINDS[planned.workload or spec.workload.kind]
    ranks = ranks_of(planned)
    if ranks > 1 and not is_rank():
        return run_ranks(spec, ranks)
    if missing := why_missing(f"the {kind.name} workload", kind.packages):
        raise UnsupportedError(missing)
    workload = kind.as_run(replace(spec.workload, kind=kind.name))
    return _runner(kind.runner)(replace(spec, workload=workload), phases)


def _runner(path: str) -> Callable[[TaskSpec, Phases], TaskResult]:
    """The function a workload kind (or the ceiling task) names as its runner ("module:function", a module of the
    worker)."""
    module, _, function = path.partition(":")
    if not module.startswith("autotune.worker."):
        raise ValueError(f"a workload's runner must be a function of the worker, not {path!r}")
    return getattr(importlib.import_module(module), function)
