"""A configuration as users deploy it: its figures against the baseline and the reference, where it holds them (its
capacity), and its code. `autotune best` prints one; each card of the report's Pareto front is one with its capacity
curve (autotune.report.data.ParetoCard).

The card's sentences are made here, for the terminal and the page alike: nothing here draws or writes HTML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.analysis.capacity import AtCapacity
from autotune.figures.metrics import (
    ACHIEVED_BANDWIDTH,
    COST_PER_MILLION_TOKENS,
    ENERGY_PER_TOKEN,
    GOODPUT_TOKENS,
    KL_DIVERGENCE,
    PEAK_MEMORY,
    PEAK_MEMORY_BYTES,
    PERPLEXITY,
    PERPLEXITY_DELTA,
    PREFIX_HIT_RATE,
    REQUESTS_SERVED,
    ROOFLINE_FRACTION,
    THROUGHPUT,
    TOKENS_GENERATED,
    TOP1_AGREEMENT,
    TPOT,
    TTFT,
    WASTED_SHARE,
    on_cards,
)
from autotune.figures.quality import path_note
from autotune.report.snippets import Batch, json_snippet, python_snippet, serve_command
from autotune.space.knobs.batching import paged_cache_for
from autotune.space.plan import Plan
from autotune.study import StudySettings, TrialRecord
from autotune.units import format_bytes


@dataclass(frozen=True)
class DeployCard:
    """A measured configuration, with the figures users decide from and the code to deploy it."""

    record: TrialRecord
    speedup: float | None  # throughput / baseline throughput
    memory_saving: float | None  # 1 - memory / baseline memory
    kl: float | None  # KL(reference ‖ this), nats per token; 0 for the reference itself
    top1_loss: float | None  # 1 - top-1 agreement with the reference
    perplexity_change: float | None  # perplexity / reference perplexity - 1
    roofline_fraction: float | None  # share of the profile's peak memory bandwidth, where measured
    achieved_bandwidth_gb_s: float | None
    cost_per_million_tokens_usd: float | None
    python: str
    serve: str
    json: str
    at_capacity: AtCapacity | None = None  # a trial that probed its capacity: where it is, what it carries there
    baseline_capacity: AtCapacity | None = None  # the baseline's, which the speedup and memory saving compare with

    def baseline_words(self) -> str:
        """Where the baseline's figures that the ratios compare with were measured, when it probed a capacity."""
        found = self.baseline_capacity
        if found is None:
            return ""
        if found.size is None:
            return f", which meets the SLO at no {found.unit.name} (its figures are past the SLO)"
        return f" at its own capacity ({found.unit.size_text(found.size)})"


def model_id_for_code(settings: StudySettings) -> str:
    """The id to paste: the user's hub id or path; the demo model's cached folder for `demo`."""
    if settings.model == "demo":
        return settings.prepared.model_path or "demo"
    return settings.model


def deploy_card(
    record: TrialRecord, settings: StudySettings, baseline: TrialRecord | None, capacities: Mapping[int, AtCapacity]
) -> DeployCard:
    """Figures against the baseline and the reference, and the snippets, for one measured configuration; `capacities`:
    each trial's capacity, where it probed one (analysis.capacity.capacities, computed once)."""
    found = capacities.get(record.number)
    batch = _chosen_batch(found)
    plan = record.plan or Plan()
    plan = paged_cache_for(plan, batch.size) if batch else plan  # sized for the batch chosen, not the largest tried
    model_id = model_id_for_code(settings)
    device = settings.prepared.device or "cuda"
    m = record.metrics
    # serve trials: the command that ran (its host and port included) and the load it held, else the plan's
    deployed = record.details.deployed_command(record.capacity) if record.details else None
    served = deployed if deployed is not None else serve_command(model_id, plan, device, batch)
    return DeployCard(
        record=record,
        speedup=_ratio(record, baseline, THROUGHPUT.name),
        memory_saving=_saving(record, baseline),
        kl=m.get(KL_DIVERGENCE.name),
        top1_loss=None if m.get(TOP1_AGREEMENT.name) is None else 1 - m[TOP1_AGREEMENT.name],
        perplexity_change=_perplexity_change(m, settings),
        # A CPU profile's peak bandwidth is nominal, not this machine's: a share of it would not be true.
        roofline_fraction=m.get(ROOFLINE_FRACTION.name) if settings.device_type != "cpu" else None,
        achieved_bandwidth_gb_s=m.get(ACHIEVED_BANDWIDTH.name),
        cost_per_million_tokens_usd=m.get(COST_PER_MILLION_TOKENS.name),
        python=python_snippet(model_id, plan, device, settings.workload.output_len, batch),
        serve=served,
        json=json_snippet(model_id, record.config, plan, found.to_json() if found else None),
        at_capacity=found,
        baseline_capacity=capacities.get(baseline.number) if baseline else None,
    )


def _perplexity_change(m: dict[str, float], settings: StudySettings) -> float | None:
    """Perplexity against the reference's on the text this trial judged (its delta), else on all of it (studies
    before the delta)."""
    perplexity, delta = m.get(PERPLEXITY.name), m.get(PERPLEXITY_DELTA.name)
    reference = perplexity - delta if perplexity and delta is not None else settings.prepared.reference_perplexity
    return perplexity / reference - 1 if perplexity and reference else None


def _chosen_batch(found: AtCapacity | None) -> Batch | None:
    """The batch a probe chose, for the snippets: where the size is a number of prompts at once."""
    if found is None or found.size is None or not found.unit.prompts_at_once:
        return None
    return Batch(int(found.size), found.capacity_line())


def _ratio(record: TrialRecord, baseline: TrialRecord | None, metric: str) -> float | None:
    if baseline is None or not baseline.metrics.get(metric) or record.metrics.get(metric) is None:
        return None
    return record.metrics[metric] / baseline.metrics[metric]


