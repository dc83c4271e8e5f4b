"""Trace files in the formats users hold, read into autotune's requests (autotune/traffic/requests.py):

- autotune's JSONL (`.jsonl`), one request per line, the schema requests.py documents;
- Mooncake's JSONL (`.jsonl` whose lines have `input_length`): `timestamp` (ms), `input_length`, `output_length`,
  `hash_ids` (blocks of 512 tokens: equal ids are shared prefixes);
- the Azure LLM inference traces (`.csv`): `TIMESTAMP,ContextTokens,GeneratedTokens`;
- ShareGPT conversations (`.json`): a list of `{"conversations": [{"from": "human", "value": ...}, ...]}` (or
  `{"messages": [{"role": "user", "content": ...}, ...]}`); each user turn with the answer after it is a request
  whose output length is the answer's tokens, and whose input begins with the turns before it.

Anything else, or a request that cannot be replayed, is bad input: one line naming the file, the request and what to
fix (a UserError).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.traffic.requests import Trace, TraceRequest

FORMATS = ("jsonl", "mooncake", "azure", "sharegpt")
FORMS = (
    "a .jsonl of requests (autotune's schema, or Mooncake's timestamp/input_length/output_length/hash_ids), the .csv "
    "of an Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens), or ShareGPT conversations (.json)"
)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM_ROLES = frozenset({"system"})


def read_trace(path: Path) -> Trace:
    """The trace in `path`, its format told by its name and first request; a UserError for anything unreadable."""
    reader = _reader_for(path)
    try:
        requests = tuple(reader(path))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read traffic file {path}: {error}; pass --traffic with {FORMS}") from None
    if not requests:
        raise UserError(f"traffic file {path} has no requests; give it at least one")
    return Trace(path.name, _format_name(reader), _from_first_arrival(path, requests))


def _reader_for(path: Path) -> Callable[[Path], Iterator[TraceRequest]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _azure
    if suffix == ".json":
        return _sharegpt
    if suffix == ".jsonl":
        return _mooncake if _first_record_has(path, "input_length") else _jsonl
    raise UserError(f"traffic file {path}: not a trace autotune reads; give {FORMS}")


def _format_name(reader: Callable[[Path], Iterator[TraceRequest]]) -> str:
    return {_jsonl: "jsonl", _mooncake: "mooncake", _azure: "azure", _sharegpt: "sharegpt"}[reader]


def _first_record_has(path: Path, key: str) -> bool:
    try:
        with path.open() as file:
            first = next((line for line in file if line.strip()), "")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read traffic file {path}: {error}; pass --traffic with {FORMS}") from None
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False  # the JSONL reader says which line is not JSON
    return isinstance(record, dict) and key in record


# ------------------------------------------------------------------------------------------- JSONL


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-empty line."""
    with path.open() as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(
                    f"traffic file {path}, line {number}: not JSON ({error.msg}); one request per line"
                ) from None
            if not isinstance(record, dict):
                raise UserError(f"traffic file {path}, line {number}: a request is a JSON object, not {record!r:.40}")
            yield number, record


def _jsonl(path: Path) -> Iterator[TraceRequest]:
    for number, record in _records(path):
        where = f"traffic file {path}, line {number}"
        yield TraceRequest(
            output_tokens=_output_tokens(record, where),
            prompt=_text(record, "prompt", where),
            prompt_ids=_ids(record, where),
            input_tokens=_count(record, "input_tokens", where) if "input_tokens" in record else None,
            hash_ids=_hash_ids(record, "hash_ids", where),
            reply=_text(record, "reply", where),
            arrival_s=_arrival(record, "arrival_s", 1.0, where),
            conversation=_conversation(record, where),
        )
        _one_input(record, where)


def _one_input(record: Mapping[str, Any], where: str) -> None:
    given = [key for key in ("prompt", "prompt_ids", "input_tokens") if key in record]
    if len(given) != 1:
        said = "none" if not given else " and ".join(given)
        raise UserError(f"{where}: a request has one input, prompt, prompt_ids or input_tokens (it has {said})")
    if "hash_ids" in record and given != ["input_tokens"]:
        raise UserError(f"{where}: hash_ids name blocks of input_tokens; give input_tokens with them")


