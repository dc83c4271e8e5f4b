"""The bundled demo trace is what its generator writes (seeded), fits the demo model's context, and holds what a
trace of real traffic holds: long-tailed lengths, bursts, and conversations whose turns continue one another."""

from __future__ import annotations

import statistics
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from autotune.data import DEMO_TRACE
from autotune.paths import DEMO_MAX_POSITIONS
from autotune.traffic import TrafficRef, read_trace, turns

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_demo_trace_is_what_its_generator_writes(cache_dir: Path) -> None:
    check = [sys.executable, str(REPO / "benchmarks" / "traffic" / "make_demo_trace.py"), "--check"]
    done = subprocess.run(check, env={"AUTOTUNE_CACHE_DIR": str(cache_dir), "PATH": ""}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_demo_trace_is_long_tailed_bursty_and_holds_conversations_within_the_demos_context(cache_dir):
    from transformers import AutoTokenizer

    from autotune.worker.demo_model import ensure_demo_model
    from autotune.worker.traffic import Tokens, materialize

    trace = read_trace(DEMO_TRACE)
    requests = materialize(list(trace.requests), Tokens(AutoTokenizer.from_pretrained(ensure_demo_model(cache_dir))))
    assert len(requests) == 48
    assert max(len(request.ids) + request.output_len for request in requests) <= DEMO_MAX_POSITIONS
    outputs = sorted(request.output_len for request in requests)
    assert outputs[-1] > 3 * statistics.median(outputs)  # a long tail
    gaps = [later - earlier for earlier, later in pairwise(request.arrival_s or 0.0 for request in requests)]
    assert statistics.stdev(gaps) > statistics.mean(gaps)  # burstier than Poisson arrivals (coefficient of variation 1)
    continued = [index for index, previous in enumerate(turns(list(trace.requests))) if previous is not None]
    assert len(continued) == 8 and all(requests[i].reusable > 0 for i in continued)
    assert TrafficRef.of(trace, 24).shared  # the first 24 requests hold a conversation's continued turn
