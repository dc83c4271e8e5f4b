"""Version conformance: every knob value the cpu profile can run, measured once through the real worker.

    python benchmarks/conformance.py [--space search_spaces/default.yaml] [--timeout 5m]

For the installed transformers, runs `autotune measure --model demo --device cpu --json` on the
transformers defaults (the baseline) and on the baseline with one knob changed, for every value of
the space that the cpu profile does not prune (the strategy's warm-up set), each in its own
process: a batch of two prompts, or one prompt at a time for a value no batch can run (speculative
decoding: transformers refuses assisted generation on batches), so that every value really runs.
Prints one line per configuration: the values changed, the outcome, the throughput or the reason.
Exits 1 when any configuration ends other than `ok` or `unsupported` (`error`, `crashed`,
`timeout`, a refused command line, unreadable output): a transformers version the project claims
must run every value or say why it cannot. CI runs it on the lowest supported transformers and on
the pinned one (.ci/run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # autotune, run as a script

from autotune.profiles import PROFILES
from autotune.search.prepare import baseline_config
from autotune.search.strategy import warm_up_set
from autotune.space import Config, load_space
from autotune.space.knobs import KNOBS, Target
from autotune.space.rules import workload_problem
from autotune.units import parse_duration

REPO = Path(__file__).resolve().parents[1]
DEMO_CHECKPOINT_DTYPE = "bfloat16"
ACCEPTED = ("ok", "unsupported")
BATCH = 2
SHAPE = ["--input-len", "32", "--output-len", "16"]


@dataclass(frozen=True)
class Case:
    label: str
    config: Config

    @property
    def one_prompt_at_a_time(self) -> bool:
        """A value of this configuration is never run on a batch (its knob says why)."""
        batch = Target(device_type="cpu", requests=BATCH)
        return any(name in KNOBS and workload_problem(name, value, batch) for name, value in self.config.items())

    @property
    def workload(self) -> list[str]:
        if self.one_prompt_at_a_time:
            return ["--workload", "latency", "--batch-size", "1", *SHAPE]
        return ["--workload", "throughput", "--batch-size", str(BATCH), *SHAPE]


@dataclass(frozen=True)
class Outcome:
    case: Case
    outcome: str
    detail: str
    seconds: float

    @property
    def accepted(self) -> bool:
        return self.outcome in ACCEPTED


def cases(space_path: Path) -> list[Case]:
    """The baseline, then the baseline with one knob changed for each value the cpu profile runs."""
    profile = PROFILES["cpu"]
    space = load_space(space_path).prune(profile.why_not_value)
    baseline = baseline_config(space, DEMO_CHECKPOINT_DTYPE, profile, "throughput")
    changed = [Case(planned.why.removeprefix("warm-up: "), planned.config) for planned in warm_up_set(space, baseline)]
    return [Case("baseline (transformers defaults)", baseline), *changed]


def measure(case: Case, space_path: Path, timeout_s: float) -> Outcome:
    settings = [argument for name, value in case.config.items() for argument in ("--set", f"{name}={value}")]
    command = [sys.executable, "-m", "autotune", "measure", "--model", "demo", "--device", "cpu", "--space",
               str(space_path), *case.workload, "--trial-timeout", f"{int(timeout_s)}s", "--json",
               *settings]  # fmt: skip
    started = time.monotonic()
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s + 120)
    seconds = time.monotonic() - started
    try:
        document = json.loads(completed.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome(case, f"exit {completed.returncode}", last_line, seconds)
    if document["outcome"] == "ok":
        shape = ", one prompt at a time" if case.one_prompt_at_a_time else ""
        return Outcome(case, "ok", f"{document['metrics']['throughput_tok_s']:.0f} tok/s{shape}", seconds)
    return Outcome(case, document["outcome"], document["message"], seconds)


def build_demo_models() -> float:
    """The demo model and its draft, trained once before any configuration (not inside a trial's timeout);
    the seconds it took (0 when cached)."""
    started = time.monotonic()
    build = (
        "from autotune.paths import default_cache_dir; from autotune.worker.demo_model import ensure_demo_draft; "
        "ensure_demo_draft(default_cache_dir())"
    )
    subprocess.run([sys.executable, "-c", build], cwd=REPO, check=True)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", type=Path, default=REPO / "search_spaces" / "default.yaml")
    parser.add_argument("--timeout", default="5m", help="per configuration (default 5m)")
    args = parser.parse_args()
    timeout_s = parse_duration(args.timeout, "--timeout")
    print(f"conformance: transformers {version('transformers')}, torch {version('torch')}, cpu profile")
    print(f"demo model and draft ready ({build_demo_models():.0f} s)", flush=True)
    outcomes = []
    for case in cases(args.space):
        outcome = measure(case, args.space, timeout_s)
        outcomes.append(outcome)
        mark = "  " if outcome.accepted else "!!"
        print(f"{mark} {case.label:<38} {outcome.outcome:<12} {outcome.detail}  ({outcome.seconds:.0f} s)", flush=True)
    failed = [outcome for outcome in outcomes if not outcome.accepted]
    print(f"conformance: {len(outcomes) - len(failed)} of {len(outcomes)} configurations ok or unsupported")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