def _output_tokens(record: Mapping[str, Any], where: str) -> int | None:
    if "output_tokens" in record:
        return _count(record, "output_tokens", where)
    if isinstance(record.get("reply"), str) and record["reply"]:
        return None  # the reply's tokens
    raise UserError(f"{where}: output_tokens is missing: give the tokens to generate (or the recorded reply)")


def _mooncake(path: Path) -> Iterator[TraceRequest]:
    for number, record in _records(path):
        where = f"traffic file {path}, line {number}"
        missing = [key for key in ("timestamp", "input_length", "output_length") if key not in record]
        if missing:
            raise UserError(f"{where}: a Mooncake request has timestamp, input_length and output_length ({missing[0]} "
                            "is missing)")  # fmt: skip
        yield TraceRequest(
            output_tokens=_count(record, "output_length", where),
            input_tokens=_count(record, "input_length", where),
            hash_ids=_hash_ids(record, "hash_ids", where),
            arrival_s=_arrival(record, "timestamp", 1e-3, where),
        )


# --------------------------------------------------------------------------------------------- CSV


def _azure(path: Path) -> Iterator[TraceRequest]:
    with path.open(newline="") as file:
        rows = csv.reader(file)
        header = [name.strip() for name in next(rows, [])]
        if any(column not in header for column in AZURE_COLUMNS):
            raise UserError(
                f"traffic file {path}: a .csv trace has the Azure LLM inference trace's columns "
                f"{','.join(AZURE_COLUMNS)} (its header is {','.join(header) or 'empty'})"
            )
        at, context, generated = (header.index(column) for column in AZURE_COLUMNS)
        first: datetime | None = None
        for number, row in enumerate(rows, 2):
            if not row:
                continue
            where = f"traffic file {path}, line {number}"
            if len(row) < len(header):
                raise UserError(f"{where}: {len(row)} fields, the header names {len(header)}")
            stamp = _timestamp(row[at], where)
            first = first or stamp
            fields = {"ContextTokens": row[context], "GeneratedTokens": row[generated]}
            yield TraceRequest(
                output_tokens=_count(fields, "GeneratedTokens", where),
                input_tokens=_count(fields, "ContextTokens", where),
                arrival_s=(stamp - first).total_seconds(),
            )


def _timestamp(text: str, where: str) -> datetime:
    """ "2023-11-16 18:15:46.6805900": Azure's traces give seven digits of a second, which datetime reads six of."""
    whole, _, fraction = text.strip().partition(".")
    try:
        stamp = datetime.fromisoformat(whole)
        return stamp.replace(microsecond=int((fraction + "000000")[:6])) if fraction else stamp
    except ValueError:
        raise UserError(f"{where}: TIMESTAMP {text!r} is not a date and time like 2023-11-16 18:15:46.680") from None


# ---------------------------------------------------------------------------------------- ShareGPT


def _sharegpt(path: Path) -> Iterator[TraceRequest]:
    try:
        conversations = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"traffic file {path}: not JSON ({error.msg} at line {error.lineno}); a .json trace is a list "
                        "of ShareGPT conversations") from None  # fmt: skip
    if not isinstance(conversations, list):
        raise UserError(f"traffic file {path}: a .json trace is a list of ShareGPT conversations, not a "
                        f"{type(conversations).__name__}")  # fmt: skip
    for number, conversation in enumerate(conversations, 1):
        yield from _conversation_requests(path, number, conversation)


def _conversation_requests(path: Path, number: int, conversation: Any) -> Iterator[TraceRequest]:
    where = f"traffic file {path}, conversation {number}"
    messages = _messages(conversation, where)
    pairs = [(index, message) for index, message in enumerate(messages)]
    asked = [(index, text) for index, (role, text) in pairs if role == "user"]
    answered = {index - 1: text for index, (role, text) in pairs if role == "assistant" and index > 0}
    system = "\n".join(text for role, text in messages if role == "system")
    turns = [(index, text, answered[index]) for index, text in asked if index in answered]
    name = str(conversation.get("id", number)) if len(turns) > 1 else None
    for turn, (_, text, reply) in enumerate(turns):
        prompt = f"{system}\n{text}" if system and turn == 0 else text
        yield TraceRequest(output_tokens=None, prompt=prompt, reply=reply, conversation=name)


