"""Trace files in each format users hold, written here in that format, read into autotune's requests; bad ones refused
in one line naming the request and what to fix."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.traffic import TraceRequest, TrafficRef, read_trace, read_window, turns


def _jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_autotunes_jsonl_schema_reads_every_kind_of_input(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "requests.jsonl",
        [
            {"prompt": "Hello there", "output_tokens": 12, "arrival_s": 1.5},
            {"prompt_ids": [5, 6, 7], "output_tokens": 3, "arrival_s": 2.0, "id": "ignored"},
            {"input_tokens": 700, "hash_ids": [1, 2], "output_tokens": 40, "arrival_s": 2.0},
            {"prompt": "Go on", "reply": "A recorded answer", "arrival_s": 9.25, "conversation": 7},
        ],
    )
    trace = read_trace(path)
    assert (trace.name, trace.format) == ("requests.jsonl", "jsonl")
    assert trace.requests == (
        TraceRequest(output_tokens=12, prompt="Hello there", arrival_s=0.0),  # counted from the first arrival
        TraceRequest(output_tokens=3, prompt_ids=(5, 6, 7), arrival_s=0.5),
        TraceRequest(output_tokens=40, input_tokens=700, hash_ids=(1, 2), arrival_s=0.5),
        TraceRequest(output_tokens=None, prompt="Go on", reply="A recorded answer", arrival_s=7.75, conversation="7"),
    )


def test_mooncakes_jsonl_is_told_by_its_fields(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "mooncake.jsonl",
        [
            {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 49]},
        ],
    )
    trace = read_trace(path)
    assert trace.format == "mooncake"
    first, second = trace.requests
    assert (first.input_tokens, first.output_tokens, first.hash_ids, first.arrival_s) == (6955, 52, (46, 47, 48), 0.0)
    assert second.arrival_s == pytest.approx(3.053)  # milliseconds, from the first


def test_the_azure_traces_csv_with_its_seven_digit_seconds(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerow(["2023-11-16 18:15:46.6805900", "374", "44"])
        writer.writerow(["2023-11-16 18:15:50.9951690", "396", "109"])
    trace = read_trace(path)
    assert trace.format == "azure"
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [(374, 44), (396, 109)]
    assert trace.requests[1].arrival_s == pytest.approx(4.314579)


def test_sharegpt_conversations_become_turns_with_their_history(tmp_path: Path) -> None:
    conversations = [
        {
            "id": "abc",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "What is a cache?"},
                {"from": "gpt", "value": "A store of recent answers."},
                {"from": "human", "value": "And a page?"},
                {"from": "gpt", "value": "A block of it."},
                {"from": "human", "value": "no answer follows this one"},
            ],
        },
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    trace = read_trace(path)
    assert trace.format == "sharegpt"
    assert trace.requests == (
        TraceRequest(
            None, prompt="Be brief.\nWhat is a cache?", reply="A store of recent answers.", conversation="abc"
        ),
        TraceRequest(None, prompt="And a page?", reply="A block of it.", conversation="abc"),
        TraceRequest(None, prompt="Hi", reply="Hello!"),  # one turn: no history to share
    )
    assert turns(list(trace.requests)) == [None, 0, None]


def _bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError) as refused:
        read_trace(path)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("t.jsonl", "", "has no requests; give it at least one"),
        ("t.jsonl", '{"prompt": "a", "output_tokens": 3}\n{"prompt": "b", output_tokens: 3}\n', "line 2: not JSON"),
        ("t.jsonl", '{"prompt": "a"}\n', "line 1: output_tokens is missing"),
        ("t.jsonl", '{"prompt": "a", "input_tokens": 4, "output_tokens": 3}\n', "line 1: a request has one input"),
        ("t.jsonl", '{"output_tokens": 3}\n', "(it has none)"),
        ("t.jsonl", '{"prompt": "a", "output_tokens": 0}\n', "line 1: output_tokens must be a whole number"),
        ("t.jsonl", '{"prompt": "a", "output_tokens": 2.5}\n', "output_tokens must be a whole number of tokens"),
        ("t.jsonl", '{"prompt": "", "output_tokens": 2}\n', "prompt must be non-empty text"),
        ("t.jsonl", '{"prompt_ids": [1, -2], "output_tokens": 2}\n', "prompt_ids must be a non-empty list"),
        ("t.jsonl", '{"prompt": "a", "hash_ids": [1], "output_tokens": 2}\n', "give input_tokens with them"),
        ("t.jsonl", "[1, 2]\n", "a request is a JSON object"),
        (
            "t.jsonl",
            '{"prompt": "a", "output_tokens": 2, "arrival_s": 1}\n{"prompt": "b", "output_tokens": 2}\n',
            "request 2 has no arrival time and others have one",
        ),
        (
            "t.jsonl",
            '{"prompt": "a", "output_tokens": 2, "arrival_s": 5}\n'
            '{"prompt": "b", "output_tokens": 2, "arrival_s": 1}\n',
            "request 2 arrives before request 1; sort the requests by arrival",
        ),
        ("t.jsonl", '{"prompt": "a", "output_tokens": 2, "arrival_s": -1}\n', "arrival_s must be a number, at least 0"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 10}\n', "output_length is missing"),
        ("t.csv", "when,in,out\n1,2,3\n", "has the Azure LLM inference trace's columns"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "line 2: TIMESTAMP 'yesterday'"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3\n", "line 2: 2 fields"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,0\n", "GeneratedTokens must be"),
        ("t.json", '{"conversations": []}', "a .json trace is a list of ShareGPT conversations"),
        ("t.json", '[{"conversations": [{"from": "robot", "value": "x"}]}]', "'robot' is not a role"),
        ("t.json", '[{"conversations": [{"from": "human", "value": ""}]}]', "message 1: empty or missing text"),
        ("t.json", "[{", "not JSON"),
        ("t.txt", "hello", "not a trace autotune reads"),
    ],
)
def test_a_bad_trace_is_refused_in_one_line_naming_what_to_fix(tmp_path: Path, name: str, text: str, said: str):
    message = _bad(tmp_path, name, text)
    assert said in message
    assert str(tmp_path / name) in message


def test_the_window_is_named_by_its_requests_and_kept_once(tmp_path: Path) -> None:
    """Two files with the same first requests are the same traffic (a renamed file); the window is written where
    trials read it only when kept, and read back as it was."""
    records = [{"prompt": f"request {n}", "output_tokens": n + 1} for n in range(5)]
    trace = read_trace(_jsonl(tmp_path / "a.jsonl", records))
    renamed = read_trace(_jsonl(tmp_path / "b.jsonl", [*records[:3], {"prompt": "other", "output_tokens": 9}]))
    window, same = TrafficRef.of(trace, 3), TrafficRef.of(renamed, 3)
    assert window == same and window.file != same.file
    assert TrafficRef.of(trace, 4) != TrafficRef.of(renamed, 4)
    assert (window.requests, window.total) == (3, 5)
    assert window.describe().startswith("the first 3 of 5 requests of a.jsonl (jsonl, sha256 ")
    cache = tmp_path / "cache"
    assert not window.window_path(cache).exists()
    path = window.keep(cache)
    assert read_window(path) == list(trace.requests[:3])
    assert TrafficRef.from_json(window.to_json()) == window
    assert TrafficRef.from_json(window.to_json()).keep(cache) == path  # read from a study: the file is there
    with pytest.raises(FileNotFoundError):
        TrafficRef.from_json(window.to_json()).keep(tmp_path / "another-machine")
