"""benchmarks/conformance/conformance.py: the cases it runs, the outcomes written down for each transformers version
CI runs, and how a run that differs from them reads; measure on a custom space."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.space import load_space
from autotune.space.knobs import KNOBS
from autotune.space.rules import depends_on_version
from tests.benchmarks import tool
from tests.conftest import BRIEF, REPO, run_cli

conformance = tool("conformance/conformance.py")
Expected = conformance.Expected
Result = conformance.Result
cases = conformance.cases
expected_path = conformance.expected_path
figure_problems = conformance.figure_problems
load_expected = conformance.load_expected
mismatch = conformance.mismatch
recorded_failure = conformance.recorded_failure
write_table = conformance.write_table

DEFAULT_SPACE = PACKAGED_SPACE
PLANNED = cases(DEFAULT_SPACE)
BY_LABEL = {case.label: case for case in PLANNED}


def _pinned(constraints: str) -> str:
    lines = (REPO / constraints).read_text().splitlines()
    return next(line.split("==")[1] for line in lines if line.startswith("transformers=="))


def test_conformance_measures_every_value_the_cpu_profile_runs_once() -> None:
    runnable = load_space(DEFAULT_SPACE).prune(PROFILES["cpu"].why_not_value)
    for spec in runnable.knobs:
        for value in spec.values:
            assert any(case.config.get(spec.name) == value for case in PLANNED), f"{spec.name}={value}"
    keys = [json.dumps([case.config, case.workload.kind], sort_keys=True) for case in PLANNED]
    assert len(keys) == len(set(keys))
    assert len({case.label for case in PLANNED}) == len(PLANNED)
    assert PLANNED[0].label.startswith("baseline")


def test_on_a_gpu_profile_conformance_runs_every_value_that_profile_keeps_on_cuda() -> None:
    """`--gpu h100`: the CUDA values (flash attention, the forced sdpa kernels, bitsandbytes, CUDA graphs) join the
    cases, each on the profile's device type, with their own expected file."""
    on_gpu = cases(DEFAULT_SPACE, "h100")
    runnable = load_space(DEFAULT_SPACE).prune(PROFILES["h100"].why_not_value)
    for spec in runnable.knobs:
        for value in spec.values:
            assert any(case.config.get(spec.name) == value for case in on_gpu), f"{spec.name}={value}"
    labels = {case.label for case in on_gpu}
    assert {"sdpa_backend=efficient", "quantization=bnb-4bit", "attn_implementation=flash_attention_2"} <= labels
    assert all(case.device_type == "cuda" for case in on_gpu) and len(on_gpu) > len(PLANNED)
    assert expected_path("5.22.2", "h100").name == "expected-5.22.2-h100.yaml"
    assert expected_path("5.22.2").name == "expected-5.22.2.yaml"


def test_recording_a_gpu_run_fails_only_a_case_that_neither_ran_nor_was_refused_with_its_reason(tmp_path) -> None:
    """Where no outcome is written down, a missing package (refused) or a knob transformers refuses (unsupported) is
    what the machine can do; a crash or a timeout is a failure. The table holds every case with its message."""
    case = BY_LABEL["dtype=float32"]
    results = [
        Result(case, "ok", "", {"throughput_tok_s": 583.0}, 14.0),
        Result(case, "refused", 'needs torchao, which is not installed: pip install "autotune[quant]"'),
        Result(case, "unsupported", "RuntimeError: No available kernel. Aborting execution."),
        Result(case, "crashed", "the worker was killed by SIGSEGV"),
    ]
    assert [recorded_failure(result) for result in results[:3]] == [None, None, None]
    assert recorded_failure(results[3]) == "dtype=float32: crashed: the worker was killed by SIGSEGV"
    table = tmp_path / "conformance-h100.md"
    write_table(results, table, "Conformance: transformers 5.22.2, h100 profile")
    lines = table.read_text().splitlines()
    assert lines[0] == "# Conformance: transformers 5.22.2, h100 profile" and len(lines) == 4 + len(results)
    assert lines[4] == "| dtype=float32 | ok | 583 tok/s | 14 |"
    assert "No available kernel" in lines[6] and lines[7].startswith("| dtype=float32 | crashed |")


