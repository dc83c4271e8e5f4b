"""A configuration's plan as code to paste: Python, JSON, and a `transformers serve` command line."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from autotune.space.knobs import KNOBS, Deployment
from autotune.space.plan import Call, Plan, imports_of, modules_to_import, plain, render, uses_torch

EXAMPLE_PROMPT = "In the beginning God created the heaven and the earth."


def python_snippet(model_id: str, plan: Plan, device: str, max_new_tokens: int, batch: Batch | None = None) -> str:
    """Load the model with the plan's knobs and generate, as in the trial that measured it; with `batch`, as many
    prompts at once as the capacity measured, and what was measured in a comment."""
    generate_kwargs, setup = _hoist_configured_objects(plan.generate)
    values = [*plan.load.values(), *plan.generate.values(), *plan.continuous.values(), *plan.contexts]
    names = {"AutoModelForCausalLM", "AutoTokenizer"} | imports_of(values)
    if plan.batching == "continuous":
        names |= {"ContinuousBatchingConfig", "GenerationConfig"}
    lines = []
    if uses_torch(values):
        lines.append("import torch")
    lines += [f"import {module}" for module in sorted(modules_to_import(values))]
    lines += [f"from transformers import {', '.join(sorted(names))}", "", f"model_id = {model_id!r}"]
    lines.append('tokenizer = AutoTokenizer.from_pretrained(model_id, padding_side="left")')
    lines.append("model = AutoModelForCausalLM.from_pretrained(")
    lines += ["    model_id,", *[f"    {key}={render(value)}," for key, value in plan.load.items()]]
    lines += [f"    device_map={device!r},", ")", *setup, "", *_prompts(batch)]
    if plan.batching == "continuous":
        call = _continuous_lines(plan, max_new_tokens)
    else:
        arguments = [argument for _, deployment in deployments(plan) for argument in deployment.arguments]
        hooked = {argument.name: argument.source for argument in arguments}
        comments = {argument.name: argument.comment for argument in arguments if argument.comment}
        call = _generate_lines(generate_kwargs | hooked, max_new_tokens, comments)
    lines += _inside_contexts(call, plan.contexts) if plan.contexts else call
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Batch:
    """The batch a capacity probe chose, and what it measured, in one line."""

    size: int
    measured: str  # "capacity within itl_p95<=6ms: batch 16; batch 32 past the SLO: itl_p95 10.5 ms > 6 ms"

    @property
    def comment(self) -> str:
        return "# " + " ".join(self.measured.split())


def _prompts(batch: Batch | None) -> list[str]:
    if batch is None:
        return [f"prompts = [{EXAMPLE_PROMPT!r}]"]
    return [
        batch.comment,
        f"batch_size = {batch.size}  # the largest batch measured within the SLO: at most this many prompts at once",
        f"prompts = [{EXAMPLE_PROMPT!r}] * batch_size",
    ]


def _inside_contexts(lines: list[str], contexts: list[Call]) -> list[str]:
    """The generating call (from `outputs = ` to its closing parenthesis) inside the plan's context managers."""
    first = next(i for i, line in enumerate(lines) if line.startswith("outputs = "))
    last = lines.index(")", first)
    inside = [f"    {line}" for line in lines[first : last + 1]]
    header = f"with {', '.join(render(call) for call in contexts)}:"
    return [*lines[:first], header, *inside, *lines[last + 1 :]]


def _hoist_configured_objects(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Objects that need attributes set after construction become variables set up before the call."""
    rendered, setup = {}, []
    for key, value in kwargs.items():
        if isinstance(value, Call) and value.attrs:
            setup.append(f"{key} = {render(value)}")
            setup += [f"{key}.{name} = {render(item)}" for name, item in value.attrs.items()]
            rendered[key] = key
        else:
            rendered[key] = render(value)
    if any(line.endswith("._compile_all_devices = True") for line in setup):
        setup.insert(0, "# generate() compiles only on GPUs unless _compile_all_devices is set (CPU)")
    return rendered, setup


def deployments(plan: Plan) -> list[tuple[str, Deployment]]:
    """What a deployment passes generate() for the plan's knobs with worker code, by knob, as their handlers say
    (a decoding loop: the folder `autotune loop` writes, and the trust its code needs)."""
    found = []
    for knob, hook in plan.worker_hooks.items():
        if knob in KNOBS and (deployment := KNOBS[knob].deployment(hook.value)) is not None:
            found.append((knob, deployment))
    return found


def _generate_lines(kwargs: dict[str, str], max_new_tokens: int, comments: dict[str, str]) -> list[str]:
    return [
        'inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)',
        "outputs = model.generate(",
        "    **inputs,",
        f"    max_new_tokens={max_new_tokens},",
        "    do_sample=False,",
        *[f"    {key}={value}," + (f"  # {comments[key]}" if key in comments else "") for key, value in kwargs.items()],
        ")",
        'print(tokenizer.batch_decode(outputs[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
    ]


def _continuous_lines(plan: Plan, max_new_tokens: int) -> list[str]:
    config_args = ", ".join(f"{key}={render(value)}" for key, value in plan.continuous.items())
    return [
        "outputs = model.generate_batch(",
        '    [tokenizer(prompt)["input_ids"] for prompt in prompts],',
        f"    generation_config=GenerationConfig(max_new_tokens={max_new_tokens}, do_sample=False),",
        f"    continuous_batching_config=ContinuousBatchingConfig({config_args}),",
        ")",
        "for output in outputs.values():",
        "    print(tokenizer.decode(output.generated_tokens, skip_special_tokens=True))",
    ]


def serve_command(model_id: str, plan: Plan, device: str, batch: Batch | None = None) -> str:
    """The `transformers serve` command with the knobs it has flags for; the others follow as a comment, and what a
    capacity probe measured as another."""
    command = shlex.join(["transformers", "serve", model_id, *plan.serve_flags, "--device", device])
    if plan.not_servable:
        command += f"\n# transformers serve has no flag for: {', '.join(plan.not_servable)}"
    if batch is not None:
        command += f"\n{batch.comment}"
    return command


def json_snippet(model_id: str, config: dict[str, Any], plan: Plan, capacity: dict[str, Any] | None = None) -> str:
    """The configuration and the keyword arguments it turns into, for scripts and nightly jobs; with `capacity`, what
    it carries at its capacity (autotune.analysis.capacity.AtCapacity.to_json)."""
    document = {
        "model": model_id,
        "config": config,
        "from_pretrained": plain(plan.load),
        "generate": plain(plan.generate),
        "batching": plan.batching,
        "contexts": plain(plan.contexts),
        "continuous_batching": plain(plan.continuous),
        "serve_flags": plan.serve_flags,
    }
    for knob, deployment in deployments(plan):
        document[knob] = dict(deployment.entry)
    if capacity is not None:
        document["capacity"] = capacity
    return json.dumps(document, indent=2)
