"""The decode_loop knob: the plan names the loop as the knob's worker hook, which gives every generate() of the trial
the loop the handler names (every loop of worker/decode_loops.py is one of its values); the snippets deploy it through
custom_generate and the folder `autotune loop` writes, serve says it does not carry it; it applies to generate()
without assisted decoding; a CPU leaves deferred-stop out with its reason, a GPU keeps it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from autotune.errors import UserError
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.report.loop_folder import write_loop_folder
from autotune.report.snippets import json_snippet, python_snippet, serve_command
from autotune.space import Target, build_plan, load_space, rules
from autotune.space.knobs.decoding import STOCK_LOOP, DecodeLoopKnob, default_folder, loop_names
from autotune.space.plan import Plan, WorkerHook
from autotune.study import migrations

BASE = {"dtype": "float32", "attn_implementation": "sdpa", "quantization": "none", "batching": "generate"}
COMPILED = {**BASE, "cache_implementation": "static", "compile": "default"}


def test_the_plan_names_the_loop_as_the_knobs_worker_hook_and_plans_stored_before_read_the_same():
    plan = build_plan({**COMPILED, "decode_loop": "fused-step"}, Target("cpu"))
    assert plan.worker_hooks == {"decode_loop": WorkerHook("autotune.worker.decode_loops", "fused-step")}
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    stock = build_plan({**COMPILED, "decode_loop": "generate"}, Target("cpu"))
    assert stock == build_plan(COMPILED, Target("cpu")) and "worker_hooks" not in stock.to_json()
    # main 5bb2cda stored the loop as a decode_loop of the plan's own, and a hook as its module alone
    stored = {key: value for key, value in plan.to_json().items() if key != "worker_hooks"} | {
        "decode_loop": "fused-step"
    }
    assert Plan.from_json(migrations.plan(stored)) == plan  # type: ignore[arg-type]
    kernels = build_plan({**COMPILED, "use_kernels": "on"}, Target("cuda")).to_json()
    kernels["worker_hooks"] = {"use_kernels": "autotune.worker.hub_kernels"}
    read = Plan.from_json(migrations.plan(kernels))  # type: ignore[arg-type]
    assert read.worker_hooks == {"use_kernels": WorkerHook("autotune.worker.hub_kernels", None)}


def test_every_loop_of_the_worker_is_a_value_of_the_handler_and_its_hook_gives_generate_that_loop():
    from autotune.worker import hooks
    from autotune.worker.decode_loops import LOOPS

    assert sorted(LOOPS) == sorted(loop_names())  # and the other way round: no loop written in one place only
    assert set(DecodeLoopKnob.choices) == {STOCK_LOOP, *LOOPS}
    for loop in LOOPS:
        plan = build_plan({**COMPILED, "decode_loop": loop}, Target("cpu"))
        assert hooks.generate_arguments(plan) == {"custom_generate": LOOPS[loop]}
        assert rules.depends_on_version({**COMPILED, "decode_loop": loop})  # it calls generate()'s internals
    assert hooks.generate_arguments(build_plan(COMPILED, Target("cpu"))) == {}
    assert not rules.depends_on_version({**COMPILED, "decode_loop": STOCK_LOOP})


def test_the_snippets_deploy_the_loop_from_its_folder_and_serve_says_it_does_not_carry_it():
    plan = build_plan({**COMPILED, "decode_loop": "fused-step"}, Target("cpu"))
    code = python_snippet("org/model", plan, "cpu", 16)
    ast.parse(code)
    assert "    custom_generate='./autotune-fused-step',  # decode_loop=fused-step" in code
    assert "`autotune loop fused-step` writes it" in code and "    trust_remote_code=True," in code
    assert json.loads(json_snippet("org/model", {}, plan))["decode_loop"] == {
        "name": "fused-step",
        "custom_generate": "./autotune-fused-step",
    }
    assert "decode_loop=fused-step (serve runs its own decoding loop)" in serve_command("org/model", plan, "cpu")
    assert "custom_generate" not in python_snippet("org/model", build_plan(COMPILED, Target("cpu")), "cpu", 16)


def test_the_space_keeps_the_loops_to_generate_without_assisted_decoding():
    space = load_space(PACKAGED_SPACE)
    assert "decode_loop" in space.normalize({**BASE, "decode_loop": "fused-step", "speculative": "none"})
    assert "decode_loop" not in space.normalize({**BASE, "speculative": "prompt_lookup"})
    assert "decode_loop" not in space.normalize({**BASE, "batching": "continuous"})
    for batching, speculative in (("continuous", None), ("generate", "prompt_lookup")):
        config = {**BASE, "batching": batching, "decode_loop": "fused-step"}
        if speculative:
            config["speculative"] = speculative
        refused = rules.plan_problem(config, build_plan(config, Target("cpu")))  # autotune measure --set both
        assert refused is not None and "runs a decoding loop of its own" in refused.message
        assert refused.knob is None  # a combination: the loop runs in other plans
        stock = {**config, "decode_loop": STOCK_LOOP}
        assert rules.plan_problem(stock, build_plan(stock, Target("cpu"))) is None


def test_a_cpu_leaves_deferred_stop_out_with_its_reason_and_a_gpu_keeps_it():
    why = PROFILES["cpu"].why_not_value("decode_loop", "deferred-stop")
    assert why is not None and why.startswith("changes nothing on a CPU: the stop read late")
    assert PROFILES["cpu"].why_not_value("decode_loop", "fused-step") is None
    assert PROFILES["h100"].why_not_value("decode_loop", "deferred-stop") is None


def top_level_imports(source: str) -> tuple[set[str], set[str]]:
    """The packages a module imports, and the modules beside it it imports relatively."""
    names: set[str] = set()
    beside: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            beside.add(f"{node.module}.py")
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names, beside


def test_autotune_loop_writes_a_folder_generate_can_load_and_refuses_an_unknown_loop(tmp_path):
    entry = write_loop_folder("fused-step", tmp_path / "loop")
    assert entry == tmp_path / "loop" / "custom_generate" / "generate.py"
    copied = {path.name for path in entry.parent.glob("*.py")} - {"generate.py"}
    assert "decode_loops.py" in copied
    for module in copied:  # torch and transformers only, and the modules beside it, each copied
        packages, beside = top_level_imports((entry.parent / module).read_text())
        assert packages <= {"__future__", "collections", "contextlib", "typing", "torch", "transformers"}, module
        assert beside <= copied, module
    assert default_folder("fused-step") == "./autotune-fused-step"
    with pytest.raises(UserError) as raised:
        write_loop_folder("nope", tmp_path / "other")
    assert str(raised.value) == f"no decoding loop 'nope': give one of {', '.join(loop_names())}"
    assert not (tmp_path / "other").exists()
    refused = subprocess.run(
        [sys.executable, "-m", "autotune", "loop", "nope", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