@pytest.mark.parametrize("constraints", ["constraints.txt", "constraints-floor.txt"])
def test_every_case_has_its_expected_outcome_written_down_for_each_version_ci_runs(constraints: str) -> None:
    path = expected_path(_pinned(constraints))
    expected = load_expected(path)
    assert sorted(expected) == sorted(BY_LABEL), f"{path.name} must name exactly the cases of conformance.py"


def test_the_transformers_versions_claimed_are_those_ci_proves() -> None:
    """pyproject's range runs from the floor CI measures to the minor version it pins: a newer transformers is
    claimed only once CI measures it (5.24 renamed generate()'s past_key_values to cache; 5.23 wants kernels 0.18)."""
    floor, pinned = (_pinned(name).split(".") for name in ("constraints-floor.txt", "constraints.txt"))
    claimed = f"transformers>={floor[0]}.{floor[1]},<{pinned[0]}.{int(pinned[1]) + 1}"
    project = (REPO / "pyproject.toml").read_text()
    assert re.findall(r'"transformers(?:\[serving\])?([^"]*)"', project) == [claimed[len("transformers") :]] * 2


def test_values_no_batch_can_run_are_measured_one_prompt_at_a_time_and_their_refusal_on_a_batch() -> None:
    """Speculative decoding is refused on batches: conformance runs it on one prompt, so it really runs, in float32,
    so that its greedy tokens are the reference's; and once on a batch, to hold transformers' refusal."""
    speculative = [case for case in PLANNED if case.config.get("speculative", "none") != "none"]
    one_at_a_time = [case for case in speculative if not case.on_a_batch]
    assert one_at_a_time and all(case.one_prompt_at_a_time for case in one_at_a_time)
    assert all(case.workload.kind == "latency" and case.workload.batch_size == 1 for case in one_at_a_time)
    assert all(case.config["dtype"] == "float32" and case.label.endswith("(float32)") for case in one_at_a_time)
    (on_a_batch,) = [case for case in speculative if case.on_a_batch]
    assert on_a_batch.workload.kind == "throughput" and on_a_batch.workload.batch_size == 2
    prompt_cache = BY_LABEL["prefix_reuse=on"]  # generate()'s prompt cache: one request at a time, on a trace
    assert prompt_cache.one_prompt_at_a_time and prompt_cache.workload.kind == "latency"
    assert prompt_cache.workload.traffic is not None and prompt_cache.workload.traffic.shared
    batched = [case for case in PLANNED if case not in speculative and case != prompt_cache]
    assert all(case.workload.kind == "throughput" and case.workload.batch_size == 2 for case in batched)
    traced = [case.label for case in PLANNED if case.workload.traffic is not None]
    assert traced == ["prefix_reuse=on", "prefix_reuse=off"]  # only where requests must share a prefix
    assert BY_LABEL["tp_size=2 (float32)"].config["dtype"] == "float32"


def test_the_floor_runs_the_cases_whose_path_depends_on_the_version_on_every_run() -> None:
    dependent = {case.label for case in PLANNED if case.depends_on_version}
    assert {"batching=continuous", "page_size=64", "kv_cache_backend=hqq", "quantization=torchao-int8",
            "quantization=bnb-4bit", "use_kernels=on"} <= dependent  # fmt: skip
    assert not dependent & {"dtype=float16", "attn_implementation=eager", "compile=default", "sdpa_backend=math"}
    flex_static = {"dtype": "float32", "attn_implementation": "flex_attention", "cache_implementation": "static"}
    assert depends_on_version(flex_static)  # refused after 5.17 (rules.BROKEN_TOGETHER)
    hub_attention = {"dtype": "bfloat16", "attn_implementation": "kernels-community/flash-attn2"}
    assert depends_on_version(hub_attention)


def test_the_floor_runs_every_case_when_a_knobs_worker_hook_changes() -> None:
    """A knob's worker module decides what its values do, as its handler does: the Makefile's FLOOR_SOURCES list it."""
    makefile = (REPO / "Makefile").read_text()
    sources = makefile.split("FLOOR_SOURCES :=", 1)[1].split("FLOOR_RECORD :=", 1)[0].split()
    hooks = {knob.worker_hook for knob in KNOBS.values() if knob.worker_hook}
    assert hooks and {f"{module.replace('.', '/')}.py" for module in hooks} <= set(sources)


