"""Parsing and formatting of durations and sizes, and a message cut to one line."""

import re

from autotune.errors import UserError

_DURATION = re.compile(r"^\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
_SECONDS_PER_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def parse_duration(text: str, flag: str = "--budget") -> float:
    """'90s', '30m', '2h', '1.5h' or a bare number of seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UserError(f"{flag} {text!r} is not a duration: write it like 90s, 30m or 2h")
    seconds = float(match["value"]) * _SECONDS_PER_UNIT[(match["unit"] or "s").lower()]
    if seconds <= 0:
        raise UserError(f"{flag} must be longer than zero, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def format_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


def first_line(message: str, limit: int) -> str:
    """The message's first line, cut to `limit` characters ending in "..." where it was longer."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."
