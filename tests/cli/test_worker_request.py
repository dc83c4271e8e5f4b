"""A worker `search --devices` starts gets its request as JSON (autotune/search/run.py), read by the hidden `join`:
the same request `autotune worker` builds from its flags, and the same lines and exit status."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.specs import BudgetSpec, StorageSpec, WorkerRequest
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_main


def test_a_worker_request_is_the_same_request_after_json():
    places = StorageSpec("night", "sqlite:///studies/night.db", "s3://bucket", Path("studies"), Path("/cache"), 90.0)
    request = WorkerRequest(places, "cuda:0", BudgetSpec(3600.5, 4, 600.0), trust_remote_code=True, run_id="3f2a")
    assert WorkerRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    unbounded = WorkerRequest(StorageSpec("night", "sqlite:///studies/night.db"))
    assert WorkerRequest.from_json(json.loads(json.dumps(unbounded.to_json()))) == unbounded


def test_join_refuses_what_worker_refuses_with_the_same_line(tmp_path: Path, cli_env):
    url = f"sqlite:///{tmp_path}/none.db"
    by_flags = run_main(["worker", "--study", "x", "--storage", url], tmp_path, cli_env)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(WorkerRequest(StorageSpec("x", url)).to_json()))
    by_request = run_main(["join", str(request)], tmp_path, cli_env)
    assert_one_line_error(by_request, "no study named 'x'")
    assert (by_request.returncode, by_request.stderr) == (by_flags.returncode, by_flags.stderr)
