"""A request trace as autotune replays it: each request's own input and output length, and where the trace has them
its arrival time and conversation; the window of it a study replays, kept once on this machine and named by its
checksum (`TrafficRef`, part of the workload a study is bound to).

The normalized form is the documented JSONL schema itself (docs/traffic.md): one request per line,

    {"prompt": "text"} or {"prompt_ids": [1, 2, ...]} or {"input_tokens": 480, "hash_ids": [7, 8]}
    "output_tokens": 64           tokens to generate (absent only where "reply" gives them)
    "reply": "text"               the recorded answer: its tokens are the output length where output_tokens is absent,
                                  and the conversation's next turn begins with it
    "arrival_s": 0.25             seconds after the trace's first request
    "conversation": "c7"          turns of one conversation, in order: a turn's input is the earlier turns' inputs and
                                  replies, then its own

Token ids and lengths of text need the model's tokenizer: the trial worker makes them (autotune/worker/traffic.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 512  # tokens per hash id (Mooncake's block size): requests with an equal id share those tokens
DEFAULT_WINDOW = 64  # the requests of a trace each trial replays, from its first (--traffic-requests)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, before tokenization: its own input (text, token ids, or a count of tokens from the
    bundled corpus), its output length, and where the trace says them, its arrival and conversation."""

    output_tokens: int | None  # None: the tokens of `reply`
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    input_tokens: int | None = None
    hash_ids: tuple[int, ...] = ()
    reply: str | None = None
    arrival_s: float | None = None
    conversation: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Its line of the normalized trace: the schema's fields it has."""
        data: dict[str, Any] = {}
        if self.prompt is not None:
            data["prompt"] = self.prompt
        if self.prompt_ids is not None:
            data["prompt_ids"] = list(self.prompt_ids)
        if self.input_tokens is not None:
            data["input_tokens"] = self.input_tokens
        if self.hash_ids:
            data["hash_ids"] = list(self.hash_ids)
        if self.output_tokens is not None:
            data["output_tokens"] = self.output_tokens
        for name in ("reply", "arrival_s", "conversation"):
            if (value := getattr(self, name)) is not None:
                data[name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TraceRequest:
        """From a line of the normalized trace (checked already: autotune/traffic/formats.py reads users' files)."""
        ids, hashes = data.get("prompt_ids"), data.get("hash_ids")
        return cls(
            output_tokens=data.get("output_tokens"),
            prompt=data.get("prompt"),
            prompt_ids=tuple(ids) if ids is not None else None,
            input_tokens=data.get("input_tokens"),
            hash_ids=tuple(hashes or ()),
            reply=data.get("reply"),
            arrival_s=data.get("arrival_s"),
            conversation=data.get("conversation"),
        )


@dataclass(frozen=True)
class Trace:
    """A trace file read: its requests in order, the format it was written in, and its name."""

    name: str
    format: str
    requests: tuple[TraceRequest, ...]

    def window(self, count: int | None) -> tuple[TraceRequest, ...]:
        """Its first `count` requests (None: all): what each trial replays. A conversation's later turns come after
        its earlier ones, so a window never holds a turn without the turns before it."""
        return self.requests if count is None else self.requests[:count]


@dataclass(frozen=True, eq=False)
class TrafficRef:
    """The trace a study replays, as the study stores it: the file's name and format, how many of its requests each
    trial replays (from its first) and how many it holds, and the checksum of those requests, normalized. Two traces
    are the same traffic when their checksums are (the file may have been renamed or moved).

    Read from a file in this process, it carries the replayed requests' normalized lines until `keep` writes them to
    this machine's cache (a dry run or refused input writes nothing); read from a study, it carries none."""

    file: str
    format: str
    requests: int
    total: int
    sha256: str
    timed: bool = False  # its requests have arrival times
    shared: bool = False  # some of its requests begin with another's input (a conversation's turns, shared blocks)
    lines: bytes | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrafficRef) and other.sha256 == self.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    @classmethod
    def of(cls, trace: Trace, count: int | None) -> TrafficRef:
        """The first `count` requests of `trace` (None: all), normalized and named by their checksum."""
        window = trace.window(count)
        lines = normalized_lines(window)
        timed = all(request.arrival_s is not None for request in window)
        sha = hashlib.sha256(lines).hexdigest()
        return cls(
            trace.name, trace.format, len(window), len(trace.requests), sha, timed, shares_prefixes(window), lines
        )

    def carried(self) -> list[TraceRequest] | None:
        """The replayed requests this reference carries (read from a file in this process); None: read from a study."""
        return (
            None
            if self.lines is None
            else [TraceRequest.from_json(json.loads(line)) for line in self.lines.splitlines()]
        )

    def keep(self, cache_dir: Path) -> Path:
        """The replayed requests in this machine's cache, written there from the lines this reference carries where
        they are not there yet."""
        path = self.window_path(cache_dir)
        if not path.exists():
            if self.lines is None:
                raise FileNotFoundError(f"the requests of {self.describe()} are not in {path.parent}")
            write_atomically(path, self.lines)
        return path

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "requests": self.requests,
            "total": self.total,
            "sha256": self.sha256,
            "timed": self.timed,
            "shared": self.shared,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrafficRef:
        requests, total = int(data["requests"]), int(data["total"])
        timed, shared = bool(data.get("timed")), bool(data.get("shared"))
        return cls(data["file"], data["format"], requests, total, data["sha256"], timed, shared)

    def describe(self) -> str:
        """ "the first 64 of 1000 requests of azure-code.csv (azure, sha256 1a2b3c4d)"."""
        which = f"the {self.requests}" if self.requests == self.total else f"the first {self.requests} of {self.total}"
        plural = "requests" if self.total != 1 else "request"
        return f"{which} {plural} of {self.file} ({self.format}, sha256 {self.sha256[:8]})"

    def window_path(self, cache_dir: Path) -> Path:
        """Where this machine keeps the replayed requests, normalized."""
        return window_path(cache_dir, self.sha256)


