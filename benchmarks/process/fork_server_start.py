"""What starting the fork server costs: the wall time and the CPU time until it says it is ready.

    .venv/bin/python benchmarks/process/fork_server_start.py [--runs 3]

Every search or measure on a CPU starts one (autotune.worker.forkserver), which imports torch and transformers once
for all its trials. The CPU time is read from /proc before the server is killed, so it holds on a busy machine too,
where the wall time does not. Linux only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def start_once() -> tuple[float, float]:
    """(wall seconds, CPU seconds) from starting the server to its ready line."""
    server = subprocess.Popen([sys.executable, "-m", "autotune.worker.forkserver"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        started = time.monotonic()
        ready = server.stdout.readline()
        wall = time.monotonic() - started
        if b'"ready"' not in ready:
            sys.exit(f"the fork server did not start: {ready!r}")
        fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    finally:
        server.kill()
        server.wait()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = [start_once() for _ in range(parser.parse_args().runs)]
    for wall, cpu in runs:
        print(f"ready after {wall:.2f} s wall, {cpu:.2f} s CPU")
    walls, cpus = zip(*runs, strict=True)
    print(f"median: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU ({len(runs)} runs)")


if __name__ == "__main__":
    main()
