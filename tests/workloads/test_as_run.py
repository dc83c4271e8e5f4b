"""What a workload spec says is what runs: a latency workload is one prompt at a time, in every record of it."""

from __future__ import annotations

from dataclasses import replace

from autotune.data import DEMO_TRACE
from autotune.specs import WorkloadSpec
from autotune.study import StudySettings
from autotune.traffic import TrafficRef, read_trace
from autotune.workloads import KINDS, describe_workload, workload_as_run
from autotune.workloads.serve import ServeSpec
from tests import fakes


def test_a_latency_workload_says_it_runs_one_prompt_at_a_time_whatever_batch_it_was_given():
    latency = KINDS["latency"]
    asked = latency.as_run(WorkloadSpec("latency", batch_size=8))  # as --workload latency --batch-size 8 builds it
    assert asked.batch_size == latency.requests(asked) == 1
    assert asked.to_json()["batch_size"] == 1
    switched = replace(WorkloadSpec("throughput", batch_size=8), kind="latency")  # --objective latency, a knob
    assert workload_as_run(switched.to_json())["batch_size"] == 1  # as the worker and measure --json say it ran
    assert KINDS["throughput"].as_run(WorkloadSpec("throughput", batch_size=8)).to_json()["batch_size"] == 8


def test_a_latency_study_stored_with_the_batch_it_was_given_reads_as_it_ran_and_resumes():
    stored = fakes.settings().to_json()
    stored["workload"] = {**WorkloadSpec("latency").to_json(), "batch_size": 8}  # as studies stored it before
    settings = StudySettings.from_json(stored)
    assert settings.workload.batch_size == 1 and settings.workload.kind == "latency"
    resumed = replace(settings, workload=KINDS["latency"].as_run(WorkloadSpec("latency", batch_size=8)))
    resumed.check_resumable(settings, "latency-study")  # the same workload: no mismatch
    assert (
        workload_as_run({"kind": "throughput", "batch_size": 8}) == WorkloadSpec("throughput", batch_size=8).to_json()
    )


def test_the_workload_line_names_the_kind_and_what_runs_at_once():
    assert describe_workload(WorkloadSpec("latency", batch_size=8)) == (
        "latency, 1 prompt at a time, 128 tokens in, 64 out"
    )
    assert describe_workload(WorkloadSpec("latency", batch_size=8, input_len=32, output_len=16)) == (
        "latency, 1 prompt at a time, 32 tokens in, 16 out"
    )
    assert describe_workload(WorkloadSpec(batch_size=4)) == "throughput, 4 prompts at a time, 128 tokens in, 64 out"


def test_the_workload_line_names_the_batches_a_probe_searches_and_the_slo():
    probed = WorkloadSpec(batch_size=32, batch_sizes=[1, 2, 4, 8, 16, 32], slo={"itl_p95_s": 0.006})
    assert describe_workload(probed) == (
        "throughput, batches of 1, 2, 4, 8, 16, 32 prompts (the largest within the SLO and the memory), "
        "128 tokens in, 64 out; SLO itl_p95<=6ms"
    )
    served = WorkloadSpec("serve", batch_size=16, slo={"ttft_p95_s": 0.3}, slo_share=0.9)
    assert describe_workload(served) == (
        "serve, 16 prompts sent to transformers serve, 128 tokens in, 64 out; SLO ttft_p95<=300ms for 90% of requests"
    )


def test_on_a_trace_the_workload_line_says_how_each_kind_sends_its_requests():
    window = TrafficRef.of(read_trace(DEMO_TRACE), 8)
    requests = f"the first 8 of 48 requests of demo-trace.jsonl (jsonl, sha256 {window.sha256[:8]})"
    assert describe_workload(WorkloadSpec(batch_size=4, traffic=window)) == (
        f"throughput, {requests}, 4 requests at a time through generate() (continuous batching: all at once), "
        "each with its own lengths"
    )
    assert describe_workload(WorkloadSpec("latency", traffic=window)) == (
        f"latency, {requests}, 1 request at a time, each with its own lengths"
    )
    modes = ("rate", "concurrency")
    by_rate, in_flight = (WorkloadSpec("serve", traffic=window, serve=ServeSpec(mode=m)) for m in modes)
    assert describe_workload(by_rate).endswith("own lengths, arriving as the trace's arrivals scaled to each rate")
    assert describe_workload(in_flight).endswith("own lengths, as many in flight as each concurrency level")
