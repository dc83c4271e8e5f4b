"""The phases a worker announces in its log, and the words the progress display uses for them.

The worker writes one line per phase to its log (its stdout); the study process reads the log as the
task runs. The same lines stay in the trial's log artifact, so a log says how far a trial got.
"""

from __future__ import annotations

PREFIX = "autotune phase: "
COMPILE_CACHE = "compile-cache"  # a study's archives of compiled code unpacked before a trial, its own archived after
COMPILING = "compiling"  # where a search's summary puts a compiling trial's first calls and its compile cache's time

LABELS = {
    "spawn": "starting a worker process (it imports torch and transformers)",  # announced by the study process
    COMPILE_CACHE: "loading the study's compiled code",
    "start": "setting up the device",
    "resolve": "finding the model and reading its config",
    "demo-model": "building the demo model (first run only)",
    "tokenizer": "loading the tokenizer",
    "context": "checking the workload fits the model's context",
    "reference": "computing the reference outputs (cached after the first run)",
    "load": "loading the model",
    "setup": "setting up the workload",
    "warmup": "warming up",
    "measure": "measuring",
    "quality": "checking quality against the reference",
    "evaluate": "answering the task's items (lm-evaluation-harness)",
}


def line(name: str, elapsed_s: float) -> str:
    return f"{PREFIX}{name} at {elapsed_s:.1f}s\n"


def parse(text: str) -> str | None:
    """The phase a log line announces, or None."""
    if not text.startswith(PREFIX):
        return None
    return text.removeprefix(PREFIX).split(" at ")[0].strip() or None


def label(name: str, compiles: bool = False) -> str:
    if name == "warmup" and compiles:
        return "warming up and compiling"
    return LABELS.get(name, name)
