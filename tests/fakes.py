"""Studies with known figures, written through Optuna's own API into a real SQLite file.

The trials carry the same user attributes `autotune search` stores (config, roles, outcome, metrics,
plan, ...), so the report and `autotune best` read them exactly as they read a real study.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune import study as studies
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.space import Target, build_plan, config_key, load_space
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


def settings(constraints: list[str] | None = None, model: str = "org/model") -> StudySettings:
    return StudySettings(
        model=model,
        revision=None,
        profile=PROFILES["a10g"].to_json(),
        space_fingerprint=SPACE.fingerprint(),
        space=SPACE.to_json(),
        workload={"batch_size": 8, "input_len": 128, "output_len": 64},
        quality={},
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


def new_study(path: Path, name: str = "fake", constraints: list[str] | None = None) -> tuple[optuna.Study, str]:
    url = f"sqlite:///{path}"
    study = studies.create_study(studies.open_storage(url), name, settings(constraints), seed=0)
    return study, url


def _distributions(cfg: dict[str, Any]) -> dict[str, CategoricalDistribution]:
    return {name: CategoricalDistribution(list(SPACE.knob(name).values)) for name in cfg}


def _attrs(cfg: dict[str, Any], roles: tuple[str, ...], outcome: str, duration_s: float) -> dict[str, Any]:
    return {
        "config": cfg,
        "config_key": config_key(cfg),
        "plan": build_plan(cfg, Target("cuda")).to_json(),
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
) -> None:
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            params=cfg,
            distributions=_distributions(cfg),
            values=[figures["throughput_tok_s"], figures["peak_memory_gb"], figures["kl_divergence"]],
            user_attrs={**_attrs(cfg, roles, "ok", duration_s), "metrics": figures},
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
