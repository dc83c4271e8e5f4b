"""Real PostgreSQL servers for the tests: initdb in a temporary folder, listening on 127.0.0.1 only.

Debian's `postgresql` package provides the binaries (.ci/run installs it). The server refuses to run
as root, so as root it runs as the `postgres` user the package creates.

`postgres_url` is one server for the whole session. A test that stops its server, restarts it or cuts its
connections takes a `postgres_server` of its own (a few seconds to create), so no other test sees the outage.
"""

from __future__ import annotations

import os
import random
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
    """A port free now, below the range the system hands out to outgoing connections and to bind(0): a server stopped
    and started again on it (a test's outage) must find it free, and a port of that range may be taken meanwhile by
    any connection or server of this machine."""
    low = _ephemeral_ports()[0]
    for _ in range(100):
        port = random.randrange(LOWEST_PORT, low) if low > LOWEST_PORT else 0
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise RuntimeError(f"no free port found between {LOWEST_PORT} and {low}")


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return (32768, 60999)  # Linux's default
    return int(low), int(high)


LOWEST_PORT = 20000


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    """One PostgreSQL server with a database `studies`, which a test can stop, start again, and cut off."""

    def __init__(self) -> None:
        initdb, self.pg_ctl, self.psql = _binary("initdb"), _binary("pg_ctl"), _binary("psql")
        if initdb is None or self.pg_ctl is None:
            pytest.skip("PostgreSQL is not installed (Debian package postgresql; .ci/run installs it)")
        self.root = Path(tempfile.mkdtemp(prefix="autotune-postgres-"))  # not under pytest's root-only folder
        self.data = self.root / "data"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        subprocess.run(_as_server_user([initdb, "-D", str(self.data), "--auth=trust", "-U", "autotune", *NO_LOCALE]),
                       **_CHECKED)  # fmt: skip
        self._start_on_a_free_port()
        subprocess.run([_binary("createdb") or "createdb", *self._address(), "-U", "autotune", "studies"], **_CHECKED)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://autotune@127.0.0.1:{self.port}/studies"

    def start(self, *, standby: bool = False) -> None:
        """Start the server and wait until it accepts connections; or, as a `standby`, until it runs: a standby
        that refuses connections until it is promoted, as a replica a failover is promoting does."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        if standby:
            (self.data / "standby.signal").touch()
            options += " -c hot_standby=off"
        log = str(self.root / "log")
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-o", options, "-l", log, "-w", "start"]),
                       **_CHECKED)  # fmt: skip

    def _start_on_a_free_port(self) -> None:
        """Start on a port free a moment before; another process may bind it in that moment: then another one."""
        for attempt in range(PORT_ATTEMPTS):
            self.port = _free_port()
            try:
                self.start()
                return
            except subprocess.CalledProcessError:
                log = (self.root / "log").read_text(errors="replace") if (self.root / "log").exists() else ""
                if "could not bind" not in log or attempt == PORT_ATTEMPTS - 1:
                    raise

    def promote(self) -> None:
        """Promote the standby `start(standby=True)` started: it accepts connections from then on."""
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-w", "promote"]), **_CHECKED)

    def stop(self) -> None:
        """Stop it as maintenance does (`pg_ctl stop -m fast`): open transactions roll back, connections close."""
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"]), **_CHECKED)

    def sql(self, statement: str) -> str:
        """Run one statement as the superuser, with psql; its output, unaligned."""
        command = [self.psql or "psql", *self._address(), "-U", "autotune", "-d", "studies", "-At", "-c", statement]
        return subprocess.run(command, **_CHECKED).stdout.strip()

    def remove(self) -> None:
        subprocess.run(_as_server_user([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True)  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)

    def _address(self) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.port)]


_CHECKED = dict(check=True, capture_output=True, text=True)
# initdb takes its locale from LANG and LC_*, and refuses one the machine has not generated (LANG=en_US.UTF-8 where
# only C.UTF-8 exists): the C locale, in UTF-8, exists everywhere.
NO_LOCALE = ("--no-locale", "--encoding=UTF8")
PORT_ATTEMPTS = 3


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    server = PostgresServer()
    try:
        yield server.url
    finally:
        server.remove()


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()
