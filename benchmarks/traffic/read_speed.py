"""How long reading a request trace takes, in each format users hold, and what a study keeps of it.

    python benchmarks/traffic/read_speed.py [--requests 100000] [--repeats 3]
    python benchmarks/traffic/read_speed.py --study NAME --storage sqlite:///studies/NAME.db [--artifacts DIR]

The first form writes a trace of that many requests in each format (seeded: long-tailed lengths, bursty arrivals,
every tenth request a conversation's turn; the ShareGPT file as conversations of two turns), then times what
`--traffic FILE` does before anything runs: the file read and checked (`read_trace`), and the window each trial
replays normalized and named by its checksum (`TrafficRef.of`, 64 requests). It prints the best of `--repeats` runs.

The second form says what a stored study keeps of its trace: the window stored once as an artifact of the study, and
the most any trial's own attributes hold, which never include the requests.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # autotune, run as a script

from autotune.traffic import DEFAULT_WINDOW, TrafficRef, read_trace

SEED = 68


def _draws(count: int) -> list[tuple[int, int, float]]:
    """(input tokens, output tokens, arrival s) of each request: long-tailed lengths, Gamma inter-arrivals."""
    rng = random.Random(SEED)
    clock, draws = 0.0, []
    for _ in range(count):
        draws.append((int(rng.lognormvariate(6.0, 1.0)) + 1, int(rng.lognormvariate(4.5, 1.0)) + 1, clock))
        clock += rng.gammavariate(0.5, 0.5)
    return draws


def write_traces(folder: Path, count: int) -> dict[str, Path]:
    draws = _draws(count)
    paths = {
        "jsonl": folder / "requests.jsonl",
        "mooncake": folder / "mooncake.jsonl",
        "azure": folder / "azure.csv",
        "sharegpt": folder / "sharegpt.json",
    }
    with paths["jsonl"].open("w") as file:
        for n, (tokens_in, tokens_out, at) in enumerate(draws):
            record = {"input_tokens": tokens_in, "output_tokens": tokens_out, "arrival_s": round(at, 3)}
            file.write(json.dumps(record | ({"conversation": f"c{n // 10}"} if n % 10 == 9 else {})) + "\n")
    with paths["mooncake"].open("w") as file:
        for n, (tokens_in, tokens_out, at) in enumerate(draws):
            blocks = list(range(n % 50, n % 50 + tokens_in // 512 + 1))  # requests of one residue share blocks
            record = {"timestamp": int(at * 1000), "input_length": tokens_in, "output_length": tokens_out}
            file.write(json.dumps(record | {"hash_ids": blocks}) + "\n")
    start = datetime(2023, 11, 16, 18, 15, 46)
    with paths["azure"].open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for tokens_in, tokens_out, at in draws:
            stamp = start + timedelta(seconds=at)
            writer.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", tokens_in, tokens_out])
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    conversations = [
        {
            "id": f"c{n}",
            "conversations": [
                {"from": "human" if turn % 2 == 0 else "gpt", "value": " ".join(words[: 3 + (n + turn) % 6])}
                for turn in range(4)
            ],
        }
        for n in range(count // 2)  # two turns each: `count` requests
    ]
    paths["sharegpt"].write_text(json.dumps(conversations))
    return paths


def time_reading(path: Path, repeats: int) -> tuple[float, float, int]:
    """Best seconds of read_trace, best seconds of the window's reference, and the requests read."""
    reads, windows, requests = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        trace = read_trace(path)
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        TrafficRef.of(trace, DEFAULT_WINDOW)
        windows.append(time.perf_counter() - started)
        requests = len(trace.requests)
    return min(reads), min(windows), requests


def study_copies(study_name: str, storage: str, artifacts: str | None) -> None:
    import optuna
    from optuna.artifacts import get_all_artifact_meta

    from autotune.study import stored_settings

    study = optuna.load_study(study_name=study_name, storage=storage)
    traffic = stored_settings(study).workload.traffic
    if traffic is None:
        print(f"study {study_name} replays no trace")
        return
    name = f"{traffic.sha256}.jsonl"
    stored = [meta for meta in get_all_artifact_meta(study) if meta.filename == name]
    trials = study.get_trials(deepcopy=False)
    metas = [get_all_artifact_meta(trial, storage=study._storage) for trial in trials]
    in_trials = sum(1 for trial_metas in metas for meta in trial_metas if meta.filename == name)
    largest = max((len(json.dumps(trial.user_attrs)) for trial in trials), default=0)
    window = Path(artifacts or "") / stored[0].artifact_id if stored and artifacts else None
    size = f"{window.stat().st_size} bytes" if window and window.exists() else "its size where --artifacts is given"
    print(f"study {study_name}: {traffic.describe()}")
    copies = f"{len(stored)} copy of the window ({size})"
    print(f"  stored with the study: {copies}; with its {len(trials)} trials: {in_trials}")
    print(f"  the most a trial's own attributes hold: {largest} bytes of JSON (figures, plan, details; no request)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--study")
    parser.add_argument("--storage")
    parser.add_argument("--artifacts")
    args = parser.parse_args()
    if args.study:
        study_copies(args.study, args.storage, args.artifacts)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        paths = write_traces(Path(folder), args.requests)
        print(f"{'format':<10} {'file':>10} {'requests':>9} {'read and checked':>17} {'window of 64':>13}")
        for name, path in paths.items():
            read_s, window_s, requests = time_reading(path, args.repeats)
            size = f"{path.stat().st_size / 1e6:.1f} MB"
            print(f"{name:<10} {size:>10} {requests:>9} {read_s:>15.2f} s {window_s * 1000:>10.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
