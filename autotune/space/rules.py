"""What can run where, decided in this one module from rules written down as data.

Where each kind of rule is written:
- what one knob value needs from the hardware (CUDA, a compute capability, several GPUs, a CPU whose matmuls
  it changes): its handler's `needs` in autotune/space/knobs/; checked against the hardware profile, and against
  what this machine answers for itself (Host), before the study starts;
- what one value needs installed in the trial's environment, from which version ("an fp8 KV-cache backend
  from transformers 5.22"): its handler's `requires`; checked by the trial worker before it loads anything;
- the values a workload could only see refused (assisted decoding on a batch): its handler's `refused`;
- the combinations of knobs never launched: the `rules:` of the space YAML, the user's own to edit
  (SearchSpace.violation);
- the combinations a range of library versions breaks, and what no plan can do whichever knobs ask for it:
  BROKEN_TOGETHER and plan_problem, below; the plans one value cannot run in: its handler's `refuses`;
- which values run a path that differs by transformers version: their handlers' `depends_on_version`.

A value or a combination that cannot run is removed, skipped or refused with the rule's reason, and never
measured as something else. autotune/worker/compat.py only renames arguments between transformers versions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from packaging.version import Version

from autotune import extras
from autotune.extras import Package
from autotune.space.knobs import KNOBS, DeviceType, Needs, Requires, Target, Value
from autotune.space.plan import Plan
from autotune.workloads import DEFAULT_KIND, KINDS

CPU_RANKS_AT_MOST = 2  # tensor-parallel ranks on the cpu profile: enough to prove the path, not a deployment


class Profile(Protocol):
    """The hardware a study is for (autotune.profiles.HardwareProfile)."""

    name: str
    device_type: DeviceType
    compute_capability: float | None


class Host(Protocol):
    """What this machine answers for itself (autotune.profiles: NVML, and a probe run in the trial worker's torch)."""

    def visible_gpus(self) -> int: ...

    def bf16_changes_fp32_matmuls(self) -> bool: ...


@dataclass(frozen=True)
class Refused:
    """Why the trial worker cannot run a configuration here."""

    message: str
    knob: str | None = None  # the knob whose value is refused; None: a combination, no single value to blame
    value: Value | None = None


@dataclass(frozen=True)
class BrokenTogether:
    """Knob values that work apart and fail together in the versions of a package after `last_working`."""

    forbid: Mapping[str, tuple[Value, ...]]
    package: str
    last_working: str
    what: str
    why: str
    instead: str

    def matches(self, config: Mapping[str, Value]) -> bool:
        return all(config.get(name) in values for name, values in self.forbid.items())


BROKEN_TOGETHER = (
    # Seen failing on 5.22.2 and 5.23.0, working on 5.17.0 (the versions between them not tried).
    BrokenTogether(
        {"attn_implementation": ("flex_attention",), "cache_implementation": ("static", "offloaded_static")},
        "transformers",
        last_working="5.17.0",
        what="flex_attention with a static cache",
        why="generate() calls .contiguous() on flex's BlockMask",
        instead="use a dynamic cache with flex_attention, or another attention with a static cache",
    ),
)


# ---------------------------------------------------------------------------------- before the study


def needs_of(knob: str, value: Value) -> Needs:
    handler = KNOBS[knob]
    if value in handler.needs:
        return handler.needs[value]
    unlisted = handler.choices is not None and value not in handler.choices
    return (handler.unlisted_values_need if unlisted else None) or Needs()


def hardware_problem(knob: str, value: Value, profile: Profile, host: Host) -> str | None:
    """Why this profile cannot run the value, or None; `host` answers for the machine the trials run on."""
    needs = needs_of(knob, value)
    if profile.device_type != "cuda":
        return _cpu_problem(needs, host)
    if needs.gpus > 1 and needs.gpus > host.visible_gpus():
        return f"{needs.why} (this machine has {host.visible_gpus()})"
    capability = profile.compute_capability or 0.0
    if needs.min_compute_capability and capability < needs.min_compute_capability:
        return f"{needs.why} ({profile.name} has {capability})"
    if needs.below_compute_capability and capability >= needs.below_compute_capability:
        return f"{needs.why} ({profile.name} has {capability})"
    return None


def _cpu_problem(needs: Needs, host: Host) -> str | None:
    if needs.gpus > CPU_RANKS_AT_MOST:
        return f"the cpu profile runs at most {CPU_RANKS_AT_MOST} gloo ranks (they share this host's cores)"
    if needs.cuda:
        return f"needs a CUDA GPU ({needs.why})"
    if needs.device_runs_ahead:
        return f"changes nothing on a CPU: {needs.why}"
    if needs.bf16_matmuls and not host.bf16_changes_fp32_matmuls():
        return needs.why
    return None  # compute capabilities concern GPUs only


def left_out_for_this_machine(knob: str, value: Value, reason: str) -> bool:
    """Whether `reason` is what this machine answered for the value (a search and a dry run say so)."""
    needs = needs_of(knob, value)
    return needs.bf16_matmuls and reason == needs.why


def why_not_installed(knob: str, value: Value) -> str | None:
    """Why the value is not searched here: the line naming the package it needs and the extra that installs it,
    where that package cannot be found (found without importing it); else None. Versions: the trial worker's."""
    package = missing_package(knob, value)
    return extras.why_missing(f"{knob}={value}", [package]) if package else None


def missing_package(knob: str, value: Value) -> Package | None:
    """The package the value needs that cannot be found here, or None."""
    requirement = _requires(knob).get(value)
    if requirement is None or extras.installed(_package(requirement).module):
        return None
    return _package(requirement)


def _package(requirement: Requires) -> Package:
    return Package(requirement.import_name, requirement.package, requirement.extra)


def workload_problem(knob: str, value: Value, target: Target) -> str | None:
    """Why a search for this workload never plans the value (it could only be refused), or None."""
    for refusal in KNOBS[knob].refused:
        if value in refusal.values and target.requests > refusal.most_requests:
            return f"{refusal.why}; this workload batches {target.requests}"
    return None


def unmeasurable(plan: Plan) -> str | None:
    """Why the workload kind that measures this plan cannot (serve: knobs `transformers serve` has no flag for)."""
    return KINDS[plan.workload or DEFAULT_KIND].plan_problem(plan.not_servable)


# --------------------------------------------------------------------------------- in the trial worker


def requirements(config: Mapping[str, Value]) -> list[Requires]:
    """The packages the configuration's values need, each once."""
    found = [KNOBS[name].requires[value] for name, value in config.items() if value in _requires(name)]
    return list(dict.fromkeys(found))


def _requires(name: str) -> Mapping[Value, Requires]:
    return KNOBS[name].requires if name in KNOBS else {}


def installation_problem(config: Mapping[str, Value], installed: Callable[[Requires], str | None]) -> Refused | None:
    """Why this environment cannot run the configuration, or None. `installed` gives a package's version, or
    None when it cannot be imported."""
    for name, value in config.items():
        requirement = _requires(name).get(value)
        if requirement is None:
            continue
        version = installed(requirement)
        if version is None:
            package = _package(requirement)
            message = f"{name}={value} needs {package.name}, which is not installed: {package.install}"
            return Refused(message, name, value)
        if requirement.since and Version(version) < Version(requirement.since):
            package, since = requirement.package, requirement.since
            message = f"{package} {version} has no {requirement.what} (it has from {since}): upgrade {package}"
            return Refused(f"{name}={value}: {message}", name, value)
    for broken in BROKEN_TOGETHER:
        version = installed(Requires(broken.package))
        if broken.matches(config) and version is not None and Version(version) > Version(broken.last_working):
            return Refused(
                f"{broken.what} fails in {broken.package} {version} ({broken.why}; it works in "
                f"{broken.last_working}): {broken.instead}"
            )
    return None


def plan_problem(config: Mapping[str, Value], plan: Plan) -> Refused | None:
    """What no plan can do, whichever knobs asked for it, or what a value's handler refuses of the plan the others
    built (Knob.refuses: a combination, the value runs in other plans); None when it can run."""
    if plan.batching == "continuous" and plan.contexts:
        names = ", ".join(call.path for call in plan.contexts)
        return Refused(f"continuous batching generates in its own thread, which {names} entered here does not reach")
    for name, value in config.items():
        if name in KNOBS and (why := KNOBS[name].refuses(value, plan)) is not None:
            return Refused(why)
    if "assistant_model" in plan.generate and plan.generate["assistant_model"] is None:
        message = "speculative=assistant needs a draft model: give --assistant-model (a hub id or folder)"
        return Refused(message, "speculative", "assistant")
    return None


def depends_on_version(config: Mapping[str, Value]) -> bool:
    """Whether running this configuration goes through a path that differs by transformers version or by the
    packages beside it: a value whose handler says so (Knob.depends_on_version: a value with requirements, what
    autotune/worker/compat.py renames, hub kernels, a decoding loop of autotune's, ...), or a combination broken in
    some versions (above). Version conformance runs these cases on the lowest supported transformers on every CI run.
    """
    by_value = any(name in KNOBS and KNOBS[name].depends_on_version(value) for name, value in config.items())
    return by_value or any(broken.matches(config) for broken in BROKEN_TOGETHER)
