"""Plans are written with the newest transformers API; this adapts them to the installed version, or says why not.

An adaptation only renames arguments, so the plan stays what runs; a plan this installation cannot run (a
missing package, a backend this transformers lacks) is unsupported, with what to install or change.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import fields
from typing import Any

from packaging.version import Version

from autotune.extras import BITSANDBYTES, HQQ, QUANTO, TORCHAO, installed
from autotune.space.plan import Call, Plan
from autotune.worker.failures import UnsupportedError

FP8_KV_CACHE_SINCE = Version("5.22")
# generate() calls .contiguous() on flex_attention's BlockMask when the cache is static: seen failing on
# 5.22.2 and 5.23.0, working on 5.17.0 (versions between them not tried).
FLEX_STATIC_CACHE_WORKS_UNTIL = Version("5.17.0")
STATIC_CACHES = ("static", "offloaded_static")
# Renamed in later transformers: the plan uses the newest names, older versions get theirs.
_RENAMED_CONTINUOUS_FIELDS = {"page_size": "block_size"}
# Options an older version does not have; what they do is done another way there (see pin_attention).
_ABSENT_MEANS_DEFAULT = {"auto_switch_to_flash"}
PAGED = "paged|"  # the prefix of the attention implementations that read a paged cache


def transformers_version() -> Version:
    return Version(importlib.metadata.version("transformers"))


def kv_cache_backends() -> list[str]:
    """The quantized KV-cache backends this transformers can run with the packages installed."""
    from transformers.utils.import_utils import is_hqq_available, is_optimum_quanto_available

    backends = ["fp8"] if transformers_version() >= FP8_KV_CACHE_SINCE else []
    if is_optimum_quanto_available():
        backends.append("quanto")
    if is_hqq_available():
        backends.append("hqq")
    return backends


# The quantization configurations that need a package beyond transformers.
_QUANTIZATION_LIBRARIES = {
    "transformers.BitsAndBytesConfig": BITSANDBYTES,
    "transformers.TorchAoConfig": TORCHAO,
    "transformers.QuantoConfig": QUANTO,
}
_KV_CACHE_PACKAGES = {"quanto": QUANTO, "hqq": HQQ}


def quantization_library(plan: Plan) -> str | None:
    """The module of the plan's weight quantization library, if it has one."""
    config = plan.load.get("quantization_config")
    library = _QUANTIZATION_LIBRARIES.get(config.path) if isinstance(config, Call) else None
    return library.module if library else None


def depends_on_version(plan: Plan) -> bool:
    """Whether running this plan goes through a path that differs by transformers version or by the packages
    beside it: what this module adapts or refuses, and the hub kernels' version pin (hub_kernels.py).

    Version conformance runs these cases on the lowest supported transformers on every CI run.
    """
    attention = plan.load.get("attn_implementation")
    return bool(
        plan.batching == "continuous"  # continuous_batching_config, pin_attention, check_attention_kept
        or plan.quantized_kv_cache  # kv_cache_backends
        or quantization_library(plan)  # _require_quantization_library
        or plan.load.get("use_kernels")  # require_kernels_package: each transformers pins its kernels
        or (isinstance(attention, str) and "/" in attention)  # a hub kernel attention, the same pin
        or (attention == "flex_attention" and plan.generate.get("cache_implementation") in STATIC_CACHES)
    )


def adapt_plan(plan: Plan) -> Plan:
    """The plan this installation runs, or UnsupportedError saying what to install or change."""
    _refuse_known_broken_combinations(plan)
    _require_assistant_model(plan)
    _require_quantization_library(plan)
    _require_kv_cache_backend(plan)
    return plan


def _require_assistant_model(plan: Plan) -> None:
    if "assistant_model" in plan.generate and plan.generate["assistant_model"] is None:
        raise UnsupportedError("speculative=assistant needs a draft model: give --assistant-model (a hub id or folder)")


