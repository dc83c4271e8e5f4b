"""A real PostgreSQL server for the tests: initdb in a temporary folder, listening on 127.0.0.1 only.

Debian's `postgresql` package provides the binaries (.ci/run installs it). The server refuses to run
as root, so as root it runs as the `postgres` user the package creates.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL is not installed (Debian package postgresql; .ci/run installs it)")
    root = Path(tempfile.mkdtemp(prefix="autotune-postgres-"))  # not under pytest's root-only folder
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = _free_port()
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run(_as_server_user([initdb, "-D", str(data), "--auth=trust", "-U", "autotune"]), **run)
    options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off"
    subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]),
                   **run)  # fmt: skip
    try:
        subprocess.run([_binary("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "autotune",
                        "studies"], **run)  # fmt: skip
        yield f"postgresql+psycopg://autotune@127.0.0.1:{port}/studies"
    finally:
        subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
