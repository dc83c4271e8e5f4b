"""A deployment plan: what the knobs of one configuration turn into, as plain data.

The trial worker builds real objects from a plan, and the report renders the same plan as code, so
the snippet a user copies is exactly what was measured. Values are JSON scalars, lists, dicts, or
two kinds of expressions: `Ref` (a name such as `torch.bfloat16`) and `Call` (a constructor such as
`transformers.BitsAndBytesConfig(load_in_4bit=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Batching = Literal["generate", "continuous"]

# Only names from these modules may be referenced: a plan read from storage can never import or call
# anything else. torchao: TorchAoConfig takes one of its configuration objects.
ALLOWED_MODULES = ("torch", "transformers", "torchao")


@dataclass(frozen=True)
class Ref:
    """A reference to a module attribute, e.g. Ref("torch.bfloat16")."""

    path: str

    def __post_init__(self) -> None:
        _check_path(self.path)


@dataclass(frozen=True)
class Call:
    """A constructor call; `attrs` are set on the object after construction."""

    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_path(self.path)


def _check_path(path: str) -> None:
    if path in _CHECKED_PATHS:  # plans name the same few paths again and again
        return
    module = path.split(".", 1)[0]
    if module not in ALLOWED_MODULES or "." not in path:
        raise ValueError(f"plan may only reference torch.*, transformers.* or torchao.* names, got {path!r}")
    _CHECKED_PATHS.add(path)


_CHECKED_PATHS: set[str] = set()


@dataclass(frozen=True)
class WorkerHook:
    """The trial worker's code a knob's value needs beyond the plan's arguments: the module a knob's handler names
    (`Knob.worker_hook`, run by autotune/worker/hooks.py), and the value it runs for (None in plans stored before
    hooks carried their value, read by autotune/study/migrations.py)."""

    module: str
    value: str | int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "value": self.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerHook:
        return cls(data["module"], data.get("value"))


@dataclass
class Plan:
    """Arguments of from_pretrained, generate / generate_batch, and `transformers serve` flags; and, by knob, the
    worker code a value needs beyond them (a decoding loop given to generate() as custom_generate)."""

    load: dict[str, Any] = field(default_factory=dict)
    generate: dict[str, Any] = field(default_factory=dict)
    batching: Batching = "generate"
    continuous: dict[str, Any] = field(default_factory=dict)
    serve_flags: list[str] = field(default_factory=list)
    not_servable: list[str] = field(default_factory=list)
    contexts: list[Call] = field(default_factory=list)  # context managers generate() runs inside, outermost first
    workload: str | None = None  # the workload kind that measures it; None in plans stored before it was here
    worker_hooks: dict[str, WorkerHook] = field(default_factory=dict)  # knob -> the worker code its value needs

    @property
    def quantized_kv_cache(self) -> bool:
        return self.generate.get("cache_implementation") == "quantized"

    @property
    def compiles(self) -> bool:
        """generate() compiles the decoding step (a compile knob asked for it)."""
        return "compile_config" in self.generate

    def to_json(self) -> dict[str, Any]:
        hooks = {knob: hook.to_json() for knob, hook in self.worker_hooks.items()}
        return ({"worker_hooks": hooks} if hooks else {}) | {
            "contexts": encode(self.contexts),
            "load": encode(self.load),
            "generate": encode(self.generate),
            "batching": self.batching,
            "continuous": encode(self.continuous),
            "serve_flags": list(self.serve_flags),
            "not_servable": list(self.not_servable),
            "workload": self.workload,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            load=decode(data["load"]),
            generate=decode(data["generate"]),
            batching=data["batching"],
            continuous=decode(data["continuous"]),
            serve_flags=list(data.get("serve_flags", [])),
            not_servable=list(data.get("not_servable", [])),
            contexts=decode(data.get("contexts", [])),
            workload=data.get("workload"),
            worker_hooks={knob: WorkerHook.from_json(hook) for knob, hook in data.get("worker_hooks", {}).items()},
        )


def encode(value: Any) -> Any:
    """Plan value -> JSON-compatible value."""
    if isinstance(value, Ref):
        return {"$ref": value.path}
    if isinstance(value, Call):
        return {"$call": value.path, "kwargs": encode(value.kwargs), "attrs": encode(value.attrs)}
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    return value


def decode(value: Any) -> Any:
    """JSON-compatible value -> plan value."""
    if isinstance(value, dict):
        if "$ref" in value:
            return Ref(value["$ref"])
        if "$call" in value:
            return Call(value["$call"], decode(value.get("kwargs", {})), decode(value.get("attrs", {})))
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def plain(value: Any) -> Any:
    """Plan value -> readable JSON: references as their dotted name, calls as {"class": ..., **kwargs}."""
    if isinstance(value, Ref):
        return value.path
    if isinstance(value, Call):
        return {"class": value.path, **plain(value.kwargs), **plain(value.attrs)}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def render(value: Any) -> str:
    """Plan value -> Python source."""
    if isinstance(value, Ref):
        return value.path
    if isinstance(value, Call):
        args = ", ".join(f"{key}={render(item)}" for key, item in value.kwargs.items())
        return f"{_callable_name(value.path)}({args})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {render(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render(item) for item in value) + "]"
    return repr(value)


def _callable_name(path: str) -> str:
    """transformers names are imported by name (see imports_of); torch ones are written in full after `import torch`."""
    return path.split(".", 1)[1] if path.startswith("transformers.") else path


def imports_of(values: list[Any]) -> set[str]:
    """The `from transformers import X` names that rendering these values needs."""
    names: set[str] = set()
    for value in values:
        if isinstance(value, Call):
            if value.path.startswith("transformers."):
                names.add(value.path.split(".")[1])  # AutoModelForCausalLM of AutoModelForCausalLM.from_pretrained
            names |= imports_of(list(value.kwargs.values()) + list(value.attrs.values()))
        elif isinstance(value, dict):
            names |= imports_of(list(value.values()))
        elif isinstance(value, list | tuple):
            names |= imports_of(list(value))
    return names


def modules_to_import(values: list[Any]) -> set[str]:
    """The `import X` lines (torchao's) that rendering these values needs, beside torch and transformers."""
    modules: set[str] = set()
    for value in values:
        if isinstance(value, Ref | Call) and value.path.startswith("torchao."):
            modules.add(value.path.rsplit(".", 1)[0])
        if isinstance(value, Call):
            modules |= modules_to_import(list(value.kwargs.values()) + list(value.attrs.values()))
        elif isinstance(value, dict):
            modules |= modules_to_import(list(value.values()))
        elif isinstance(value, list | tuple):
            modules |= modules_to_import(list(value))
    return modules


def uses_torch(values: list[Any]) -> bool:
    for value in values:
        if isinstance(value, Ref) and value.path.startswith("torch."):
            return True
        if isinstance(value, Call) and value.path.startswith("torch."):
            return True
        if isinstance(value, Call) and uses_torch(list(value.kwargs.values()) + list(value.attrs.values())):
            return True
        if isinstance(value, dict) and uses_torch(list(value.values())):
            return True
    return False
