"""Studies with known figures, written through Optuna's own API into a real SQLite file.

The trials carry the same user attributes `autotune search` stores (config, roles, outcome, metrics,
plan, ...), so the report and `autotune best` read them exactly as they read a real study.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune import study as studies
from autotune.figures.capacity import Capacity, Point, Probe, SloTarget, capacity_unit, stop_of
from autotune.figures.constraints import MEETS_SLO
from autotune.figures.quality import DECODE
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.space import Target, build_plan, config_key, load_space
from autotune.specs import QualitySpec, WorkloadSpec
from autotune.study import PreparedFacts, StudySettings

SPACE = load_space(PACKAGED_SPACE)
SCRIPT = "<script>alert(1)</script>"
PASSED_OVER = "warm-up: compile=max-autotune (a trial like this may take up to 91s and 54s are left)"


def config(dtype: str = "bfloat16", **knobs: Any) -> dict[str, Any]:
    base = {
        "dtype": dtype,
        "attn_implementation": "sdpa",
        "quantization": "none",
        "batching": "generate",
        "cache_implementation": "dynamic",
    }
    return {**base, **knobs}


CUDA = Target("cuda")  # what plans are built for, unless a study says otherwise
REFERENCE = config("float32")
BASELINE = config("bfloat16")


def metrics(
    throughput: float, memory_gb: float, kl: float, top1: float, ppl: float, ttft_ms: float = 20.0, **more: float
) -> dict[str, float]:
    return {
        "throughput_tok_s": throughput,
        "peak_memory_gb": memory_gb,
        "peak_memory_bytes": memory_gb * 1e9,
        "kl_divergence": kl,
        "top1_agreement": top1,
        "perplexity": ppl,
        "perplexity_delta": ppl - 10.0,
        "ttft_s": ttft_ms / 1000,
        "tpot_s": 1 / throughput,
        **more,
    }


def settings(
    constraints: list[str] | None = None, model: str = "org/model", workload: dict[str, Any] | None = None
) -> StudySettings:
    return StudySettings(
        model=model,
        revision=None,
        profile=PROFILES["a10g"],
        space_fingerprint=SPACE.fingerprint(),
        space=SPACE.to_json(),
        workload=WorkloadSpec.from_json(workload or {"batch_size": 8, "input_len": 128, "output_len": 64}),
        quality=QualitySpec(),
        prepared=PreparedFacts(
            device="cuda",
            reference_config=REFERENCE,
            reference_perplexity=10.0,
            baseline_config=BASELINE,
            environment={"torch": "2.13.0", "transformers": "5.22.2", "gpu": "NVIDIA A10G"},
            model_info={"parameters": 1_000_000},
        ),
        constraints=constraints or [],
    )


def new_study(
    path: Path, name: str = "fake", constraints: list[str] | None = None, workload: dict[str, Any] | None = None
) -> tuple[optuna.Study, str]:
    url = f"sqlite:///{path}"
    study = studies.create_study(studies.open_storage(url), name, settings(constraints, workload=workload), seed=0)
    return study, url


def _distributions(cfg: dict[str, Any]) -> dict[str, CategoricalDistribution]:
    return {name: CategoricalDistribution(list(SPACE.knob(name).values)) for name in cfg}


def _attrs(
    cfg: dict[str, Any], roles: tuple[str, ...], outcome: str, duration_s: float, target: Target = CUDA
) -> dict[str, Any]:
    return {
        "config": cfg,
        "config_key": config_key(cfg),
        "plan": build_plan(cfg, target).to_json(),
        "roles": list(roles),
        "outcome": outcome,
        "duration_s": duration_s,
        "timings": {},
        "pid": 1234,
    }


def add_complete(
    study: optuna.Study,
    cfg: dict[str, Any],
    figures: dict[str, float],
    roles: tuple[str, ...] = ("sampler",),
    duration_s: float = 10.0,
    constraints: dict[str, float] | None = None,
    target: Target = CUDA,
    **more_attrs: Any,
) -> None:
    """`more_attrs`: further user attributes a trial stores, as `capacity` or `serve`; `quality_path=None` leaves it
    out, as studies written before the decoding path (2026-11-27) did."""
    path = {"quality_path": more_attrs.pop("quality_path", DECODE)}
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            params=cfg,
            distributions=_distributions(cfg),
            values=[figures["throughput_tok_s"], figures["peak_memory_gb"], figures["kl_divergence"]],
            user_attrs={
                **_attrs(cfg, roles, "ok", duration_s, target),
                "metrics": figures,
                **({} if path["quality_path"] is None else path),
                **more_attrs,
            },
            constraints=constraints,
        )
    )


def add_failed(
    study: optuna.Study, cfg: dict[str, Any], outcome: str, message: str, phase: str = "load", log_tail: str = ""
) -> None:
    attrs = {**_attrs(cfg, ("sampler",), outcome, 5.0), "message": message, "phase": phase, "log_tail": log_tail}
    study.add_trial(
        create_trial(state=TrialState.FAIL, params=cfg, distributions=_distributions(cfg), user_attrs=attrs)
    )


def add_skipped(study: optuna.Study, cfg: dict[str, Any], reason: str) -> None:
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params=cfg,
            distributions=_distributions(cfg),
            user_attrs={"config": cfg, "skipped": reason},
        )
    )


# The known study the data tests read. Front: #3 (fastest), #1 (baseline), #2 (leanest), #0 (exact).
COMPILED = config("bfloat16", cache_implementation="static", compile="default")
FOUR_BIT = config("bfloat16", quantization="bnb-4bit")
EAGER_FP16 = config("float16", attn_implementation="eager")
EIGHT_BIT = config("bfloat16", quantization="bnb-8bit")
CONTINUOUS = {**config("float16", batching="continuous"), "max_batch_tokens": 512}
del CONTINUOUS["cache_implementation"]


def known_study(path: Path, constraints: list[str] | None = None) -> tuple[optuna.Study, str]:
    study, url = new_study(path, constraints=constraints)
    add_complete(study, REFERENCE, metrics(100, 4.0, 0.0, 1.0, 10.0, ttft_ms=30), roles=("reference",))
    add_complete(study, BASELINE, metrics(200, 2.0, 0.001, 0.99, 10.05, ttft_ms=25), roles=("baseline",))
    add_complete(
        study,
        FOUR_BIT,
        metrics(
            150,
            1.0,
            0.05,
            0.9,
            11.0,
            ttft_ms=40,
            roofline_fraction=0.42,
            achieved_bandwidth_gb_s=252.0,
            cost_per_million_tokens_usd=0.12,
        ),
    )
    add_complete(study, COMPILED, metrics(400, 2.2, 0.001, 0.99, 10.05, ttft_ms=60))
    add_complete(study, EAGER_FP16, metrics(150, 2.1, 0.002, 0.985, 10.1, ttft_ms=10))  # dominated by #1
    add_failed(study, EIGHT_BIT, "oom", "CUDA out of memory. Tried to allocate 2.00 GiB", phase="measure")
    add_failed(study, CONTINUOUS, "error", f"ValueError: {SCRIPT}", log_tail=f"Traceback ...\n{SCRIPT}")
    add_failed(study, config("float16", quantization="bnb-4bit"), "broken", "logits are NaN", phase="quality")
    add_skipped(study, config("float32", quantization="bnb-4bit"), "rule: 4-bit needs a lower precision")
    studies.record_search_run(
        study,
        {
            "finished_at": "2026-11-21T08:00:00+00:00",
            "budget_s": 1800.0,
            "max_trials": None,
            "launched": 8,
            "elapsed_s": 95.0,
            "spent_s": {"prepare": 10.0, "measuring": 70.0, "failed": 15.0},
            "stop_reason": "budget used up",
            "passed_over": [PASSED_OVER],
        },
    )
    return study, url


# ------------------------------------------------------------------------------------------------ capacity

CAPACITY_SLO = {"itl_p95_s": 0.006}
CAPACITY_WORKLOAD = {
    "batch_size": 64,
    "input_len": 128,
    "output_len": 64,
    "batch_sizes": [1, 2, 4, 8, 16, 32, 64],
    "slo": CAPACITY_SLO,
}
CAPACITY_TARGET = Target("cuda", requests=64, tokens_per_request=192)  # plans are built for the largest batch
MEMORY_LIMIT = 3e9


@dataclass(frozen=True)
class Stack:
    """How a configuration's figures grow with the batch, for a probe with known outcomes."""

    tok_s_at_1: float
    itl_ms_at_1: float
    itl_ms_per_prompt: float
    memory_gb: float
    mb_per_prompt: float
    oom_from: int | None = None  # the batch from which it runs out of memory

    def figures(self, size: float) -> dict[str, float] | None:
        if self.oom_from is not None and size >= self.oom_from:
            return None
        tok_s = self.tok_s_at_1 * size**0.85
        return {
            "throughput_tok_s": tok_s,
            "e2e_throughput_tok_s": 0.9 * tok_s,
            "itl_p95_s": (self.itl_ms_at_1 + self.itl_ms_per_prompt * (size - 1)) / 1000,
            "ttft_p95_s": 0.02 + 0.001 * size,
            "peak_memory_bytes": (self.memory_gb + self.mb_per_prompt / 1000 * size) * 1e9,
        }


