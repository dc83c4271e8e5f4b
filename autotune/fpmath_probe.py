"""What only torch can say about this CPU (whether fp32_precision=bf16 changes its float32 matmuls), asked of the trial
worker's probe (worker/fpmath.py) run as a program, so this process never imports torch; the answer kept in the cache
folder per CPU, torch version and oneDNN variables."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

from autotune.paths import default_cache_dir

log = logging.getLogger(__name__)

FPMATH_PROBE = "autotune.worker.fpmath"  # the trial worker's probe, run as a program: this process never imports torch
PROBE_TIMEOUT_S = 120.0  # importing torch on a busy machine, then a few small matmuls


@functools.cache
def bf16_changes_fp32_matmuls() -> bool:
    """Whether fp32_precision=bf16 changes this CPU's float32 matmuls, as the trial worker's torch answers.

    Asked once per CPU (its name and flags), torch version and oneDNN variables, the answer kept in the cache folder.
    Where the probe gives no answer, True: the value is searched, and its trials show what it does.
    """
    path = default_cache_dir() / "machine" / "fp32-bf16-matmuls.json"
    key = _probe_key()
    answers = _read_answers(path)
    if key not in answers:
        answer = _run_probe()
        if answer is None:
            return True
        answers[key] = answer
        _write_answers(path, answers)
    return answers[key]


def _probe_key() -> str:
    """What the probe's answer depends on, in one line: the CPU, torch's version, the oneDNN variables set."""
    name, flags = _cpu_description()
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    onednn = sorted(f"{key}={value}" for key, value in os.environ.items() if key.startswith(("ONEDNN_", "DNNL_")))
    flags_digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return "; ".join([name, f"flags {flags_digest}", f"torch {torch_version}", *onednn])


def _cpu_description() -> tuple[str, str]:
    """The CPU's name and its flags, as Linux lists them (elsewhere, what platform says)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            label, _, text = line.partition(":")
            fields.setdefault(label.strip(), text.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    return name, fields.get("flags", "")


def _run_probe() -> bool | None:
    command = [sys.executable, "-m", FPMATH_PROBE]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
        return bool(json.loads(done.stdout.strip().splitlines()[-1])["bf16_changes_fp32_matmuls"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as error:
        log.warning("the probe of fp32_precision=bf16 gave no answer (%s): the value is kept", error)
        return None


def _read_answers(path: Path) -> dict[str, bool]:
    try:
        answers = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return answers if isinstance(answers, dict) else {}


def _write_answers(path: Path, answers: dict[str, bool]) -> None:
    """Written whole or not at all; a cache that cannot be written only costs the next process a probe."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(answers, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError as error:
        log.debug("the probe's answer not kept in %s: %s", path, error)
