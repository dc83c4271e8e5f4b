"""Headless Chromium for report tests: the DOM after scripts ran, and what the page wrote to its console."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
]
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)$")
_NETWORK = re.compile(r"(net::ERR_|Failed to load resource)")


@dataclass(frozen=True)
class Page:
    dom: str
    console: list[str]  # every message the page logged (errors, warnings, uncaught exceptions)
    network_errors: list[str]


def open_page(chromium: str, page: Path, profile: Path, screenshot: Path | None = None) -> Page:
    action = [f"--screenshot={screenshot}", "--window-size=1300,2600"] if screenshot else ["--dump-dom"]
    completed = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", *action, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = completed.stderr.splitlines()
    console = [match.group(1) for line in lines if (match := _CONSOLE.search(line))]
    network = [line for line in lines if _NETWORK.search(line)]
    return Page(dom=completed.stdout, console=console, network_errors=network)
