"""The worker hook of use_kernels (autotune/worker/hooks.py): transformers swaps a layer's forward for a hub kernel,
or silently keeps its own.

from_pretrained(use_kernels=True) kernelizes with every fallback on: a layer with no kernel mapped for the
device, or whose kernel cannot be fetched (offline), keeps its original forward without a word. A trial
that asked for hub kernels and runs none is `unsupported`, never measured as if it had them.
"""

from __future__ import annotations

from typing import Any

from autotune.worker.failures import UnsupportedError


def before_load(knob: str) -> None:
    """The installed transformers must accept the installed kernels package (it pins a narrow range)."""
    from transformers.utils import import_utils

    if import_utils.is_kernels_available():
        return
    low = getattr(import_utils, "KERNELS_MIN_VERSION", None)
    high = getattr(import_utils, "KERNELS_MAX_VERSION", None)
    wanted = f"kernels>={low},<{high}" if low and high else "kernels"
    message = f"{knob} needs a kernels package this transformers accepts: pip install '{wanted}'"
    raise UnsupportedError(message, knob=knob)


def after_load(model: Any, knob: str) -> None:
    """Raise `unsupported` unless at least one layer of the loaded model runs a hub kernel."""
    capable = [module for module in model.modules() if hasattr(type(module), "kernel_layer_name")]
    if any(_runs_hub_kernel(module) for module in capable):
        return
    if not capable:
        message = "no hub kernel could be fetched for any layer: this model has no layer that takes one"
        raise UnsupportedError(message, knob=knob)
    names = sorted({str(type(module).kernel_layer_name) for module in capable})
    device_type = model.device.type
    raise UnsupportedError(
        f"no hub kernel could be fetched for any layer: 0 of {len(capable)} kernel-capable layers "
        f"({', '.join(names)}) run one on {device_type}; {_why_none(names, device_type)}",
        knob=knob,
    )


def _runs_hub_kernel(module: Any) -> bool:
    """kernelize binds the hub layer's forward to the module; a fallback binds the module's own class forward."""
    return getattr(module.forward, "__func__", None) is not type(module).forward


def _why_none(names: list[str], device_type: str) -> str:
    mapped = [name for name in names if _has_mapping(name, device_type)]
    if not mapped:
        return f"transformers maps none of them to a {device_type} kernel"
    listed = ", ".join(mapped)
    return f"the {device_type} kernels mapped for {listed} could not be loaded (offline, or no build for this torch)"


def _has_mapping(layer_name: str, device_type: str) -> bool:
    """Whether transformers maps this layer to a hub kernel on this device type (False where it cannot say)."""
    try:
        from transformers.integrations.hub_kernels import get_kernel_mapping_transformers
    except ImportError:  # transformers versions without it: the mapping cannot be read
        return False
    by_device = get_kernel_mapping_transformers().get(layer_name) or {}
    # Keys are device types, or kernels' Device(type=..., properties=...).
    return any(getattr(device, "type", device) == device_type for device in by_device)