def probed(stack: Stack, slo: dict[str, float]) -> Capacity:
    """The stack's capacity as the worker's probe finds it (autotune.figures.capacity.Probe, driven as the worker
    drives it)."""
    probe = Probe(CAPACITY_WORKLOAD["batch_sizes"], slo, MEMORY_LIMIT)
    while (size := probe.next_size()) is not None:
        if (skipped := probe.too_big(size)) is not None:
            probe.add(skipped)
        elif (figures := stack.figures(size)) is None:
            probe.record_oom(size, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB")
        else:
            probe.record(size, figures)
    return probe.capacity()


def add_probed(study: optuna.Study, cfg: dict[str, Any], stack: Stack, kl: float, roles=("sampler",)) -> Capacity:
    """A complete trial whose figures are those of its chosen batch, as the throughput worker reports them."""
    capacity = probed(stack, studies.stored_settings(study).workload.slo)
    chosen = capacity.chosen or capacity.points[0]
    point = chosen.figures
    tok_s = point["throughput_tok_s"]
    figures = metrics(tok_s, point["peak_memory_bytes"] / 1e9, kl, 1 - kl, 10 + kl, ttft_ms=point["ttft_p95_s"] * 1000)
    figures |= {name: value for name, value in point.items() if name != "throughput_tok_s"}
    figures |= {"capacity": chosen.size if capacity.chosen else 0.0, "meets_slo": float(capacity.chosen is not None)}
    price = PROFILES["a10g"].price_per_hour
    figures["cost_per_million_tokens_usd"] = price / 3600 / point["e2e_throughput_tok_s"] * 1e6  # the worker's formula
    add_complete(
        study,
        cfg,
        figures,
        roles=roles,
        constraints={str(MEETS_SLO): MEETS_SLO.violation(figures)},
        target=CAPACITY_TARGET,
        capacity=capacity.to_json(),
    )
    return capacity


# Each stack stops climbing for one of the reasons: predicted not to fit in MEMORY_LIMIT (reference at 8), the SLO
# (baseline at 32, continuous batching at 64), out of memory (compiled at 64); eager fp16 meets the SLO at no batch.
STACKS = {
    "reference": Stack(40, 4.0, 0.25, 2.5, 100),
    "baseline": Stack(45, 3.0, 0.15, 2.0, 20),
    "compiled": Stack(120, 1.2, 0.1, 2.2, 10, oom_from=64),
    "continuous": Stack(60, 2.5, 0.08, 0.5, 20),
    "eager": Stack(30, 7.0, 0.2, 2.1, 20),
}


def capacity_study(
    path: Path, name: str = "capacity", slo: dict[str, float] = CAPACITY_SLO, speed: float = 1.0
) -> tuple[optuna.Study, str]:
    """A throughput study that searched batches 1-64 within an SLO (itl_p95<=6ms) on an A10G profile, a probe per
    trial; `speed` scales every stack's tokens/s (not its latency: the same batches meet the SLO)."""
    study, url = new_study(path, name, workload={**CAPACITY_WORKLOAD, "slo": slo})
    for cfg, stack, kl, roles in (
        (REFERENCE, "reference", 0.0, ("reference",)),
        (BASELINE, "baseline", 0.001, ("baseline",)),
        (COMPILED, "compiled", 0.001, ("sampler",)),
        (CONTINUOUS, "continuous", 0.002, ("sampler",)),
        (EAGER_FP16, "eager", 0.002, ("sampler",)),
    ):
        scaled = replace(STACKS[stack], tok_s_at_1=STACKS[stack].tok_s_at_1 * speed)
        add_probed(study, cfg, scaled, kl, roles)
    return study, url


SERVE_SLO = {"ttft_p95_s": 0.3, "itl_p95_s": 0.05}
SERVE_WORKLOAD = {
    "kind": "serve",
    "batch_size": 16,
    "input_len": 128,
    "output_len": 64,
    "slo": SERVE_SLO,
    "serve": {"mode": "rate", "levels": [], "bracket": [1.0, 64.0]},
}
SERVE_COMMAND = "transformers serve org/model --dtype bfloat16 --continuous-batching --device cuda:0 --port 8123"


def served_point(rate: float, share: float, verdict: str) -> Point:
    """A load level as the serve trial stores it in its capacity: rates, goodput, the share within the SLO, latency."""
    done = min(rate, 10.0)
    figures = {
        "requests_per_s": done,
        "goodput_req_s": done * share,
        "output_tok_s": done * 64,
        "slo_share": share,
        "ttft_p95_s": 0.05 + 0.02 * rate,
        "itl_p95_s": 0.01 + 0.003 * rate,
        "peak_memory_bytes": 3e9,
    }
    reason = "" if verdict == "met" else f"{share:.0%} of requests within the SLO < 95%"
    return Point(rate, verdict, figures, reason)  # type: ignore[arg-type]


def serve_capacity_study(path: Path) -> tuple[optuna.Study, str]:
    """A serve study that bracketed the request rate within ttft_p95<=300ms,itl_p95<=50ms for 95% of requests: one
    configuration, 1-8 requests/s sustained, 16 refused, then 12 refused by bisection."""
    study, url = new_study(path, "serve-capacity", workload=SERVE_WORKLOAD)
    cfg = config("bfloat16", batching="continuous")
    del cfg["cache_implementation"]
    shares = {1.0: 1.0, 2.0: 1.0, 4.0: 1.0, 8.0: 0.97, 12.0: 0.81, 16.0: 0.4}
    points = [served_point(rate, share, "met" if share >= 0.95 else "slo") for rate, share in shares.items()]
    capacity = Capacity(capacity_unit("rate"), SloTarget(SERVE_SLO, 0.95), points, stop_of(points))
    chosen = points[3].figures
    figures = metrics(chosen["output_tok_s"], 3.0, 0.001, 0.99, 10.05, ttft_ms=120)
    figures |= {"goodput_req_s": chosen["goodput_req_s"], "requests_per_s": 10.0, "errors": 0.0}
    figures |= {"e2e_throughput_tok_s": 640.0, "capacity": 8.0, "meets_slo": 1.0}  # the best level's rate: 16/s
    levels = [{"load": p.size, **p.figures, "slo_met": p.verdict == "met"} for p in points]
    add_complete(
        study,
        cfg,
        figures,
        roles=("baseline",),
        constraints={str(MEETS_SLO): 0.0},
        capacity=capacity.to_json(),
        serve={
            "command": SERVE_COMMAND,
            "argv": shlex.split(SERVE_COMMAND),
            "mode": "rate",
            "slo": SERVE_SLO,
            "levels": levels,
        },
    )
    return study, url
