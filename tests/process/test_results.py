"""The contract between the study process and the trial worker, typed end to end: what crosses as JSON is read back
as the types that were written (a plan, a kind's options, a test's fault, a failure's blame), never as dicts."""

from __future__ import annotations

import json

from autotune.for_tests import Fault
from autotune.process.results import Blame, Candidate, Outcome, TaskResult, TaskSpec
from autotune.space import Target, build_plan
from autotune.space.plan import Call, Plan, Ref, WorkerHook
from autotune.specs import ModelSpec, WorkloadSpec
from autotune.workloads.serve import ServeSpec

# A configuration whose plan holds every kind of value a plan has: references, calls, a context, a worker hook.
CONFIG = {"dtype": "bfloat16", "quantization": "bnb-4bit", "execution_mode": "inference_mode"} | {
    "decode_loop": "fused-step"
}


def crossed(data: dict) -> dict:
    """As the other process reads it: through a JSON file."""
    return json.loads(json.dumps(data))


def trial_spec() -> TaskSpec:
    load = ServeSpec("rate", [], bracket=[1.0, 16.0], port=8123)
    return TaskSpec(
        "trial",
        ModelSpec("demo", path="/models/demo"),
        "cpu",
        "/cache",
        WorkloadSpec("serve", batch_size=4, serve=load, slo={"ttft_p95_s": 0.3}),
        candidate=Candidate(CONFIG, build_plan(CONFIG, Target("cuda"))),
        fault=Fault("stall", "load", until="/tmp/release"),
    )


def test_a_task_spec_crosses_as_json_and_is_read_back_as_the_types_written():
    spec = trial_spec()
    read = TaskSpec.from_json(crossed(spec.to_json()))
    assert read == spec
    assert read.candidate is not None and isinstance(read.candidate.plan, Plan)
    plan = read.candidate.plan
    assert isinstance(plan.load["dtype"], Ref) and isinstance(plan.load["quantization_config"], Call)
    assert plan.contexts == [Call("torch.inference_mode")]
    assert plan.worker_hooks["decode_loop"] == WorkerHook("autotune.worker.decode_loops", "fused-step")
    assert isinstance(read.workload.serve, ServeSpec) and read.workload.probes_capacity
    assert read.fault == Fault("stall", "load", until="/tmp/release")


def test_the_spec_s_json_keeps_the_layout_stored_studies_and_tests_write():
    written = crossed(trial_spec().to_json())
    assert written["candidate"] == {"config": CONFIG, "plan": build_plan(CONFIG, Target("cuda")).to_json()}
    assert written["workload"]["serve"] == {
        "mode": "rate",
        "levels": [],
        "bracket": [1.0, 16.0],
        "requests_per_level": 16,
        "warmup_requests": 2,
        "port": 8123,
        "request_timeout_s": 120.0,
    }
    assert written["fault"] == {"kind": "stall", "phase": "load", "until": "/tmp/release"}  # as AUTOTUNE_INJECT_FAULTS
    listed = WorkloadSpec("serve", serve=ServeSpec("concurrency", [1.0, 4.0]))
    assert "bracket" not in listed.to_json()["serve"] and not listed.probes_capacity
    assert "serve" not in WorkloadSpec().to_json()  # other kinds' specs: as studies before the serve kind stored them


def test_a_failure_s_blame_crosses_typed():
    refused = TaskResult(Outcome.UNSUPPORTED, "needs torchao", blame=Blame("quantization", "torchao-int8", True))
    written = crossed(refused.to_json())
    assert written["blame"] == {"knob": "quantization", "value": "torchao-int8", "certain": True}
    assert TaskResult.from_json(written).blame == Blame("quantization", "torchao-int8", certain=True)
    assert TaskResult.from_json(crossed(TaskResult(Outcome.OK).to_json())).blame is None
