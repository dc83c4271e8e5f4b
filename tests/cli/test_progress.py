"""Progress from the first second: a first run on an empty cache says what it does, with elapsed time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from autotune.process import phases
from autotune.process.runner import PhaseWatcher
from tests.conftest import REPO

# The first line may take this much longer than starting Python and importing autotune's command line takes on the
# machine that runs the test (measured just before): what comes between (the flags, then the line) is a fraction of it.
BEYOND_THE_IMPORT_S = 1.5


def _seconds_to_import_the_command_line(env: dict[str, str]) -> float:
    """This machine's own start: Python, then autotune's command line imported (what no progress line can skip)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import autotune.cli.app"], env=env, check=True)
    return time.monotonic() - started


def test_a_first_run_on_an_empty_cache_prints_its_first_progress_line_once_its_command_line_is_imported(tmp_path):
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "empty-cache"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "autotune", "search", "--model", "demo", "--gpu", "cpu", "--trials", "1"]
    allowed = _seconds_to_import_the_command_line(env) + BEYOND_THE_IMPORT_S
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
        seconds = time.monotonic() - started
        lines = [first]
        while "preparing: " not in lines[-1] and process.poll() is None:  # then preparation's own phases
            lines.append(process.stdout.readline().decode())
    finally:
        process.kill()
        process.wait()
    print(f"first progress line after {seconds:.2f}s (allowed {allowed:.2f}s): {first.strip()}")
    assert seconds < allowed, f"the first line came after {seconds:.2f}s, {allowed:.2f}s allowed: {first!r}"
    assert first.startswith("[") and "s] loading autotune's libraries" in first
    assert lines[-1].strip().endswith("preparing: " + phases.label("spawn"))


def test_phases_announced_in_a_growing_log_are_reported_once_each(tmp_path):
    log = tmp_path / "worker.log"
    seen: list[str] = []
    watcher = PhaseWatcher(log, seen.append)
    watcher.poll()  # no log yet
    log.write_text("Loading weights\n" + phases.line("load", 0.1) + phases.line("warmup", 2.5)[:10])
    watcher.poll()
    assert seen == ["load"]
    with log.open("a") as more:
        more.write(phases.line("warmup", 2.5)[10:] + "some warning\n" + phases.line("measure", 9.0))
    watcher.poll()
    watcher.poll()
    assert seen == ["load", "warmup", "measure"]
    assert phases.label("warmup", compiles=True) == "warming up and compiling"