def _messages(conversation: Any, where: str) -> list[tuple[str, str]]:
    """(role: user, assistant or system; text) of each message, consecutive messages of one role joined."""
    if not isinstance(conversation, dict) or not isinstance(
        conversation.get("conversations", conversation.get("messages")), list
    ):
        raise UserError(f'{where}: a conversation is {{"conversations": [{{"from": "human", "value": "..."}}, ...]}}')
    raw = conversation.get("conversations", conversation.get("messages"))
    messages: list[tuple[str, str]] = []
    for turn, message in enumerate(raw, 1):
        if not isinstance(message, dict):
            raise UserError(
                f"{where}, message {turn}: a message is an object with from and value (or role and content)"
            )
        role = _role(str(message.get("from", message.get("role", ""))).lower(), f"{where}, message {turn}")
        text = message.get("value", message.get("content"))
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{where}, message {turn}: empty or missing text; drop the conversation or give it text")
        if messages and messages[-1][0] == role:
            messages[-1] = (role, f"{messages[-1][1]}\n{text}")
        else:
            messages.append((role, text))
    return messages


def _role(name: str, where: str) -> str:
    for role, names in (("user", USER_ROLES), ("assistant", ASSISTANT_ROLES), ("system", SYSTEM_ROLES)):
        if name in names:
            return role
    raise UserError(f"{where}: {name!r} is not a role autotune knows: human or user, gpt or assistant, system")


# ------------------------------------------------------------------------------------------ fields


def _count(record: Mapping[str, Any], key: str, where: str) -> int:
    """A whole number of tokens, at least 1 (a CSV's text too)."""
    value = record.get(key)
    if isinstance(value, str):
        value = int(value) if value.strip().isdigit() else value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{where}: {key} must be a whole number of tokens, at least 1 (it is {value!r:.40}); "
                        "drop the request or fix it")  # fmt: skip
    return value


def _text(record: Mapping[str, Any], key: str, where: str) -> str | None:
    if key not in record:
        return None
    value = record[key]
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: {key} must be non-empty text")
    return value


def _ids(record: Mapping[str, Any], where: str) -> tuple[int, ...] | None:
    if "prompt_ids" not in record:
        return None
    value = record["prompt_ids"]
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and i >= 0 for i in value):
        raise UserError(f"{where}: prompt_ids must be a non-empty list of token ids (whole numbers from 0)")
    return tuple(value)


def _hash_ids(record: Mapping[str, Any], key: str, where: str) -> tuple[int, ...]:
    value = record.get(key, [])
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise UserError(f"{where}: {key} must be a list of whole numbers (the ids of shared blocks)")
    return tuple(value)


def _arrival(record: Mapping[str, Any], key: str, seconds_per_unit: float, where: str) -> float | None:
    if key not in record:
        return None
    value = record[key]
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise UserError(f"{where}: {key} must be a number, at least 0 (it is {value!r:.40})")
    return float(value) * seconds_per_unit


def _conversation(record: Mapping[str, Any], where: str) -> str | None:
    value = record.get("conversation")
    if value is None:
        return None
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise UserError(f"{where}: conversation must be an id (text or a whole number)")
    return str(value)


def _from_first_arrival(path: Path, requests: tuple[TraceRequest, ...]) -> tuple[TraceRequest, ...]:
    """The requests with their arrivals counted from the first request's; a UserError unless every request has one
    or none does, in order."""
    timed = [request.arrival_s is not None for request in requests]
    if any(timed) and not all(timed):
        untimed = timed.index(False) + 1
        raise UserError(f"traffic file {path}: request {untimed} has no arrival time and others have one; give "
                        "every request one, or none")  # fmt: skip
    if not any(timed):
        return requests
    arrivals = [float(request.arrival_s or 0.0) for request in requests]
    for number, (earlier, later) in enumerate(itertools.pairwise(arrivals), 2):
        if later < earlier:
            raise UserError(f"traffic file {path}: request {number} arrives before request {number - 1}; sort the "
                            "requests by arrival")  # fmt: skip
    first = arrivals[0]
    return (
        requests
        if first == 0
        else tuple(replace(r, arrival_s=a - first) for r, a in zip(requests, arrivals, strict=True))
    )