def _require_quantization_library(plan: Plan) -> None:
    config = plan.load.get("quantization_config")
    if not isinstance(config, Call) or config.path not in _QUANTIZATION_LIBRARIES:
        return
    package = _QUANTIZATION_LIBRARIES[config.path]
    if not _installed(package.module):
        name = config.path.split(".")[-1]
        raise UnsupportedError(f"{name} needs {package.name}, which is not installed: {package.install}")


def _installed(module: str) -> bool:
    return installed(module)


def _require_kv_cache_backend(plan: Plan) -> None:
    wanted = (plan.generate.get("cache_config") or {}).get("backend")
    if plan.generate.get("cache_implementation") != "quantized" or wanted is None or wanted in kv_cache_backends():
        return
    if wanted == "fp8":
        raise UnsupportedError(
            f"transformers {transformers_version()} has no fp8 KV-cache backend (it has from {FP8_KV_CACHE_SINCE}): "
            "upgrade transformers, or use the quanto or hqq backend"
        )
    package = _KV_CACHE_PACKAGES.get(wanted)
    if package is None:
        raise UnsupportedError(f"transformers {transformers_version()} has no {wanted} KV-cache backend")
    raise UnsupportedError(
        f"the {wanted} KV-cache backend needs {package.name}, which is not installed: {package.install}"
    )


def continuous_batching_config(kwargs: dict[str, Any]) -> Any:
    """A ContinuousBatchingConfig of the installed transformers from the plan's keyword arguments.

    transformers 5.17 calls the page size `block_size` and has no `auto_switch_to_flash` (see pin_attention).
    Any other field this version lacks is unsupported, never dropped silently.
    """
    from transformers import ContinuousBatchingConfig

    known = {field.name for field in fields(ContinuousBatchingConfig)}
    adapted = {}
    for name, value in kwargs.items():
        renamed = _RENAMED_CONTINUOUS_FIELDS.get(name)
        if name in known:
            adapted[name] = value
        elif renamed in known:
            adapted[renamed] = value
        elif name not in _ABSENT_MEANS_DEFAULT:
            raise UnsupportedError(
                f"continuous batching option {name} is unknown to transformers {transformers_version()}; upgrade it"
            )
    return ContinuousBatchingConfig(**adapted)


def pin_attention(model: Any, kwargs: dict[str, Any]) -> str | None:
    """Keep the model's attention under continuous batching on a transformers without `auto_switch_to_flash`.

    transformers 5.17 switches sdpa or eager to flash under continuous batching whenever flash is installed,
    unless the attention is already a `paged|` one: it is set so here. Returns the attention to restore after
    the run, or None when nothing was changed.
    """
    from transformers import ContinuousBatchingConfig

    has_switch = "auto_switch_to_flash" in {field.name for field in fields(ContinuousBatchingConfig)}
    current = model.config._attn_implementation
    if kwargs.get("auto_switch_to_flash", True) or has_switch or current.startswith(PAGED):
        return None
    model.set_attn_implementation(PAGED + current)
    return current


def check_attention_kept(loaded: str, running: str) -> None:
    """Continuous batching runs the paged form of the loaded attention (eager: paged|eager), never another one."""
    if running.removeprefix(PAGED) != loaded.removeprefix(PAGED):
        raise UnsupportedError(
            f"transformers {transformers_version()} switched continuous batching from {loaded} attention to "
            f"{running}, so {loaded} cannot be measured under it here"
        )


def _refuse_known_broken_combinations(plan: Plan) -> None:
    flex = plan.load.get("attn_implementation") == "flex_attention"
    static = plan.generate.get("cache_implementation") in STATIC_CACHES
    if flex and static and transformers_version() > FLEX_STATIC_CACHE_WORKS_UNTIL:
        raise UnsupportedError(
            f"flex_attention with a static cache fails in transformers {transformers_version()} (generate() calls "
            f".contiguous() on flex's BlockMask; it works in {FLEX_STATIC_CACHE_WORKS_UNTIL}): use a dynamic cache "
            "with flex_attention, or another attention with a static cache",
            combination=True,
        )