def test_an_outcome_other_than_the_one_written_down_is_one_line_naming_the_case_and_version() -> None:
    case = BY_LABEL["quantization=quanto-int8"]
    failed = Result(case, "error", "RuntimeError: boom")
    assert mismatch(failed, Expected("ok"), "5.17.0") == (
        "quantization=quanto-int8 on transformers 5.17.0: expected ok, got error: RuntimeError: boom"
    )
    ran = Result(case, "ok", "", {"throughput_tok_s": 10.0})
    assert mismatch(ran, Expected("unsupported", "not installed"), "5.17.0") == (
        "quantization=quanto-int8 on transformers 5.17.0: expected unsupported ('not installed'), got ok"
    )
    other = Result(case, "unsupported", "QuantoConfig needs optimum-quanto")
    assert "expected unsupported with 'not installed'" in mismatch(other, Expected("unsupported", "not installed"), "x")
    assert mismatch(Result(case, "unsupported", "optimum-quanto is not installed"),
                    Expected("unsupported", "not installed"), "x") is None  # fmt: skip
    assert "no expected outcome written down" in mismatch(ran, None, "5.22.2")


def test_an_ok_run_must_show_what_its_knob_promises() -> None:
    speculative = BY_LABEL["speculative=assistant (float32)"]
    exact = {"throughput_tok_s": 5.0, "greedy_agreement": 1.0, "token_agreement": 1.0, "kl_divergence": 0.0}
    exact["top1_agreement"] = 1.0
    assert figure_problems(speculative, exact) == []
    assert figure_problems(speculative, {**exact, "greedy_agreement": 0.9, "token_agreement": 0.99}) == [
        "greedy_agreement is 0.9, wanted 1.0 (the reference's greedy tokens)",
        "token_agreement is 0.99, wanted 1.0 (the reference's greedy tokens)",
    ]
    tp = BY_LABEL["tp_size=2 (float32)"]
    ran = {"throughput_tok_s": 5.0, "greedy_agreement": 1.0, "token_agreement": 1.0}
    assert figure_problems(tp, {**ran, "tp_ranks": 2.0}) == []
    assert figure_problems(tp, ran) == ["tp_ranks is None, wanted 2 ranks"]
    assert figure_problems(tp, {**ran, "tp_ranks": 2.0, "token_agreement": None}) == [  # every value, some path
        "token_agreement is None, wanted in (0, 1]"
    ]
    quantized = BY_LABEL["kv_cache_backend=hqq"]
    assert "perplexity is nan, wanted a finite perplexity" in figure_problems(
        quantized, {"throughput_tok_s": 5.0, "kl_divergence": 0.1, "top1_agreement": 0.9, "perplexity": float("nan")}
    )


def test_an_expected_outcome_is_ok_or_unsupported_with_words() -> None:
    assert Expected.from_yaml("ok") == Expected("ok")
    assert Expected.from_yaml({"unsupported": "needs a CUDA GPU"}) == Expected("unsupported", "needs a CUDA GPU")
    for wrong in ("error", {"unsupported": 3}, {"ok": "x"}):
        with pytest.raises(ValueError, match="write ok, or"):
            Expected.from_yaml(wrong)


@pytest.mark.slow
def test_measure_on_a_space_without_the_checkpoint_dtype_measures_the_defaults(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The transformers defaults are measurable whatever the space offers (the demo checkpoint is bfloat16)."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  dtype: [float32]\n  attn_implementation: [sdpa]\n")
    args = ["measure", "--model", "demo", "--device", "cpu", "--space", str(space), "--batch-size", "1",
            "--input-len", "16", "--output-len", "8", "--json", *BRIEF]  # fmt: skip
    completed = run_cli(args, tmp_path, cli_env)
    assert completed.returncode == 0, completed.stderr[-2000:]
    document = json.loads(completed.stdout.strip().splitlines()[-1])
    assert document["config"]["dtype"] == "bfloat16" and document["outcome"] == "ok"
