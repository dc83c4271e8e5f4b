"""Plans are written with the newest transformers API; this renames their arguments for the installed version.

Only renames (and their equivalents where an option is missing): what cannot run in this environment at all
is refused by autotune/space/rules.py before the model loads.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import fields
from typing import Any

from packaging.version import Version

from autotune.worker.failures import UnsupportedError

# Renamed in later transformers: the plan uses the newest names, older versions get theirs.
_RENAMED_CONTINUOUS_FIELDS = {"page_size": "block_size"}
# Options an older version does not have; what they do is done another way there (see pin_attention).
_ABSENT_MEANS_DEFAULT = {"auto_switch_to_flash"}
PAGED = "paged|"  # the prefix of the attention implementations that read a paged cache


def transformers_version() -> Version:
    return Version(importlib.metadata.version("transformers"))


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
