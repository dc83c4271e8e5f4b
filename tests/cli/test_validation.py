"""Everything checkable is checked before work starts: one line, exit status 2, nothing written anywhere.

Each case runs the CLI's own entry point in this process (tests/conftest.py: run_main), in an empty folder, with a
cache folder of its own (`bare_cli_env`); afterwards that folder is still empty, the cache folder was not created, and
the place the bad flag pointed at is untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_main

DEMO = ["--model", "demo", "--gpu", "cpu", "--trials", "1"]
NO_GPU = "cuda:63"  # no machine here has 64 GPUs


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    """An empty working folder and a folder of things bad flags point at (a file, a non-database)."""
    cwd, things = tmp_path / "cwd", tmp_path / "things"
    cwd.mkdir()
    things.mkdir()
    (things / "a-file").write_text("not a folder\n")
    (things / "not-a-database.db").write_text("hello\n")
    return cwd, things


CASES = [
    (["search", *DEMO, "--device", NO_GPU], "--device cuda:63: no such CUDA GPU here"),
    (["search", *DEMO, "--device", "cuda:x"], "--device 'cuda:x' is not a device"),
    (["search", *DEMO, "--storage", "sqlite:///{things}/a-file/s.db"], "a-file is not a folder"),
    (["search", *DEMO, "--storage", "sqlite:///{things}"], "is a directory; name a database file"),
    (["search", *DEMO, "--storage", "sqlite:////proc/autotune/s.db"], "cannot create /proc/autotune/s.db"),
    (["search", *DEMO, "--storage", "sqlite:///{things}/not-a-database.db"], "file is not a database"),
    (["search", *DEMO, "--storage", "postgresql+psycopg://u:pw@127.0.0.1:no-port/x"], "cannot open storage"),
    (["search", *DEMO, "--report", "{things}"], "is a directory; name a file"),
    (["search", *DEMO, "--report", "{things}/a-file/r.html"], "a-file is not a folder"),
    (["search", *DEMO, "--report", "/proc/autotune/r.html"], "--report /proc/autotune/r.html: cannot write there"),
    (["search", *DEMO, "--study", "a/b"], "--study 'a/b' cannot name a file"),
    (["search", *DEMO, "--study", ""], "--study must not be empty"),
    (["search", *DEMO, "--study", "../up"], "cannot name a file"),
    (["search", *DEMO, "--revision", "v2"], "--revision v2 applies to hub models only"),
    (["search", *DEMO, "--input-len", "500"], "500 + --output-len 64 = 564 tokens, but the model has 512 positions"),
    (["search", *DEMO, "--output-len", "600"], "lower --input-len or --output-len to fit 512"),
    (["search", *DEMO, "--prompts", "{things}"], "cannot read prompts file"),
    (["search", *DEMO, "--prompts", "{things}/missing.jsonl"], "cannot read prompts file"),
    (["search", *DEMO, "--workload", "chat"], "--workload 'chat' is not a workload"),
    (["search", *DEMO, "--batch-size", "0-8"], "--batch-size '0-8': batch sizes go from 1 to 4096"),
    (
        ["search", *DEMO, "--workload", "latency", "--batch-size", "1-8"],
        "batch sizes are searched under --workload thr",
    ),
    (
        ["search", *DEMO, "--workload", "latency", "--slo", "itl_p95<=5ms"],
        "--slo applies only to --workload throughput",
    ),
    (["search", *DEMO, "--workload", "serve", "--load", "rate=8-2"], "a range is its lowest and highest level"),
    (["search", *DEMO, "--workload", "serve", "--slo-share", "120%"], "--slo-share '120%' must be above 0%"),
    (
        ["search", *DEMO, "--workload", "serve", "--min-seconds", "1"],
        "--min-seconds applies only to --workload throughput or latency",
    ),
    (["search", *DEMO, "--min-seconds", "-1"], "--min-seconds"),
    (["search", *DEMO, "--price", "-1"], "--price"),
    (["search", *DEMO, "--trial-timeout", "0s"], "--trial-timeout must be longer than zero"),
    (["search", *DEMO, "--seed", "x"], "--seed"),
    (["search", *DEMO, "--devices", "a,b"], "--devices 'a'"),
    (["search", *DEMO, "--warm-start", "nothing"], "--warm-start: no study named 'nothing'"),
    (["search", *DEMO, "--eval-limit", "5"], "--eval-limit goes with --eval TASK"),
    (
        ["search", *DEMO, "--constraint", "flips<=0.05"],
        "task_flips is measured after the search, on the front's finalists (--eval)",
    ),
    (["search", *DEMO, "--traffic", "{things}/missing.jsonl"], "cannot read traffic file"),
    (["search", *DEMO, "--traffic", "{things}/a-file"], "a-file: not a trace autotune reads; give a .jsonl"),
    (["search", *DEMO, "--traffic-requests", "5"], "--traffic-requests goes with --traffic FILE"),
    (["search", *DEMO, "--traffic", "demo", "--prompts", "{things}/a-file"], "--prompts and --traffic both give"),
    (["search", *DEMO, "--traffic", "demo", "--output-len", "32"], "--output-len 32: each request of --traffic has"),
    (["search", *DEMO, "--traffic", "demo", "--traffic-requests", "100"], "demo-trace.jsonl holds 48 requests"),
    (["measure", "--model", "demo", "--gpu", "cpu", "--device", NO_GPU], "no such CUDA GPU here"),
    (["measure", "--model", "demo", "--gpu", "cpu", "--input-len", "600"], "but the model has 512 positions"),
    (["worker", "--study", "x", "--storage", "sqlite:///{things}/none.db", "--device", NO_GPU], "no such CUDA GPU"),
    (["worker", "--study", "x", "--storage", "sqlite:///{things}/none.db"], "no study named 'x'"),
    (["evaluate", "--study", "x", "--storage", "sqlite:///{things}/none.db"], "no study named 'x'"),
    (["evaluate", "--study", "x", "--eval-limit", "5"], "--eval-limit goes with --eval TASK"),
    (["evaluate", "--study", "x", "--trial", "1", "--constraint", "kl<=0.01"], "give --trial, or best's --constraint"),
    (["evaluate", "--study", "x", "--eval", " "], "--eval must name a task"),
    (["report", "--study", "x", "--report", "a.html", "--out", "b.html"], "--out is the old name of --report"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(args[1:])[-60:] for args, _ in CASES])
def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path, bare_cli_env, args, message):
    cwd, things = _folders(tmp_path)
    before = {path: path.read_bytes() for path in things.iterdir()}
    completed = run_main([arg.format(things=things) for arg in args], cwd, bare_cli_env)
    assert_one_line_error(completed, message)
    assert list(cwd.iterdir()) == [], "bad input wrote into the working folder"
    assert not Path(bare_cli_env["AUTOTUNE_CACHE_DIR"]).exists(), "bad input wrote into the cache folder"
    assert {path: path.read_bytes() for path in things.iterdir()} == before
    assert not Path("/proc/autotune").exists()


def test_an_unwritable_cache_folder_is_refused(tmp_path: Path, bare_cli_env):
    cwd, _ = _folders(tmp_path)
    env = {**bare_cli_env, "AUTOTUNE_CACHE_DIR": "/proc/autotune-cache"}
    completed = run_main(["search", *DEMO], cwd, env)
    assert_one_line_error(completed, "the cache folder (AUTOTUNE_CACHE_DIR) /proc/autotune-cache cannot be written")
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"model_type": "gpt2", "n_positions": 64}, "64 positions (n_positions in its config)"),
        ({"model_type": "opt", "max_position_embeddings": 96}, "96 positions (max_position_embeddings"),
        ({"model_type": "llava", "text_config": {"max_position_embeddings": 80}}, "80 positions"),
    ],
)
def test_a_workload_longer_than_a_local_models_context_is_refused(tmp_path: Path, bare_cli_env, config, limit):
    cwd, _ = _folders(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    args = ["search", "--model", str(model), "--gpu", "cpu", "--trials", "1", "--input-len", "90", "--output-len", "8"]
    completed = run_main(args, cwd, bare_cli_env)
    assert_one_line_error(completed, limit)
    assert "--input-len 90 + --output-len 8 = 98 tokens" in completed.stderr
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"input_tokens": 40, "output_tokens": 8}\n{"prompt": "x", "output_tokens": 8\n', "line 2: not JSON"),
        (
            '{"input_tokens": 40, "output_tokens": 8}\n{"input_tokens": 500, "output_tokens": 64}\n',
            "request 2: 500 tokens in + 64 out = 564 tokens, but the model has 512 positions",
        ),
        (
            '{"input_tokens": 300, "output_tokens": 8, "conversation": "c"}\n'
            '{"prompt_ids": [1, 2], "output_tokens": 203, "conversation": "c"}\n',
            "request 2: 310 tokens in + 203 out = 513 tokens",
        ),
    ],
    ids=["malformed", "longer than the context", "a conversation's history longer"],
)
def test_a_bad_trace_is_refused_before_anything_is_written(tmp_path: Path, bare_cli_env, lines, message):
    """Counts and token ids are checked against the model's positions before anything runs (text is counted by the
    prepare step, with the model's tokenizer); a turn's input holds the turns before it and their outputs."""
    cwd, things = _folders(tmp_path)
    trace = things / "trace.jsonl"
    trace.write_text(lines)
    for command in (["search", *DEMO], ["measure", "--model", "demo", "--gpu", "cpu"]):
        completed = run_main([*command, "--traffic", str(trace)], cwd, bare_cli_env)
        assert_one_line_error(completed, message)
        assert list(cwd.iterdir()) == []
        assert not Path(bare_cli_env["AUTOTUNE_CACHE_DIR"]).exists(), "bad input wrote into the cache folder"


def test_eval_without_lm_evaluation_harness_is_refused_in_one_line(tmp_path: Path, bare_cli_env, monkeypatch):
    """The real missing case is a venv without the extra (docs/install.md); here `installed` answers no for it."""
    from autotune import extras

    installed = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module != "lm_eval" and installed(module))
    cwd, _ = _folders(tmp_path)
    completed = run_main(["search", *DEMO, "--eval", "demo"], cwd, bare_cli_env)
    assert_one_line_error(completed, '--eval needs lm-eval, which is not installed: pip install "autotune[eval]"')
    assert list(cwd.iterdir()) == []