def _saving(record: TrialRecord, baseline: TrialRecord | None) -> float | None:
    ratio = _ratio(record, baseline, PEAK_MEMORY.name)
    return None if ratio is None else 1 - ratio


# ------------------------------------------------------------------------------------------ sentences


def card_facts(card: DeployCard) -> list[str]:
    """The card's figures as sentences: speed and memory vs the baseline, quality vs the reference. With a capacity,
    first where it is and why the probe stopped there, and beside each figure measured there, the size and the SLO."""
    m = card.record.metrics
    found = card.at_capacity
    at = f" at {found.where}" if found is not None and found.size is not None else ""
    facts = [found.capacity_line()] if found is not None else []
    facts += [speed_fact(card, at), memory_fact(card, at), quality_fact(card), bandwidth_fact(card, at)]
    if found is not None:
        facts.append(found.figures_line())  # per device, per hour, per million tokens, at its capacity
    elif card.cost_per_million_tokens_usd is not None:
        facts.append(f"${card.cost_per_million_tokens_usd:.4g} per 1M generated tokens")
    ttft, per_token = m.get(TTFT.name, math.nan) * 1000, m.get(TPOT.name, math.nan) * 1000
    facts.append(f"ttft {ttft:.1f} ms, {per_token:.2f} ms/token{at}")
    facts.append(traffic_fact(m))
    if card.record.details is not None:
        facts += card.record.details.facts(m)
    elif ENERGY_PER_TOKEN.name in m:
        facts.append(f"{m[ENERGY_PER_TOKEN.name]:.3g} J per generated token (GPU energy counter)")
    return [fact for fact in facts if fact]


def speed_fact(card: DeployCard, at: str = "") -> str:
    """ "812.3 tok/s at batch 16 within itl_p95<=6ms: 1.52× the baseline's throughput"."""
    speed = f"{card.record.metrics[THROUGHPUT.name]:.1f} tok/s{at}"
    if card.speedup is not None:
        speed += f": {card.speedup:.2f}× the baseline's throughput{card.baseline_words()}"
    return speed


def traffic_fact(m: Mapping[str, float]) -> str:
    """ "replaying the trace: 64 requests and 4096 tokens each time, goodput 812.3 tok/s, 38.0% of decode steps on
    rows whose request had ended, prefix hits 22.0% of input tokens"; "" for a trial of one shape."""
    if REQUESTS_SERVED.name not in m:
        return ""
    said = [f"{m[REQUESTS_SERVED.name]:.0f} requests and {m.get(TOKENS_GENERATED.name, 0):.0f} tokens each time"]
    said += [f"goodput {GOODPUT_TOKENS.text(m)} tok/s"] if GOODPUT_TOKENS.measured(m) else []
    said += (
        [f"{WASTED_SHARE.text(m)} of decode steps on rows whose request had ended"] if WASTED_SHARE.measured(m) else []
    )
    said += [f"prefix hits {PREFIX_HIT_RATE.text(m)} of input tokens"] if PREFIX_HIT_RATE.measured(m) else []
    return "replaying the trace: " + ", ".join(said)


def memory_fact(card: DeployCard, at: str = "") -> str:
    m = card.record.metrics
    memory = f"peak memory {format_bytes(m.get(PEAK_MEMORY_BYTES, m[PEAK_MEMORY.name] * 1e9))}{at}"
    if card.memory_saving is not None:
        memory += f": {_memory_vs_baseline(card.memory_saving)}{card.baseline_words()}"
    return memory


def quality_fact(card: DeployCard) -> str:
    """KL, top-1 disagreement, perplexity, then the figures each metric puts on a card (the agreements with the
    reference's greedy tokens), clause by clause, and the path they came from."""
    quality = f"quality loss vs the reference: KL {card.kl:.2e} nats/token" if card.kl is not None else ""
    if card.top1_loss is not None:
        quality += f", top-1 disagreement {card.top1_loss * 100:.1f}%"
    if card.perplexity_change is not None:
        quality += f", perplexity {_signed_percent(card.perplexity_change)}"
    for clause, words in card_clauses(card.record.metrics).items():
        quality += f"; {clause}: {', '.join(words)}"
    if note := path_note(card.record.quality_path):
        quality += f" ({note})"
    return quality


def card_clauses(m: dict[str, float]) -> dict[str, list[str]]:
    """The figures a trial measured that a card shows, in words, by the clause they join (in the metrics' order)."""
    clauses: dict[str, list[str]] = {}
    for metric in on_cards():
        if metric.measured(m):
            clauses.setdefault(metric.card_clause, []).append(metric.card.format(metric.text(m)))
    return clauses


def bandwidth_fact(card: DeployCard, at: str = "") -> str:
    """Decode's achieved memory bandwidth, and its share of the profile's peak where that peak is real."""
    bandwidth = card.achieved_bandwidth_gb_s
    if bandwidth is None:
        return ""
    achieved = f"{bandwidth:.3g} GB/s of memory bandwidth achieved in decode{at}"
    if card.roofline_fraction is None:
        return achieved
    return f"{achieved}, {card.roofline_fraction * 100:.2g}% of the profile's peak (the roofline)"


def _memory_vs_baseline(saving: float) -> str:
    """saving = 1 - memory / baseline memory, as words whose sign matches them."""
    percent = f"{abs(saving) * 100:.0f}%"
    if percent == "0%":
        return "the same as the baseline's"
    return f"{percent} less than the baseline's" if saving > 0 else f"{percent} more than the baseline's"


def _signed_percent(fraction: float) -> str:
    text = f"{fraction * 100:+.2f}%"
    return "0.00%" if text in ("+0.00%", "-0.00%") else text
