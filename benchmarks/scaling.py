"""How trials per hour grow with workers: one worker, then two, on the same space, each on its own core.

Each run gets a fresh study of the demo model (created by `autotune search --trials 1`, outside the
timed part, so both start from the same point of the search), then N `autotune worker` processes for a
fixed wall time (`--budget`), worker i pinned to core i with every process it starts (sched_setaffinity
is inherited) and one torch thread (OMP_NUM_THREADS=1). A trial counts when it ended with an outcome of
its own inside the time: not one the budget stopped, not one skipped before launch.

    python benchmarks/scaling.py --seconds 120
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.study import records

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "search_spaces" / "scaling.yaml"


@dataclass(frozen=True)
class Run:
    workers: int
    seconds: float
    trials: int  # ended with an outcome of their own inside the time
    durations: dict[str, float]  # of those trials, by configuration

    @property
    def per_hour(self) -> float:
        return self.trials / self.seconds * 3600


def _pinned(core: int):
    return lambda: os.sched_setaffinity(0, {core})


def _single_threaded() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def create_study(name: str, folder: Path, workload: list[str], core: int) -> str:
    """The study, with its first trial (the reference) measured; its storage URL."""
    url = f"sqlite:///{folder}/{name}.db"
    command = [sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--space", str(SPACE),
               "--study", name, "--storage", url, "--trials", "1", "--seed", "0",
               "--report", str(folder / f"{name}.html"), *workload]  # fmt: skip
    done = subprocess.run(command, env=_single_threaded(), preexec_fn=_pinned(core), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"creating study {name} failed:\n{done.stdout}\n{done.stderr}")
    return url


def run_workers(name: str, url: str, cores: list[int], seconds: float) -> float:
    """N workers on the study for `seconds` of wall time; when they started (time.time())."""
    command = [sys.executable, "-m", "autotune", "worker", "--study", name, "--storage", url, "--device", "cpu",
               "--budget", f"{seconds:.0f}s"]  # fmt: skip
    started = time.time()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    workers = [subprocess.Popen(command, env=_single_threaded(), preexec_fn=_pinned(core), **quiet) for core in cores]
    for worker in workers:
        if worker.wait() != 0:
            raise SystemExit(f"a worker on {name} ended with status {worker.returncode}")
    return started


def count(name: str, url: str, workers: int, started: float, seconds: float) -> Run:
    study = optuna.load_study(study_name=name, storage=url)
    frozen = {trial.number: trial for trial in study.get_trials(deepcopy=False)}
    ended = [
        record
        for record in records(study)
        if record.launched
        and record.outcome not in (None, "budget", "interrupted")
        and frozen[record.number].datetime_start is not None
        and frozen[record.number].datetime_start.timestamp() >= started
        and frozen[record.number].datetime_complete.timestamp() <= started + seconds
    ]
    return Run(workers, seconds, len(ended), {record.config_key or "": record.duration_s or 0.0 for record in ended})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120, help="wall time of each run")
    parser.add_argument("--workers", default="1,2", help="the runs: numbers of workers")
    parser.add_argument("--batch-size", default="2")
    parser.add_argument("--input-len", default="16")
    parser.add_argument("--output-len", default="8")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    if max(counts) > len(cores):
        raise SystemExit(f"{max(counts)} workers need {max(counts)} cores; this process may use {len(cores)}")
    workload = ["--batch-size", args.batch_size, "--input-len", args.input_len, "--output-len", args.output_len]
    print(f"demo model, space {SPACE.relative_to(REPO)}, workload {' '.join(workload)}, {args.seconds:.0f} s a run, "
          f"cores {cores}, one torch thread per process")  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory(prefix="autotune-scaling-") as folder:
        for workers in counts:
            name = f"scaling-{workers}"
            url = create_study(name, Path(folder), workload, cores[0])
            started = run_workers(name, url, cores[:workers], args.seconds)
            run = count(name, url, workers, started, args.seconds)
            runs.append(run)
            mean = statistics.mean(run.durations.values()) if run.durations else float("nan")
            print(f"{workers} worker(s): {run.trials} trials in {args.seconds:.0f} s = {run.per_hour:.0f} trials/hour "
                  f"(a trial {mean:.1f} s on average)")  # fmt: skip
    base = runs[0]
    for run in runs[1:]:
        print(f"{run.workers} workers / {base.workers}: {run.per_hour / base.per_hour:.2f}x trials per hour")
        print(_matched(base, run))


def _matched(base: Run, run: Run) -> str:
    """The same configurations' trial times in both runs: how much sharing the machine slowed each trial,
    apart from which configurations each run reached (later trials of a search may cost more or less)."""
    both = sorted(set(base.durations) & set(run.durations))
    if not both:
        return "no configuration was measured in both runs"
    ratios = [run.durations[key] / base.durations[key] for key in both if base.durations[key] > 0]
    return (
        f"the {len(both)} configurations measured in both runs: trial time with {run.workers} workers / with "
        f"{base.workers}, median {statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
