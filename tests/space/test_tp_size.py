"""The tp_size knob: a DistributedConfig in the plan; the worker runs torchrun ranks; none outlives its trial."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from autotune.for_tests import Fault
from autotune.measure.prepare import baseline_config
from autotune.paths import PACKAGED_SPACE
from autotune.process.results import Candidate, Outcome, TaskSpec
from autotune.process.runner import run_in_worker
from autotune.profiles import PROFILES, visible_gpu_count
from autotune.report.snippets import serve_command
from autotune.space import Call, Plan, Target, build_plan, load_space
from autotune.specs import ModelSpec

BASE = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
SPACE = load_space(PACKAGED_SPACE)
RANK_MODULE = "autotune.worker.rank"


def test_two_ranks_load_with_a_distributed_config_and_one_is_the_baseline():
    plan = build_plan({**BASE, "tp_size": 2}, Target("cuda"))
    assert plan.load["distributed_config"] == Call("transformers.DistributedConfig", {"tp_size": 2, "tp_plan": "auto"})
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert build_plan({**BASE, "tp_size": 1}, Target("cuda")) == build_plan(BASE, Target("cuda"))
    assert baseline_config(SPACE, "float32", PROFILES["cpu"], "throughput", "sdpa")["tp_size"] == 1
    assert "tp_size=2" in serve_command("org/model", plan, "cuda").splitlines()[1]


def test_the_distributed_config_is_one_transformers_builds():
    from autotune.worker.loading import materialize

    config = materialize(build_plan({**BASE, "tp_size": 4}, Target("cuda")).load["distributed_config"])
    assert (config.tp_size, config.tp_plan) == (4, "auto")


def test_a_gpu_profile_needs_as_many_gpus_as_ranks_and_cpu_runs_two_ranks_on_the_host():
    gpus = visible_gpu_count()
    for ranks in (2, 4, 8):
        reason = PROFILES["h100"].why_not_value("tp_size", ranks)
        expected = None if gpus >= ranks else f"tp_size={ranks} runs one rank per GPU (this machine has {gpus})"
        assert reason == expected
    assert PROFILES["cpu"].why_not_value("tp_size", 2) is None
    for ranks in (4, 8):
        assert "at most 2 gloo ranks" in (PROFILES["cpu"].why_not_value("tp_size", ranks) or "")


def _ranks_alive() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if RANK_MODULE in " ".join(p.info["cmdline"] or [])]


# Two gloo ranks measuring for real (both report: tp_ranks 2; the reference's greedy tokens) is a conformance case
# (benchmarks/conformance/), which also checks that no rank outlives it.


@dataclass
class TimeoutOnCue:
    """Limits whose timeout runs out when the test says so: the runner's own timeout path, at an event."""

    timeout_s: float = 600.0
    deadline: float | None = None

    def now(self) -> None:
        self.timeout_s = 0.0


@pytest.mark.slow
def test_ranks_that_hang_are_killed_with_the_worker_at_the_timeout(tmp_path: Path) -> None:
    plan = build_plan({**BASE, "tp_size": 2}, Target("cpu"))
    spec = TaskSpec(
        task="trial",
        model=ModelSpec("demo", path=str(tmp_path / "no-model")),
        device="cpu",
        cache_dir=str(tmp_path / "cache"),
        candidate=Candidate({**BASE, "tp_size": 2}, plan),
        reference_path=str(tmp_path / "no-reference.pt"),
        fault=Fault("hang", "load"),  # in every rank: the first phase a rank runs on its own
    )
    seen: set[int] = set()
    announced: list[str] = []
    limits = TimeoutOnCue()

    def watch() -> None:
        seen.update(_pids(_ranks_alive()))
        if "load" in announced and len(seen) >= 2:  # both ranks started, and the reporting one reached its hang
            limits.now()

    result = run_in_worker(spec, tmp_path / "w", limits, on_tick=watch, on_phase=announced.append)  # type: ignore[arg-type]
    assert result.outcome == Outcome.TIMEOUT
    assert len(seen) >= 2, "the ranks never started, so the test proves nothing"
    gone_by = time.monotonic() + 10  # killed with SIGKILL: only their reaping can lag
    while left := [process for process in _ranks_alive() if process.pid in seen]:
        assert time.monotonic() < gone_by, f"a rank outlived its trial: {left}"
        time.sleep(0.1)


def _pids(processes: list[psutil.Process]) -> set[int]:
    return {process.pid for process in processes}
