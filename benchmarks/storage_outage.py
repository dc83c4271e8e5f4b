"""A PostgreSQL study through a 30 s outage: three `autotune worker` processes measure while the server is stopped
(`pg_ctl stop -m fast`) and started again 30 s later, and a fourth, with a shorter --storage-patience, stops with
exit 75 and leaves its result on disk for a fresh worker started once the server is back.

The test (tests/e2e/test_storage_e2e.py) ends its outage as soon as it has proved its point; this script holds the
server down for the issue's 30 s, and prints what each process said, when, and what the study holds after.

    python benchmarks/storage_outage.py [--outage 30] [--patience 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.paths import default_cache_dir
from autotune.study import records
from autotune.worker.demo_model import ensure_demo_model
from tests.postgres import PostgresServer

SMALL = ["--batch-size", "2", "--input-len", "32", "--output-len", "16"]
SPACE = """
knobs:
  dtype: [float32, bfloat16]
  attn_implementation: [sdpa, eager]
  execution_mode: [no_grad, inference_mode]
"""
CLOCK = time.monotonic()


def now() -> float:
    return time.monotonic() - CLOCK


class Process:
    """A process whose output lines are kept with the second each came."""

    def __init__(self, label: str, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.label = label
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((now(), line.rstrip("\n")))

    def said(self, words: str) -> bool:
        return any(words in line for _, line in self.lines)

    def wait(self) -> int:
        code = self.process.wait()
        self.reader.join(timeout=30)
        return code


def autotune(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def wait_until(condition, what: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.2)


def stalled(study: optuna.Study, folder: Path, owners: set[int]) -> dict[int, int]:
    running = {}
    for trial in study.get_trials(deepcopy=False):
        owner = trial.user_attrs.get("owner", {}).get("pid")
        log = folder / f"trial-{trial.number:04d}" / "worker.log"
        loading = log.exists() and "autotune phase: load" in log.read_text(errors="replace")
        if trial.state.name == "RUNNING" and owner in owners and loading:
            running[trial.number] = owner
    return running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30.0, help="seconds the server stays down")
    parser.add_argument("--patience", type=float, default=10.0, help="--storage-patience of the fourth worker")
    options = parser.parse_args()
    cache = Path(os.environ.get("AUTOTUNE_CACHE_DIR") or default_cache_dir())
    ensure_demo_model(cache)
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    work = Path(tempfile.mkdtemp(prefix="autotune-outage-"))
    (work / "space.yaml").write_text(SPACE)
    server = PostgresServer()
    try:
        run(options, server, work, env, cache)
    finally:
        server.remove()
        shutil.rmtree(work, ignore_errors=True)


def run(options: argparse.Namespace, server: PostgresServer, work: Path, env: dict[str, str], cache: Path) -> None:
    url = server.url.replace("postgresql+psycopg://", "postgresql://")
    name = f"outage-{uuid.uuid4().hex[:8]}"
    created = subprocess.run(autotune("search", "--model", "demo", "--gpu", "cpu", "--study", name, "--storage", url,
                                      "--space", "space.yaml", "--trials", "1", *SMALL),
                             cwd=work, env=env, capture_output=True, text=True)  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    release = work / "release"
    stall = {"0": {"phase": "load", "kind": "stall", "until": str(release)}}
    stalls = {**env, "AUTOTUNE_INJECT_FAULTS": json.dumps(stall)}
    worker = ["worker", "--study", name, "--storage", url, "--device", "cpu"]
    # One trial each: a worker recovers (and stores a result another left) between trials, so none of these takes
    # the fourth worker's kept result before the fresh worker below.
    workers = [Process(f"worker {index}", autotune(*worker, "--trials", "1"), work, stalls) for index in range(3)]
    impatient = Process("worker 3", autotune(*worker, "--trials", "1", "--storage-patience", f"{options.patience:g}s"),
                        work, stalls)  # fmt: skip
    everyone = [*workers, impatient]
    study = optuna.load_study(study_name=name, storage=server.url)
    folder = cache / "studies" / name  # its trial files, in the cache: removed at the end
    owners = {each.process.pid for each in everyone}
    wait_until(lambda: len(stalled(study, folder, owners)) == 4, "four trials measuring")
    measuring = stalled(study, folder, owners)

    stopped = now()
    server.stop()
    release.touch()
    print(f"[{stopped:6.1f}s] server stopped (pg_ctl stop -m fast) while trials {sorted(measuring)} measure")
    wait_until(lambda: now() - stopped >= options.outage, "the outage")
    server.start()
    print(f"[{now():6.1f}s] server started again, {now() - stopped:.1f}s after it stopped")
    codes = {each.label: each.wait() for each in everyone}
    fresh = Process("worker 4 (fresh)", autotune(*worker, "--trials", "1"), work, env)
    codes[fresh.label] = fresh.wait()

    for each in [*everyone, fresh]:
        print(f"\n{each.label} (pid {each.process.pid}), exit status {codes[each.label]}:")
        for second, line in each.lines:
            if any(words in line for words in ("storage", "kept", "autotune:", "worker on study", "#")):
                print(f"  [{second:6.1f}s] {line}")
    summarize(optuna.load_study(study_name=name, storage=server.url), measuring)
    shutil.rmtree(folder, ignore_errors=True)


def summarize(study: optuna.Study, measuring: dict[int, int]) -> None:
    print("\nthe study after:")
    for record in records(study):
        figures = f"{record.metrics['throughput_tok_s']:.1f} tok/s" if record.metrics else record.message[:80]
        during = " (measured during the outage)" if record.number in measuring else ""
        print(f"  #{record.number} {record.state} {record.outcome} {figures} pid {record.pid}{during}")
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    measured = [json.dumps(r.config, sort_keys=True) for r in records(study) if r.launched and r.outcome]
    interrupted = [r.number for r in records(study) if r.interrupted]
    print(f"RUNNING: {states.count('RUNNING')}, WAITING: {states.count('WAITING')}, interrupted: {interrupted}, "
          f"measured: {len(measured)}, distinct configurations: {len(set(measured))}")  # fmt: skip


if __name__ == "__main__":
    main()
