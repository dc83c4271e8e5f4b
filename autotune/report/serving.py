"""The serve workload in the report: latency against load for one configuration, as an HTML table, and the command
that ran with the limits it was measured to hold."""

from __future__ import annotations

from html import escape
from typing import Any

from autotune.figures.metrics import (
    E2E_P95,
    ENERGY_PER_TOKEN,
    ERRORS,
    GOODPUT,
    IN_FLIGHT_PEAK,
    ITL_P95,
    OUTPUT_TOK_S,
    PEAK_MEMORY_BYTES,
    REQUESTS_PER_S,
    SLO_SHARE,
    TTFT_P50,
    TTFT_P95,
)
from autotune.figures.slo import describe_slo
from autotune.units import format_bytes
from autotune.workloads.capacity import Capacity

_COLUMNS = (
    ("completed req/s", REQUESTS_PER_S.name, 1.0, "{:.2f}"),
    ("goodput req/s", GOODPUT.name, 1.0, "{:.2f}"),
    ("output tok/s", OUTPUT_TOK_S, 1.0, "{:.1f}"),
    ("TTFT p50 ms", TTFT_P50, 1000.0, "{:.1f}"),
    ("TTFT p95 ms", TTFT_P95, 1000.0, "{:.1f}"),
    ("ITL p95 ms", ITL_P95, 1000.0, "{:.2f}"),
    ("e2e p95 ms", E2E_P95, 1000.0, "{:.0f}"),
    ("in flight at most", IN_FLIGHT_PEAK, 1.0, "{:.0f}"),
    ("errors", ERRORS.name, 1.0, "{:.0f}"),
    ("within the SLO", SLO_SHARE, 100.0, "{:.1f}%"),
)


def load_facts(serve: dict[str, Any], metrics: dict[str, float]) -> list[str]:
    """Sentences for a serve trial's card: goodput under the SLOs, errors, energy where measured."""
    slo = describe_slo(serve.get("slo") or {}) or "no SLO given: every completed request counts"
    facts = [f"goodput {metrics.get(GOODPUT.name, 0.0):.2f} req/s ({slo}), {metrics.get(ERRORS.name, 0):.0f} failed"]
    if ENERGY_PER_TOKEN.name in metrics:
        facts.append(f"{metrics[ENERGY_PER_TOKEN.name]:.3g} J per generated token (GPU energy counter)")
    return facts


def load_table(serve: dict[str, Any]) -> str:
    """One row per load level: what was offered and the latency the server answered with."""
    offered = "requests/s offered" if serve.get("mode") == "rate" else "concurrent clients"
    labels = (offered, *(c[0] for c in _COLUMNS), "peak memory", "SLO met")
    header = "".join(f"<th>{escape(label)}</th>" for label in labels)
    rows = []
    for level in serve.get("levels", []):
        cells = [f"{level['load']:g}"]
        cells += [_cell(level.get(key), scale, form) for _, key, scale, form in _COLUMNS]
        memory = level.get(PEAK_MEMORY_BYTES)
        cells.append(format_bytes(memory) if memory else "-")
        cells.append(_verdict(level))
        rows.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    return (
        "<table class='load'><caption>latency against load (transformers serve, warm-up requests excluded)"
        f"</caption><tr>{header}</tr>{''.join(rows)}</table>"
    )


def _verdict(level: dict[str, Any]) -> str:
    """A level judged by its share of requests within the SLO (a capacity), else by its percentiles."""
    if "verdict" not in level:
        return "yes" if level.get("slo_met") else "no"
    return "sustained" if level["verdict"] == "met" else f"refused: {level.get('reason', '')}"


def deployed_command(serve: dict[str, Any], capacity: Capacity | None) -> str:
    """The command that ran, then, as comments, the load it was measured to sustain within the SLO and what the
    server held there: requests in flight, continuous batching's tokens per forward pass."""
    command = serve["command"]
    if capacity is None:
        return command
    lines = [command, f"# capacity within {describe_slo(capacity.slo)}: {capacity.found()}"]
    chosen = capacity.chosen
    if chosen is not None:
        lines.append(f"# at {capacity.unit.name} {chosen.size:g}: {_held(chosen.figures, serve['argv'])}")
    return "\n".join(lines)


def _held(figures: dict[str, float], argv: list[str]) -> str:
    served = f"{figures.get(REQUESTS_PER_S.name, 0.0):.2f} req/s and {figures.get(OUTPUT_TOK_S, 0.0):.1f} output tok/s"
    in_flight = f"at most {figures.get(IN_FLIGHT_PEAK, 0.0):.0f} requests in flight at once"
    return f"{served}, {in_flight}; {_batching(argv)}"


def _batching(argv: list[str]) -> str:
    """What bounded the batch: continuous batching's tokens per forward pass, or one generate() at a time."""
    if "--continuous-batching" not in argv:
        return "no --continuous-batching: requests queue for one generate() at a time"
    if "--cb-max-batch-tokens" in argv:
        return f"continuous batching, max_batch_tokens {argv[argv.index('--cb-max-batch-tokens') + 1]}"
    return "continuous batching, transformers' default max_batch_tokens (no --cb-max-batch-tokens)"


def _cell(value: float | None, scale: float, form: str) -> str:
    return "-" if value is None else form.format(value * scale)
