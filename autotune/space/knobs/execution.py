"""How the forward pass and the trial run: hub kernels for layers, the grad mode around generate(), the workload."""

from __future__ import annotations

from autotune.space.knobs.base import NEUTRAL, DeviceType, Expectation, Knob, Target, Value, register
from autotune.space.plan import Call, Plan
from autotune.workloads import KINDS


@register
class UseKernelsKnob(Knob):
    name = "use_kernels"
    worker_hook = "autotune.worker.hub_kernels"
    help = "hub kernels (the kernels package) for the layers transformers maps to one, e.g. RMSNorm on CUDA"
    short_name = "kernels"
    choices = ("off", "on")
    default = "off"

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        if value == "on" and device == "cuda":
            return Expectation(speed=1.05, spread=0.2)  # fused kernels for mapped layers [overview]
        return NEUTRAL

    def depends_on_version(self, value: Value) -> bool:
        """Each transformers pins the kernels package it accepts, and maps its own layers to hub kernels."""
        return value == "on" or super().depends_on_version(value)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "off":
            return
        plan.load["use_kernels"] = True
        # transformers falls back to its own layers without a word: the hook checks one runs a kernel
        self.hook(plan, value)
        plan.not_servable.append("use_kernels=on (serve loads the model without hub kernels)")


@register
class ExecutionModeKnob(Knob):
    name = "execution_mode"
    help = "no_grad: generate() as it is (it runs under torch.no_grad); inference_mode: inside torch.inference_mode()"
    choices = ("no_grad", "inference_mode")
    default = "no_grad"  # generate() as it is

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        if value == "inference_mode":
            return Expectation(speed=1.05, spread=0.15)  # 5-17% on CPU (api-facts, optimum-benchmark) [perf]
        return NEUTRAL

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        if value == "inference_mode":
            plan.contexts.append(Call("torch.inference_mode"))
            plan.not_servable.append("execution_mode=inference_mode (serve calls generate() as it is)")


@register
class WorkloadKnob(Knob):
    name = "workload"
    help = "how a trial is measured: " + ", ".join(f"{kind.name} ({kind.help})" for kind in KINDS.values())
    choices = tuple(KINDS)

    def usual_values(self) -> tuple[Value, ...]:
        return self.choices  # the study's workload, whichever it is

    def expect(self, value: Value, device: DeviceType) -> Expectation:
        """Against a throughput trial: what is deployed stays the same, how long measuring it takes does not."""
        return Expectation(time=KINDS[str(value)].time_factor, spread=0.2)

    def apply(self, value: Value, plan: Plan, target: Target) -> None:
        """How the configuration is measured; what is deployed stays the same."""
        plan.workload = str(value)