def window_path(cache_dir: Path, sha256: str) -> Path:
    return cache_dir / "traffic" / f"{sha256}.jsonl"


def normalized_lines(requests: Iterable[TraceRequest]) -> bytes:
    """The requests as the normalized trace's lines (keys sorted, so that equal requests give equal bytes)."""
    lines = (json.dumps(request.to_json(), sort_keys=True, separators=(",", ":")) for request in requests)
    return ("\n".join(lines) + "\n").encode()


def read_window(path: Path) -> list[TraceRequest]:
    """The normalized requests of a window this machine keeps."""
    return [TraceRequest.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def turns(requests: Sequence[TraceRequest]) -> list[int | None]:
    """For each request, the index of the same conversation's turn before it (None: its first turn, or none)."""
    last: dict[str, int] = {}
    previous: list[int | None] = []
    for index, request in enumerate(requests):
        previous.append(last.get(request.conversation) if request.conversation is not None else None)
        if request.conversation is not None:
            last[request.conversation] = index
    return previous


def counted_lengths(requests: Sequence[TraceRequest]) -> list[tuple[int, int] | None]:
    """Each request's input and output length in tokens where the trace says them without a tokenizer (counts and
    token ids, a conversation's earlier turns included); None where text must be tokenized first."""
    lengths: list[tuple[int, int] | None] = []
    for request, previous in zip(requests, turns(requests), strict=True):
        own = request.input_tokens if request.prompt_ids is None else len(request.prompt_ids)
        before = (0, 0) if previous is None else lengths[previous]
        known = own is not None and request.output_tokens is not None and before is not None
        lengths.append((sum(before) + own, request.output_tokens) if known else None)  # type: ignore[operator,arg-type]
    return lengths


def shares_prefixes(requests: Sequence[TraceRequest]) -> bool:
    """Whether some request begins with another's input: a conversation's later turn, or a leading block (hash id)
    an earlier request began with."""
    if any(previous is not None for previous in turns(requests)):
        return True
    leading = [request.hash_ids[0] for request in requests if request.hash_ids]
    return len(leading) != len(set(leading))
