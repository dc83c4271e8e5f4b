"""The two tasks a worker process runs: `prepare` (model, environment, reference) and `trial`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autotune.data import EVAL_TEXT
from autotune.results import Candidate, ModelSpec, Outcome, TaskResult, TaskSpec
from autotune.space.plan import Plan
from autotune.stats import Summary
from autotune.timing import repeat_until
from autotune.worker.demo_model import ensure_demo_model
from autotune.worker.environment import environment
from autotune.worker.failures import classify
from autotune.worker.loading import load_model, load_tokenizer
from autotune.worker.memory import PeakMemory
from autotune.worker.quality import compare_with_reference, compute_reference, eval_windows, load_reference
from autotune.worker.quality import save_reference as save_reference_file
from autotune.worker.workload import Iteration, build_inputs, make_workload

log = logging.getLogger(__name__)


class Phases:
    """Times the phases of a task and remembers which one is running, for failure reports."""

    def __init__(self, fault: dict[str, str] | None) -> None:
        self.timings: dict[str, float] = {}
        self.current = "start"
        self.fault = fault

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.current = name
        if self.fault and self.fault.get("phase") == name:
            inject_fault(self.fault["kind"])
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start


def run_task(spec: TaskSpec, startup_s: float) -> TaskResult:
    """Run a task; every failure becomes a result with its outcome, never an exception."""
    phases = Phases(spec.fault)
    phases.timings["startup"] = startup_s
    try:
        with phases("start"):
            _configure(spec)
        result = _prepare(spec, phases) if spec.task == "prepare" else _trial(spec, phases)
    except BaseException as error:
        classified = classify(error)
        log.exception("task failed in phase %s", phases.current)
        result = TaskResult(classified.outcome, classified.message[:4000], phase=phases.current)
        if classified.knob and spec.candidate and classified.knob in spec.candidate.config:
            result.excludes = {"knob": classified.knob, "value": spec.candidate.config[classified.knob]}
    result.timings = {**phases.timings, **result.timings}
    return result


def _configure(spec: TaskSpec) -> None:
    torch.manual_seed(0)
    if spec.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {spec.device} requested, but torch sees no CUDA device")
        torch.cuda.set_device(torch.device(spec.device))
        if spec.memory_cap_bytes:
            total = torch.cuda.get_device_properties(torch.device(spec.device)).total_memory
            if spec.memory_cap_bytes < total:
                torch.cuda.set_per_process_memory_fraction(spec.memory_cap_bytes / total, torch.device(spec.device))


# ------------------------------------------------------------------------------------------ prepare


def _prepare(spec: TaskSpec, phases: Phases) -> TaskResult:
    with phases("resolve"):
        model = replace(spec.model, path=_resolve_model_path(spec))
        tokenizer = load_tokenizer(model)
        info = _model_info(model)
    with phases("reference"):
        reference = _ensure_reference(spec, model, tokenizer, info)
    details = {"model_path": model.path, "model": info, "reference": reference}
    return TaskResult(Outcome.OK, details=details, environment=environment(spec.device))


def _resolve_model_path(spec: TaskSpec) -> str:
    if spec.model.id == "demo":
        return str(ensure_demo_model(Path(spec.cache_dir)))
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
    }


def reference_key(spec: TaskSpec, model: ModelSpec, candidate: Candidate) -> str:
    """Identifies reference outputs by model (files, revision), evaluation text and configuration."""
    identity = {
        "model": model.id,
        "revision": model.revision,
        "files": _model_files_fingerprint(Path(model.path)),
        "eval_text": hashlib.sha256(EVAL_TEXT.read_bytes()).hexdigest(),
        "quality": spec.quality.__dict__,
        "config": candidate.config,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _model_files_fingerprint(path: Path) -> list[tuple[str, int]]:
    if not path.is_dir():
        return []
    return sorted((item.name, item.stat().st_size) for item in path.iterdir() if item.is_file())


def _ensure_reference(spec: TaskSpec, model: ModelSpec, tokenizer: Any, info: dict[str, Any]) -> dict[str, Any]:
    """Reference log-probabilities from the most precise candidate that runs, cached across studies."""
    failures = []
    for candidate in spec.reference_candidates:
        path = Path(spec.cache_dir) / "references" / f"{reference_key(spec, model, candidate)}.pt"
        if not path.exists():
            try:
                _compute_reference(spec, model, tokenizer, info, candidate, path)
            except torch.OutOfMemoryError as error:
                failures.append(f"{candidate.config}: {error}")
                torch.cuda.empty_cache()
                continue
        reference = load_reference(path)
        return {"config": candidate.config, "path": str(path), "perplexity": reference["perplexity"]}
    raise RuntimeError(f"no reference configuration fits in memory: {'; '.join(failures)}")


def _compute_reference(
    spec: TaskSpec, model: ModelSpec, tokenizer: Any, info: dict[str, Any], candidate: Candidate, path: Path
) -> None:
    loaded = load_model(model, Plan.from_json(candidate.plan), spec.device)
    windows = eval_windows(tokenizer, spec.quality, info.get("max_position_embeddings"))
    save_reference_file(compute_reference(loaded, windows, spec.quality.top_k), path)
    del loaded


# -------------------------------------------------------------------------------------------- trial


def _trial(spec: TaskSpec, phases: Phases) -> TaskResult:
    assert spec.candidate is not None and spec.reference_path is not None
    plan = Plan.from_json(spec.candidate.plan)
    with phases("load"):
        tokenizer = load_tokenizer(spec.model)
        if "quantization_config" in plan.load:
            import bitsandbytes  # noqa: F401 - its library counts as process baseline, not as model memory
        memory = PeakMemory(spec.device)
        model = load_model(spec.model, plan, spec.device)
    inputs = build_inputs(tokenizer, spec.workload)
    workload = make_workload(model, plan, inputs, spec.workload, tokenizer.pad_token_id)
    with phases("warmup"):
        warmup = [workload.run() for _ in range(max(1, spec.workload.warmup_iterations))]
    with phases("measure"):
        memory.reset()
        w = spec.workload
        iterations = repeat_until(workload.run, w.min_iterations, w.min_seconds, w.max_iterations)
        peak = memory.peak_bytes()
    with phases("quality"):
        quality = compare_with_reference(model, load_reference(Path(spec.reference_path)))
    metrics = {**_speed_metrics(iterations, warmup[0]), **quality, **memory.details()}
    metrics["peak_memory_bytes"] = float(peak)
    metrics["peak_memory_gb"] = peak / 1e9
    metrics["warmup_s"] = phases.timings["warmup"]
    return TaskResult(Outcome.OK, metrics=metrics, environment=environment(spec.device))


def _speed_metrics(iterations: list[Iteration], first: Iteration) -> dict[str, float]:
    decode = Summary.of([i.decode_tok_s for i in iterations])
    ttft = Summary.of([i.ttft_s for i in iterations])
    tpot = Summary.of([i.tpot_s for i in iterations])
    elapsed = Summary.of([i.elapsed_s for i in iterations])
    return {
        "throughput_tok_s": decode.p50,
        "throughput_p95_tok_s": decode.p95,
        "throughput_cv": decode.cv,
        "e2e_throughput_tok_s": Summary.of([i.e2e_tok_s for i in iterations]).p50,
        "ttft_s": ttft.p50,
        "ttft_p95_s": ttft.p95,
        "tpot_s": tpot.p50,
        "tpot_p95_s": tpot.p95,
        "iterations": float(decode.n),
        "iteration_s": elapsed.p50,
        "first_call_s": first.elapsed_s,
        "compile_s": max(0.0, first.elapsed_s - elapsed.p50),
    }


# ------------------------------------------------------------------------------------------- faults


def inject_fault(kind: str) -> None:
    """Fail for real, as tests ask: hang, raise, exit without a result, die by a signal, run out of memory."""
    if kind == "hang":
        time.sleep(10**6)
    elif kind == "hang_with_child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)", "autotune-fault-child"])
        time.sleep(10**6)
    elif kind == "raise":
        raise RuntimeError("injected failure")
    elif kind == "exit":
        os._exit(3)
    elif kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "oom":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.empty(1 << 62, dtype=torch.uint8, device=device)
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
