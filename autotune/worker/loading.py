"""Build real objects from a plan and load the model with them."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from autotune.space.plan import Call, Plan, Ref
from autotune.specs import ModelSpec
from autotune.worker import hooks


def materialize(value: Any) -> Any:
    """Plan value -> Python object (only torch.* and transformers.* names, checked by Ref and Call)."""
    if isinstance(value, Ref):
        return _resolve(value.path)
    if isinstance(value, Call):
        instance = _resolve(value.path)(**materialize(value.kwargs))
        for name, item in value.attrs.items():
            setattr(instance, name, materialize(item))
        return instance
    if isinstance(value, dict):
        return {key: materialize(item) for key, item in value.items()}
    if isinstance(value, list):
        return [materialize(item) for item in value]
    return value


def _resolve(path: str) -> Any:
    """The object a dotted path names: a module's attribute, or an attribute of one (an enum member)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise  # the module exists but needs a package that is missing
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(f"no module in {path!r}")


# What from_pretrained() and generate() import on their first call: every quantizer (and with them torchao,
# where installed) and every loss (and with them scipy). Imported before the memory baseline, their tens of
# megabytes count as the process's libraries, not as the model's memory.
FIRST_CALL_MODULES = ("transformers.quantizers.auto", "transformers.loss.loss_utils", "transformers.generation.utils")


def import_first_call_modules() -> None:
    for module in FIRST_CALL_MODULES:
        importlib.import_module(module)


def load_model(model: ModelSpec, plan: Plan, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    hooks.before_load(plan)
    loaded = AutoModelForCausalLM.from_pretrained(
        model.path,
        revision=model.revision,
        trust_remote_code=model.trust_remote_code,
        device_map=None if "distributed_config" in plan.load else device,  # each rank's shard goes to its device
        **materialize(plan.load),
    )
    loaded.eval()
    hooks.after_load(plan, loaded)
    return loaded


def load_tokenizer(model: ModelSpec) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model.path, revision=model.revision, trust_remote_code=model.trust_remote_code, padding_side="left"
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
